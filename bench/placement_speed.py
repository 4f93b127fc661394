"""µs per `place()` decision at 100, 1,213 and 10,000 nodes (openb node mix, partly loaded).

python bench/placement_speed.py [--trace-dir ../shared/data/openb] [--policy binpack]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from openb import load_nodes, load_pods

from hami.placement.engine import PlacementSettings, build_index, place
from hami.state.model import Node, Snapshot


def cluster(base: list[Node], size: int, rng: random.Random) -> list[Node]:
    """`size` nodes drawn from the openb node list, each GPU loaded to a random whole-tenth share."""
    out = []
    for i in range(size):
        proto = base[i % len(base)]
        name = f"{proto.name}-{i}"
        gpus = tuple(
            dataclasses.replace(g, uuid=f"{name}-gpu{g.index}", memory_promised_mib=100 * rng.randrange(0, 11))
            for g in proto.gpus
        )
        out.append(dataclasses.replace(proto, name=name, gpus=gpus))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace-dir", type=Path, default=Path("../shared/data/openb"))
    parser.add_argument("--policy", default="binpack")
    parser.add_argument("--decisions", type=int, default=2000)
    args = parser.parse_args()
    base = load_nodes(args.trace_dir / "openb_node_list_gpu_node.csv")
    pods = [p for p in load_pods(args.trace_dir / "openb_pod_list_default.csv") if p.num_gpu]
    settings = PlacementSettings(default_policy=args.policy)
    for size in (100, 1213, 10_000):
        rng = random.Random(size)
        index = build_index(Snapshot(tuple(cluster(base, size, rng))), settings)
        requests = [p.request(args.policy) for p in rng.choices(pods, k=args.decisions)]
        t0 = time.perf_counter()
        distinct = {p.shape(): p for p in pods}.values()
        for p in distinct:  # warm the per-shape views, as a running webhook's are
            place(p.request(args.policy), index, {}, settings)
        cold = time.perf_counter() - t0
        shapes = len(distinct)
        t0 = time.perf_counter()
        for r in requests:
            place(r, index, {}, settings)
        us = 1e6 * (time.perf_counter() - t0) / len(requests)
        print(
            f"{size:6d} nodes ({len(index.classes)} state classes): {us:8.1f} us/decision warm, "
            f"{1e6 * cold / shapes:9.1f} us for a first-seen request shape ({args.policy})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
