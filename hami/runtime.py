"""Everything a decision reads that changes while the process runs: config, snapshot, ledger.

The request path reads attributes of this object and never awaits anything here except the one
bounded ledger round trip. Swapping is by plain assignment (one event loop, no locks needed).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hami import config as config_mod
from hami.config import Config
from hami.observability import CONFIG_RELOADS, get_logger
from hami.settings_loader import SettingsError

log = get_logger("hami.runtime")


class Runtime:
    def __init__(self, config: Config, config_path: str | None = None, overrides: dict[str, Any] | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self._overrides = overrides or {}
        self._config_signature = self._signature()

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return True, {}

    # -- config hot reload -------------------------------------------------------------------
    def _signature(self) -> tuple[int, int, int] | None:
        if not self.config_path:
            return None
        try:
            st = os.stat(self.config_path)  # follows the ConfigMap's ..data symlink
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def maybe_reload_config(self) -> bool:
        """Take a changed file's policy sections; a bad file keeps the old policy and says so."""
        signature = self._signature()
        if signature is None or signature == self._config_signature:
            return False
        self._config_signature = signature
        try:
            fresh = config_mod.load(Path(self.config_path or ""), overrides=self._overrides)
        except SettingsError as exc:
            CONFIG_RELOADS.labels(result="error").inc()
            log.error("config_reload_rejected", path=self.config_path, error=str(exc), kept="previous policy")
            return False
        self.config, restart = config_mod.with_policy_of(self.config, fresh)
        CONFIG_RELOADS.labels(result="ok").inc()
        log.info("config_reloaded", path=self.config_path, restart_needed_for=restart or None)
        self.on_config_reloaded()
        return True

    def on_config_reloaded(self) -> None:
        """Hook for derived state (e.g. the placement index depends on placement settings)."""
        return None
