"""Score plugins: one per policy, higher is better, and the device order each policy fills a node in.

binpack/spread follow HAMi (`pkg/scheduler/policy/node_policy.go`, `gpu_policy.go`): a node's score is
`10·(used/count + usedcores/totalcore + usedmem/totalmem)` summed over its devices, with `count` the
split count (max pods per GPU); a device's is the same over that device alone. HAMi sorts ascending
and takes the last for binpack (highest wins) and descending for spread (lowest wins); we compute
the score *after* adding this request, as the brief asks, and negate it for spread so that higher
always wins here. `frag`/`fgd` follow "Beware of Fragmentation" (see frag.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hami.placement.filters import Device
from hami.placement.frag import MILLI, FragModel, stranded
from hami.requests import ContainerGpuRequest

WEIGHT = 10.0  # HAMi's util.Weight


@dataclass(frozen=True, slots=True)
class ScoreContext:
    """Cluster-wide figures some scorers normalise by, fixed for one index."""

    split_count: int
    max_cpu_milli: int  # largest node CPU in the cluster (bestfit's MaxSpecCpu)
    max_gpus: int  # largest node GPU count (bestfit's MaxSpecGpu)
    frag: FragModel
    gpus_by_model: Mapping[str, int] = field(default_factory=dict)  # cards per model (frag's pressure)


def hami_device_score(d: Device, split: int, pods: int = 0, cores: int = 0, mem: int = 0) -> float:
    total = d.gpu.memory_total_mib or 1
    return WEIGHT * ((d.pods + pods) / split + (100 - d.cores_free + cores) / 100 + (d.used_mib + mem) / total)


def hami_node_score(devices: Sequence[Device], split: int, pods: int, cores: int, mem: int) -> float:
    """HAMi's node score over all of the node's devices, after adding the request's figures."""
    if not devices:
        return 0.0
    used, used_cores, used_mem, total_mem = pods, cores, mem, 0
    for d in devices:  # one pass: the winner of every GPU admission is scored here
        total = d.gpu.memory_total_mib
        used += d.pods
        used_cores += 100 - d.cores_free
        used_mem += total - d.free_mib  # d.used_mib
        total_mem += total
    n = len(devices)
    return WEIGHT * (used / (split * n) + used_cores / (100 * n) + used_mem / (total_mem or 1))


def device_order(policy: str, devices: Sequence[Device], c: ContainerGpuRequest, split: int) -> list[Device]:
    """The order a policy fills devices in (ties by device index, which the input is sorted by)."""
    if policy in ("binpack", "frag", "fgd"):
        return sorted(
            devices, key=lambda d: -hami_device_score(d, split, 1, c.cores, c.memory_on(d.gpu.memory_total_mib))
        )
    if policy == "spread":
        return sorted(
            devices, key=lambda d: hami_device_score(d, split, 1, c.cores, c.memory_on(d.gpu.memory_total_mib))
        )
    if policy == "latency":
        return sorted(devices, key=lambda d: (101.0 if d.gpu.utilisation is None else d.gpu.utilisation, d.pods))
    if policy == "bestfit":
        return sorted(devices, key=lambda d: d.free_mib)
    return list(devices)


def free_milli(d: Device) -> int:
    """A device's free share in milli-GPU: the scarcer of memory and cores (FGD's per-GPU unit)."""
    total = d.gpu.memory_total_mib or 1
    return min(d.free_mib * MILLI // total, d.cores_free * MILLI // 100)


def ask_milli(c: ContainerGpuRequest, d: Device) -> int:
    total = d.gpu.memory_total_mib or 1
    return max(c.memory_on(total) * MILLI // total, c.cores * MILLI // 100)


def sigmoid(x: float) -> float:
    if x < -60:
        return 0.0
    return 1.0 / (1.0 + math.exp(-x))


def fgd_score(delta_milli: float) -> int:
    """The study's node score: int(100·sigmoid(-Δ/1000)); the quantisation is part of its behaviour."""
    return int(sigmoid(-delta_milli / MILLI) * 100)


def frag_cost(
    sctx: ScoreContext, model: str, free_before: int, free_after: int, cpu: int | None, cpu_after: int | None
) -> float:
    """What `frag` adds to FGD's Δ, in the same milli-GPU: the free GPU share the pod leaves without
    host CPU to feed it (only an increase counts: crediting a decrease would lure pods onto CPU-tight
    nodes to "repair" them, opening nodes that 8-GPU pods need), plus the share it takes on a card
    model that pods pinned to that model will need (`model_pressure`). `free_*` are the node's
    summed free milli before and after the pod, `cpu*` its free host CPU."""
    fm = sctx.frag
    cost = max(0.0, stranded(free_after, cpu_after, fm.cpu_per_milli) - stranded(free_before, cpu, fm.cpu_per_milli))
    taken = free_before - free_after
    if taken > 0 and sctx.gpus_by_model:
        cost += taken * fm.pressure(sctx.gpus_by_model).get(model.lower(), 0.0)
    return cost


def frag_rank(
    policy: str, delta_milli: float, before: Sequence[Device], cost_milli: float = 0.0
) -> tuple[float, float]:
    """(score, secondary preference) of a node for `fgd`/`frag`, given the change Δ of its expected
    fragmentation, its devices before the pod and, for frag, `frag_cost`.

    fgd is the study's: the integer score alone, ties left to the index's node order (fixed for the
    run). A secondary preference on the exact Δ undoes the consolidation that order gives (default
    trace: about 7.1% GPU unallocated instead of 4.8%), so there is none.
    frag scores Δ + cost the same way, then adds half a point to nodes already in use, so an untouched
    node is opened only when it is strictly better by the integer score: empty nodes stay whole for
    whole-node pods. Half a point keeps the integer ranking intact, and living in the score it also
    steers host-only pods. Still no secondary preference: node order does the consolidating."""
    if policy != "frag":
        return float(fgd_score(delta_milli)), 0.0
    score = float(fgd_score(delta_milli + cost_milli))
    if not all(d.empty for d in before):
        score += 0.5
    return score, 0.0
