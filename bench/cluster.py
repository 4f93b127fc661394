"""Config for the benchmarked webhook: embedded defaults + listener, cluster size and ledger."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

TEMPLATE = Path(__file__).resolve().parent / "sim" / "fleet-template.yaml"


def write_bench_config(args: argparse.Namespace, tmp: Path, port: int, redis_url: str = "") -> Path:
    """The webhook under test: `--nodes` simulated 8-GPU nodes read in-process (GPU workload; a
    plain pod runs on the embedded 4-node default), and the ledger asked for.

    Reservations live 2 s (the pod watch would release them once pods are bound), so a long run at
    full speed keeps finding room instead of measuring the cheaper no-fit path.
    """
    state: dict[str, Any] = {"interval_s": args.refresh_s, "ledger": {"ttl_s": 2.0}}
    if args.workload == "gpu":  # a plain pod is measured on the embedded default inventory
        state["inventory"] = {"simulated_file": str(TEMPLATE), "simulated_fleet_size": args.nodes}
    if redis_url:
        state["redis_url"] = redis_url
    config: dict[str, Any] = {
        "server": {"listen": f"127.0.0.1:{port}", "state_dir": str(tmp / "state")},
        "state": state,
    }
    path = tmp / "webhook.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
