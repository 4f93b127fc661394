"""Config for the benchmarked webhook: embedded defaults + listener, cluster size and ledger."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml


def write_bench_config(args: argparse.Namespace, tmp: Path, port: int) -> Path:
    config: dict[str, Any] = {
        "server": {"listen": f"127.0.0.1:{port}", "state_dir": str(tmp / "state")},
    }
    path = tmp / "webhook.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
