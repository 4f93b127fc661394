"""Wire a Runtime from a Config: the one place that knows which state sources to start."""

from __future__ import annotations

from typing import Any

from hami.config import Config
from hami.runtime import Runtime


def build_runtime(config: Config, config_path: str | None = None, overrides: dict[str, Any] | None = None) -> Runtime:
    return Runtime(config, config_path, overrides)
