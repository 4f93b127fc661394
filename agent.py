"""The per-node GPU exporter: `python agent.py --listen HOST:PORT [--node-name NAME] [--simulate FILE]`.

Argument parsing only; the agent itself lives in hami/node (see hami/node/main.py).
"""

from __future__ import annotations

import argparse
import sys

from hami.node.main import run
from hami.node.settings import AgentSettings

_DEFAULTS = AgentSettings()


def parse_args(argv: list[str]) -> AgentSettings:
    parser = argparse.ArgumentParser(prog="agent.py", description="Per-node GPU exporter for hami-webhook.")
    parser.add_argument("--listen", default=_DEFAULTS.listen, help="HOST:PORT to serve on")
    parser.add_argument("--node-name", default=_DEFAULTS.node_name, help="node to report / to serve from a sim file")
    parser.add_argument("--simulate", default=_DEFAULTS.simulate, metavar="FILE", help="serve simulated nodes")
    parser.add_argument("--fleet-size", type=int, default=_DEFAULTS.fleet_size, metavar="N", help="generate N nodes")
    parser.add_argument("--fleet-template", default=_DEFAULTS.fleet_template, metavar="FILE")
    parser.add_argument("--fleet-prefix", default=_DEFAULTS.fleet_prefix, help="name prefix of generated nodes")
    parser.add_argument("--seed", type=int, default=_DEFAULTS.seed, help="seed of the simulated jitter")
    parser.add_argument(
        "--sim-time", type=float, default=_DEFAULTS.sim_time_s, metavar="S", help="freeze the simulation clock at S"
    )
    parser.add_argument(
        "--interval", type=float, default=_DEFAULTS.interval_s, metavar="S", help="read the backend at most every S"
    )
    args = parser.parse_args(argv)
    return AgentSettings(
        listen=args.listen,
        node_name=args.node_name,
        simulate=args.simulate,
        fleet_size=args.fleet_size,
        fleet_template=args.fleet_template,
        fleet_prefix=args.fleet_prefix,
        seed=args.seed,
        sim_time_s=args.sim_time,
        interval_s=args.interval,
    )


if __name__ == "__main__":
    sys.exit(run(parse_args(sys.argv[1:])))
