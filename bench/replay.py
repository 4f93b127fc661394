"""Replay an openb pod list through the webhook's own `place()` and measure unallocated GPUs.

Protocol ("Beware of Fragmentation", USENIX ATC 2023): pods shuffled by seed, deletions ignored,
then pods resampled with replacement until the arrived GPU demand reaches 130% of cluster GPU
capacity; each pod is tried once (no retries); host CPU and memory must fit. Reported at the moment
the arrived demand reaches 100% of capacity: the share of GPU capacity still unallocated, and the
cluster's expected fragmentation against the trace's typical shapes (both % of capacity), plus the
allocation-vs-arrival curve that bench/plots.py draws. CPU-only pods take part (host CPU/memory on GPU
nodes); the typical shapes are built as the study's experiments configure them (see openb.typical_mix).
Ties between equally scored nodes go by a node order random per seed and fixed for the run.

    python bench/replay.py --trace-dir ../shared/data/openb --pods openb_pod_list_default.csv \
        --policies random,bestfit,binpack,spread,fgd,frag --seeds 10 --json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from openb import CARD, TracePod, load_nodes, load_pods, typical_mix

from hami.placement.engine import PlacementSettings, build_index, place
from hami.placement.frag import FragModel, ShapeMix
from hami.state.model import Node, Snapshot

INFLATION = 1.3
CURVE_STEP_PCT = 5  # allocation-vs-arrival curve resolution, % of capacity


@dataclasses.dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    seed: int
    unallocated_at_100: float
    frag_at_100: float
    placed: int
    failed: int
    decisions: int
    us_per_decision: float
    curve: tuple[float, ...] = ()  # allocated % of capacity at each CURVE_STEP_PCT of arrived demand


def arrivals(pods: list[TracePod], capacity_milli: int, seed: int) -> list[TracePod]:
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    demand = sum(p.gpu_demand_milli for p in order)
    while demand < INFLATION * capacity_milli:
        pod = rng.choice(pods)
        order.append(pod)
        demand += pod.gpu_demand_milli
    return order


def allocate(node: Node, pod: TracePod, uuids: set[str]) -> Node:
    gpus = tuple(
        dataclasses.replace(g, memory_promised_mib=g.memory_promised_mib + pod.gpu_milli, pods=g.pods + 1)
        if g.uuid in uuids
        else g
        for g in node.gpus
    )
    cpu = None if node.cpu_milli_free is None else node.cpu_milli_free - pod.cpu_milli
    mem = None if node.memory_mib_free is None else node.memory_mib_free - pod.memory_mib
    return dataclasses.replace(node, gpus=gpus, cpu_milli_free=cpu, memory_mib_free=mem)


def cluster_frag(nodes: list[Node], mix: ShapeMix) -> float:
    model = FragModel(mix)
    total = 0.0
    for n in nodes:
        if n.gpus:
            free = tuple(g.effective_free_mib * 1000 // g.memory_total_mib for g in n.gpus)
            total += model.frag(free, n.cpu_milli_free, n.gpus[0].model)
    return total


def run_one(args: tuple[Path, Path, str, int, int, int]) -> RunResult:
    node_file, pod_file, policy, seed, max_nodes, max_pods = args
    nodes = load_nodes(node_file)
    pods = load_pods(pod_file)
    if max_nodes:
        nodes = nodes[:: max(1, len(nodes) // max_nodes)][:max_nodes]
    if max_pods:
        pods = random.Random(seed).sample(pods, min(max_pods, len(pods)))
    capacity = sum(len(n.gpus) for n in nodes) * CARD
    mix = typical_mix(pods)
    # The study has no per-GPU pod limit; CPU pods are host-only and land on GPU nodes too.
    settings = PlacementSettings(default_policy=policy, max_pods_per_gpu=10**6, runners_up=0)
    index = build_index(Snapshot(tuple(nodes)), settings, mix, order_seed=seed)
    allocated = arrived = 0
    at_100: tuple[float, float] | None = None
    placed = failed = 0
    spent = 0.0
    order = arrivals(pods, capacity, seed)
    curve: list[float] = []
    for i, pod in enumerate(order):
        request = pod.request(policy)
        t0 = time.perf_counter()
        decision = place(request, index, {}, settings, rng_seed=seed * 1_000_003 + i)
        spent += time.perf_counter() - t0
        if decision.node is not None:
            placed += 1
            allocated += pod.gpu_demand_milli
            node = index.nodes[decision.node]
            index.update_node(allocate(node, pod, {d.uuid for d in decision.devices}))
        else:
            failed += 1
        arrived += pod.gpu_demand_milli
        while arrived * 100 >= (len(curve) + 1) * CURVE_STEP_PCT * capacity:
            curve.append(100 * allocated / capacity)
        if at_100 is None and arrived >= capacity:
            frag = cluster_frag(list(index.nodes.values()), mix)
            at_100 = (100 * (capacity - allocated) / capacity, 100 * frag / capacity)
    if at_100 is None:
        at_100 = (
            100 * (capacity - allocated) / capacity,
            100 * cluster_frag(list(index.nodes.values()), mix) / capacity,
        )
    return RunResult(
        policy, seed, at_100[0], at_100[1], placed, failed, len(order), 1e6 * spent / len(order), tuple(curve)
    )


def summarise(results: list[RunResult]) -> dict[str, dict[str, float | int]]:
    out: dict[str, dict[str, float | int]] = {}
    for policy in dict.fromkeys(r.policy for r in results):
        mine = [r for r in results if r.policy == policy]
        unalloc = [r.unallocated_at_100 for r in mine]
        out[policy] = {
            "unallocated_at_100": round(statistics.median(unalloc), 2),
            "unallocated_min": round(min(unalloc), 2),
            "unallocated_max": round(max(unalloc), 2),
            "frag_at_100": round(statistics.median(r.frag_at_100 for r in mine), 2),
            "us_per_decision": round(statistics.mean(r.us_per_decision for r in mine), 1),
            "failed_median": int(statistics.median(r.failed for r in mine)),
            "seeds": len(mine),
            "curve": [round(statistics.median(c), 2) for c in zip(*(r.curve for r in mine), strict=False)],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace-dir", type=Path, default=Path("../shared/data/openb"))
    parser.add_argument("--nodes", default="openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", default="openb_pod_list_default.csv")
    parser.add_argument("--policies", default="random,bestfit,binpack,spread,fgd,frag")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="60 nodes, 400 pods, 1 seed: a smoke test")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    seeds = 1 if args.quick else args.seeds
    max_nodes, max_pods = (60, 400) if args.quick else (0, 0)
    node_file, pod_file = args.trace_dir / args.nodes, args.trace_dir / args.pods
    tasks = [
        (node_file, pod_file, p.strip(), s, max_nodes, max_pods)
        for p in args.policies.split(",")
        if p.strip()
        for s in range(seeds)
    ]
    if args.workers > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            results = list(pool.map(run_one, tasks))
    else:
        results = [run_one(t) for t in tasks]
    summary = summarise(results)
    if args.json:
        report = {
            "trace": args.pods,
            "nodes": args.nodes,
            "seeds": seeds,
            "curve_step_pct": CURVE_STEP_PCT,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip() + f", {os.cpu_count()} CPUs",
            "date": datetime.date.today().isoformat(),
            "command": "python bench/replay.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "policies": summary,
        }
        print(json.dumps(report))
    else:
        print(f"{args.pods} on {args.nodes}, {seeds} seed(s)")
        for policy, row in summary.items():
            print(
                f"  {policy:8s} unallocated@100 {row['unallocated_at_100']:6.2f}% "
                f"[{row['unallocated_min']:.2f}..{row['unallocated_max']:.2f}]  frag@100 {row['frag_at_100']:6.2f}%  "
                f"{row['us_per_decision']:8.1f} us/decision"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
