"""One node against one request: run the filters, fit the containers onto devices, score the result.

Pure: the same node state, overlay and request always give the same `NodeEval`, which is what lets
the index memoise it for every node in the same state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from hami.placement.filters import (
    DEVICE_FILTERS,
    OTHER_WORKLOAD,
    Device,
    DeviceContext,
    device_fits,
    device_view,
    gib,
    needs_whole_card,
    node_freshness,
    node_host_resources,
    node_selector,
)
from hami.placement.scorers import (
    ScoreContext,
    ask_milli,
    device_order,
    frag_cost,
    frag_rank,
    free_milli,
    hami_node_score,
)
from hami.placement.settings import PlacementSettings
from hami.requests import GpuRequest
from hami.state.model import DeviceUsage, Freshness, Node

# Stage numbers order rejections: a node that failed later came closer to fitting.
STAGE_NODE = 0
STAGE_DEVICES = 1  # + index into DEVICE_FILTERS
STAGE_FIT = STAGE_DEVICES + len(DEVICE_FILTERS)

# Rejections the pod's own constraints cause: no change of GPU state can ever lift them, so a denial
# names them last, after nodes that match the pod but lack room, health or freshness right now.
CONSTRAINT_CLASSES = frozenset({"selector", "gpu-type", "gpu-uuid"})

Assignment = tuple[tuple[int, int, int, int], ...]  # (container #, device position, memory MiB, cores)


class NodeEval(NamedTuple):
    """A node's verdict for one request (a NamedTuple: built for every node judged in full)."""

    fits: bool
    score: float = 0.0
    tiebreak: float = 0.0  # policy's secondary preference, higher wins
    tier: int = 0  # 0 best; stale state and unknown utilisation rank lower (aggressive mode)
    reason_class: str = ""
    reason: str = ""
    stage: int = 0
    closeness: int = 0  # most effective free MiB on an eligible device, to rank rejections
    assignment: Assignment = ()


def closeness_key(stage: int, reason_class: str, closeness: int, rank: int) -> tuple[bool, int, int, int]:
    """Sort key of a rejection, closest first: constraint mismatches last, then the latest stage
    (the node passed more filters), then the most free memory, then node order."""
    return (reason_class in CONSTRAINT_CLASSES, -stage, -closeness, rank)


def reject(reason_class: str, reason: str, stage: int, closeness: int = 0) -> NodeEval:
    return NodeEval(False, reason_class=reason_class, reason=reason, stage=stage, closeness=closeness)


def _min_memory_on(request: GpuRequest) -> Callable[[int], int]:
    """The smallest per-device memory ask by card size, memoised (asked once per device evaluated)."""
    cache: dict[int, int] = {}
    containers = request.containers

    def on(card: int) -> int:
        v = cache.get(card)
        if v is None:
            v = cache[card] = min((c.memory_on(card) for c in containers), default=0)
        return v

    return on


def device_context(request: GpuRequest, settings: PlacementSettings, utilisation_known: bool) -> DeviceContext:
    bound = request.max_gpu_util
    if bound is None and request.workload_type:
        bound = settings.workload_max_util.get(request.workload_type)
    containers = request.containers
    inactive = {
        "gpu-type": not request.use_types and not request.nouse_types,
        "gpu-uuid": not request.use_uuids and not request.nouse_uuids,
        "separation": not settings.separate_workloads or (request.workload_type or "") not in OTHER_WORKLOAD,
        "utilisation": bound is None,
    }
    return DeviceContext(
        util_bound=bound,
        utilisation_known=utilisation_known,
        min_memory_on=_min_memory_on(request),
        min_cores=min((c.cores for c in containers), default=0),
        needs_empty=bool(containers) and all(needs_whole_card(c) for c in containers),
        inactive=frozenset(k for k, v in inactive.items() if v),
    )


def _fit(
    devices: list[Device], request: GpuRequest, policy: str, sctx: ScoreContext
) -> tuple[Assignment, list[Device]] | None:
    """Greedy fit, HAMi-style: each container takes its `count` distinct devices in policy order;
    capacity a container took is gone for the next. Returns the assignment and the devices after."""
    state = {d.pos: d for d in devices}
    picked: list[tuple[int, int, int, int]] = []
    for ci, c in enumerate(request.containers):
        order = device_order(policy, list(state.values()), c, sctx.split_count)
        taken = 0
        for d in order:
            mem = c.memory_on(d.gpu.memory_total_mib)
            if not device_fits(d, c, mem):
                continue
            picked.append((ci, d.pos, mem, c.cores))
            state[d.pos] = Device(
                d.pos,
                d.gpu,
                d.free_mib - mem,
                d.cores_free - (100 if needs_whole_card(c) else c.cores),
                d.pods + 1,
                d.workloads,
            )
            taken += 1
            if taken == c.count:
                break
        if taken < c.count:
            return None
    return tuple(picked), list(state.values())


def _frag_choice(
    node: Node,
    devices: list[Device],
    all_devices: list[Device],
    request: GpuRequest,
    sctx: ScoreContext,
    policy: str,
) -> tuple[float, Assignment, float] | None:
    """FGD for one fractional device: try each device with room, keep the least fragmenting (first
    by index on equal integer score, as the study does). Returns (score, assignment, exact -Δ)."""
    c = request.containers[0]
    model = all_devices[0].gpu.model if all_devices else ""
    before_free = [free_milli(d) for d in all_devices]
    cpu = node.cpu_milli_free
    cpu_after = None if cpu is None else cpu - request.cpu_milli
    before = sctx.frag.frag(tuple(before_free), cpu, model)
    free_total = sum(before_free)
    best: tuple[float, Assignment, float] | None = None
    seen: set[int] = set()
    position = {d.pos: i for i, d in enumerate(all_devices)}
    for d in devices:
        mem = c.memory_on(d.gpu.memory_total_mib)
        if not device_fits(d, c, mem):
            continue
        i = position[d.pos]
        if before_free[i] in seen:  # same free share, same outcome: the first such device stands
            continue
        seen.add(before_free[i])
        after_free = list(before_free)
        taken = min(after_free[i], ask_milli(c, d))
        after_free[i] -= taken
        delta = sctx.frag.frag(tuple(after_free), cpu_after, model) - before
        cost = 0.0
        if policy == "frag":
            cost = frag_cost(sctx, model, free_total, free_total - taken, cpu, cpu_after)
        score, tiebreak = frag_rank(policy, delta, all_devices, cost)
        if best is None or score > best[0]:
            best = (score, ((0, d.pos, mem, c.cores),), tiebreak)
    return best


def _frag_rank(
    policy: str, node: Node, before: list[Device], after: list[Device], request: GpuRequest, sctx: ScoreContext
) -> tuple[float, float]:
    """fgd/frag rank of a node given its devices before and after the pod (whole cards, host-only)."""
    model = before[0].gpu.model if before else ""
    cpu = node.cpu_milli_free
    cpu_after = None if cpu is None else cpu - request.cpu_milli
    free_before = tuple(free_milli(d) for d in before)
    free_after = tuple(free_milli(d) for d in after)
    delta = sctx.frag.frag(free_after, cpu_after, model) - sctx.frag.frag(free_before, cpu, model)
    cost = 0.0
    if policy == "frag":
        cost = frag_cost(sctx, model, sum(free_before), sum(free_after), cpu, cpu_after)
    return frag_rank(policy, delta, before, cost)


def _score(
    policy: str, node: Node, devices: list[Device], after: list[Device], request: GpuRequest, sctx: ScoreContext
) -> tuple[float, float]:
    if policy in ("binpack", "spread"):
        # `after` already holds this request, which is HAMi's score "after adding this request".
        score = hami_node_score(after, sctx.split_count, 0, 0, 0)
        return (score if policy == "binpack" else -score), 0.0
    if policy == "bestfit":
        gpu_left = sum(free_milli(d) for d in after) / 1000
        left = 0.5 * gpu_left / max(1, sctx.max_gpus)
        if node.cpu_milli_free is not None:
            left += 0.5 * (node.cpu_milli_free - request.cpu_milli) / max(1, sctx.max_cpu_milli)
        return -left, 0.0
    if policy == "latency":
        before = {d.pos: d for d in devices}
        used = [before[d.pos] for d in after if d.pods != before[d.pos].pods]
        worst = max((101.0 if d.gpu.utilisation is None else d.gpu.utilisation for d in used), default=0.0)
        return -worst, 0.0
    if policy in ("frag", "fgd"):
        return _frag_rank(policy, node, devices, after, request, sctx)
    return 0.0, 0.0  # random: the engine draws among feasible nodes


def evaluate_node(
    node: Node,
    reserved: Mapping[str, DeviceUsage],
    request: GpuRequest,
    policy: str,
    settings: PlacementSettings,
    sctx: ScoreContext,
    dctx: DeviceContext,
) -> NodeEval:
    why = node_freshness(node, settings)
    if why:
        return reject("freshness", why, STAGE_NODE)
    why = node_selector(node, request)
    if why:
        return reject("selector", why, STAGE_NODE)
    why = node_host_resources(node, request)
    if why:
        return reject("host-resources", why, STAGE_NODE)
    tier = 2 if node.freshness == Freshness.STALE else 0
    all_devices = [device_view(i, g, reserved.get(g.uuid)) for i, g in enumerate(node.gpus)]
    if not request.containers:  # host-only pod (the trace's CPU pods): nothing to fit on devices
        return NodeEval(True, score=_score(policy, node, all_devices, all_devices, request, sctx)[0], tier=tier)
    need = max(c.count for c in request.containers)
    devices = all_devices
    inactive = dctx.inactive
    for stage, (reason_class, device_filter) in enumerate(DEVICE_FILTERS, start=STAGE_DEVICES):
        if reason_class in inactive:
            continue
        kept, first_reason = [], ""
        for d in devices:
            why = device_filter(d, request, settings, dctx)
            if why:
                first_reason = first_reason or why
            else:
                kept.append(d)
        if len(kept) < need:
            closeness = max((d.free_mib for d in devices), default=0)
            return reject(reason_class, first_reason or f"has {len(node.gpus)} GPUs, needs {need}", stage, closeness)
        devices = kept
    if dctx.util_bound is not None and any(d.gpu.utilisation is None or not dctx.utilisation_known for d in devices):
        tier += 1  # aggressive mode let unknown-utilisation devices through: rank them lower
    closeness = max(d.free_mib for d in devices)
    if policy in ("frag", "fgd") and len(request.containers) == 1 and request.containers[0].count == 1:
        c = request.containers[0]
        if not needs_whole_card(c) and ask_milli(c, devices[0]) < 1000:
            chosen = _frag_choice(node, devices, all_devices, request, sctx, policy)
            if chosen is None:
                return reject("capacity", _capacity_reason(request, devices), STAGE_FIT, closeness)
            return NodeEval(True, chosen[0], chosen[2], tier, assignment=chosen[1])
    # FGD gives whole cards in device index order; other policies fill in their own order.
    fit = _fit(devices, request, "index" if policy == "fgd" else policy, sctx)
    if fit is None:
        return reject("capacity", _capacity_reason(request, devices), STAGE_FIT, closeness)
    assignment, after_eligible = fit
    after_by_pos = {d.pos: d for d in after_eligible}
    after = [after_by_pos.get(d.pos, d) for d in all_devices]
    score, tiebreak = _score(policy, node, all_devices, after, request, sctx)
    return NodeEval(True, score, tiebreak, tier, assignment=assignment)


def _capacity_reason(request: GpuRequest, devices: list[Device]) -> str:
    best = max(devices, key=lambda d: d.free_mib)
    asks = ", ".join(
        f"{c.count}x{gib(c.memory_on(best.gpu.memory_total_mib))}" + (f"/{c.cores}%" if c.cores else "")
        for c in request.containers
    )
    return f"GPU-{best.gpu.index} has {gib(best.free_mib)} effective free at most; pod needs {asks} on distinct GPUs"
