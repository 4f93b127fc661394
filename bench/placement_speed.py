"""µs per `place()` decision at 100, 1,213 and 10,000 nodes, the way the webhook calls it.

Every node is unique (openb node shapes, each GPU with its own used memory, utilisation and
temperature), requests are a mix of openb GPU shapes, and each decision reserves its devices in an
in-process ledger, so the overlay grows after every decision, as in the webhook.

Timed in CPU time of the benchmark's thread (the machine is shared: wall time would count other
processes' turns), per decision, as the webhook's request path does it (hami/decide.py): `place()` on the
index's own applied reservations, `add_usage` of the reservation just made, and every `--sync-ms`
of simulated time (decisions are spaced by `--interval-us`) a `sync_overlay` with the ledger's
overlay. `--naive` passes the ledger's overlay to every `place()` instead (an O(overlay) sync per
decision), which is what an index without incremental reservations costs.

python bench/placement_speed.py [--trace-dir ../shared/data/openb] [--policy binpack] [--decisions 2000] [--naive]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from openb import load_nodes, load_pods

from hami.placement.engine import PlacementSettings, build_index, place
from hami.queue import usage_of
from hami.state.ledger import InProcessLedger
from hami.state.model import Node, ReservationItem, Snapshot
from hami.state.settings import LedgerSettings


def cluster(base: list[Node], size: int, rng: random.Random) -> list[Node]:
    """`size` unique nodes drawn from the openb node list: every GPU has its own state."""
    out = []
    for i in range(size):
        proto = base[i % len(base)]
        name = f"{proto.name}-{i}"
        gpus = tuple(
            dataclasses.replace(
                g,
                uuid=f"{name}-gpu{g.index}",
                **_load(g.memory_total_mib, rng),
                utilisation=rng.uniform(0, 100),
                temperature_c=rng.uniform(35, 80),
            )
            for g in proto.gpus
        )
        out.append(dataclasses.replace(proto, name=name, gpus=gpus))
    return out


def _load(total: int, rng: random.Random) -> dict[str, int]:
    """About a third of GPUs idle, the rest shared by 1-3 pods; used memory a little under promised."""
    pods = rng.choice((0, 0, 1, 2, 3))
    if not pods:
        return {}
    promised = rng.randrange(total // 10, total * 8 // 10)
    return {
        "pods": pods,
        "memory_promised_mib": promised,
        "memory_used_mib": promised - rng.randrange(0, total // 20),
        "cores_promised": 10 * rng.randrange(1, 6),
    }


def run(size: int, args: argparse.Namespace, base: list[Node], pods: list) -> None:
    rng = random.Random(size)
    settings = PlacementSettings(default_policy=args.policy)
    tracemalloc.start()
    t0 = time.thread_time()
    index = build_index(Snapshot(tuple(cluster(base, size, rng))), settings)
    build_s = time.thread_time() - t0
    memory = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    requests = [p.request(args.policy) for p in rng.choices(pods, k=args.decisions)]
    ledger = InProcessLedger(LedgerSettings(ttl_s=3600.0))
    placed = denied = syncs = 0
    spent = sync_s = add_s = 0.0
    index.evaluations = 0
    next_sync_us = 0.0
    for i, request in enumerate(requests):
        if args.naive:
            t0 = time.thread_time()
            decision = place(request, index, ledger.overlay(), settings)
            spent += time.thread_time() - t0
        else:
            if i * args.interval_us >= next_sync_us:  # the webhook's periodic sync, amortised here
                t0 = time.thread_time()
                index.sync_overlay(ledger.overlay())
                sync_s += time.thread_time() - t0
                next_sync_us = i * args.interval_us + 1000 * args.sync_ms
                syncs += 1
            t0 = time.thread_time()
            decision = place(request, index, index.applied, settings)
            spent += time.thread_time() - t0
        if not decision.fits:
            denied += 1
            continue
        placed += 1
        node = index.nodes[decision.node or ""]
        gpus = {g.uuid: g for g in node.gpus}
        items = [
            ReservationItem(node.name, d.uuid, d.memory_mib, d.cores, gpus[d.uuid].effective_free_mib)
            for d in decision.devices
        ]
        assert ledger.reserve_now(f"pod-{i}", items).ok
        if not args.naive:
            t0 = time.thread_time()
            index.add_usage(usage_of(items))
            add_s += time.thread_time() - t0
    n = len(requests)
    total = spent + sync_s + add_s
    print(
        f"{size:6d} nodes: {1e6 * total / n:8.1f} us/decision ({args.policy}{', naive' if args.naive else ''}: "
        f"place {1e6 * spent / n:.0f}, add_usage {1e6 * add_s / n:.0f}, sync {1e6 * sync_s / n:.0f}), "
        f"{index.evaluations / n:5.1f} nodes checked/decision, {placed} placed, {denied} denied, {syncs} syncs, "
        f"overlay {len(ledger.overlay())} devices; index {memory / 2**20:.0f} MiB, built in {build_s:.2f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace-dir", type=Path, default=Path("../shared/data/openb"))
    parser.add_argument("--policy", default="binpack")
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--sizes", default="100,1213,10000")
    parser.add_argument("--naive", action="store_true", help="pass the ledger's overlay to every place()")
    parser.add_argument("--interval-us", type=float, default=1000.0, help="simulated time between decisions")
    parser.add_argument("--sync-ms", type=float, default=100.0, help="periodic overlay sync, simulated ms")
    args = parser.parse_args()
    base = load_nodes(args.trace_dir / "openb_node_list_gpu_node.csv")
    pods = [p for p in load_pods(args.trace_dir / "openb_pod_list_default.csv") if p.num_gpu]
    for size in (int(s) for s in args.sizes.split(",")):
        run(size, args, base, pods)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
