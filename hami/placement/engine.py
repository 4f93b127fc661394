"""The placement engine: filters, then scores, over a PlacementIndex, like kube-scheduler's cycle.

`place()` answers as a pure function of the snapshot, the overlay and the request (the index's memo
and its applied reservations are caches, not state that changes answers). binpack and spread (the
webhook's policies) run a best-first search over the index's candidate lists (see search.py), in
which the ledger's reservations are already applied; the other policies visit nodes one *class* at
a time (see index.py), and nodes the overlay touches, or that a request names by UUID or hostname,
one by one with the overlay applied.

Ranking: tier first (fresh before stale, known utilisation before unknown), then the policy's score,
then its secondary preference, then the index's fixed node order. `random` draws uniformly among
the feasible nodes of the best tier.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from types import MappingProxyType

from hami.placement.decision import Decision, DeviceChoice, NodeVerdict
from hami.placement.evaluate import (
    STAGE_DEVICES,
    STAGE_NODE,
    NodeEval,
    closeness_key,
    device_context,
    evaluate_node,
    reject,
)
from hami.placement.filters import DeviceContext
from hami.placement.frag import ShapeMix
from hami.placement.index import PlacementIndex, RequestView, build_index
from hami.placement.search import SEARCH_POLICIES, Ask, ask_of, best_first
from hami.placement.selectors import HOSTNAME_LABEL, mentions_hostname
from hami.placement.settings import POLICIES, PlacementSettings
from hami.requests import GpuRequest
from hami.state.model import DeviceUsage, Freshness, Node

__all__ = [
    "Decision",
    "DeviceChoice",
    "NodeVerdict",
    "PlacementIndex",
    "PlacementSettings",
    "ShapeMix",
    "build_index",
    "place",
    "resolve_policy",
]

_MEMORY_STAGE = STAGE_DEVICES + 7  # DEVICE_FILTERS' "memory" entry


def resolve_policy(request: GpuRequest, settings: PlacementSettings) -> str:
    for candidate in (request.node_policy, request.gpu_policy):
        if candidate and candidate.lower() in POLICIES:
            return candidate.lower()
    return settings.default_policy if settings.default_policy in POLICIES else "binpack"


def request_key(request: GpuRequest, policy: str) -> Hashable:
    """Everything in a request that can change a node's verdict, hashable (UUIDs are handled apart)."""
    return (
        policy,
        request.containers,
        request.use_types,
        request.nouse_types,
        request.max_gpu_util,
        request.workload_type,
        request.cpu_milli,
        request.memory_mib,
        tuple(sorted(request.node_selector.items())),
        repr(request.affinity) if request.affinity else "",
    )


def _prefilter(cls_free: tuple[int, ...], cpu: int | None, mem: int | None, request: GpuRequest) -> NodeEval | None:
    """A cheap verdict for a class that cannot fit (host resources, or too few devices with the
    absolute MiB asked), so full evaluation runs only where it may succeed."""
    if cpu is not None and cpu < request.cpu_milli:
        return reject("host-resources", "", STAGE_NODE)
    if mem is not None and mem < request.memory_mib:
        return reject("host-resources", "", STAGE_NODE)
    for c in request.containers:
        if c.memory_mib is not None and (len(cls_free) < c.count or cls_free[c.count - 1] < c.memory_mib):
            return reject("memory", "", _MEMORY_STAGE, cls_free[0] if cls_free else 0)
    return None


def _order_key(verdict: NodeEval, rank: int) -> tuple[int, float, float, int]:
    return (verdict.tier, -verdict.score, -verdict.tiebreak, rank)


def place(
    request: GpuRequest,
    index: PlacementIndex,
    reserved: Mapping[str, DeviceUsage],
    settings: PlacementSettings,
    *,
    node_name: str | None = None,
    rng_seed: int | None = None,
) -> Decision:
    """Choose a node and devices for `request`, or say why none fits.

    `reserved` is the usage pending on devices beyond the snapshot (the ledger's overlay). binpack
    and spread read it from the index, where it is baked in (`PlacementIndex.applied`): pass
    `index.applied` itself to keep the request path free of any O(overlay) work (the webhook does,
    and feeds the index with `apply_delta`/`sync_overlay`). Any other mapping is synced into the
    index first, which costs O(overlay) unless it is the very mapping synced last (`last_synced`).
    """
    policy = resolve_policy(request, settings)
    keep = max(0, settings.runners_up)
    searchable = node_name is None and not request.use_uuids
    search = policy in SEARCH_POLICIES and searchable and not mentions_hostname(request.node_selector, request.affinity)
    if search and reserved is not index.applied:
        index.sync_overlay(reserved)
        reserved = index.applied
    utilisation_known = index.snapshot.utilisation_known
    memo = ask = None
    if search and settings is index.settings:
        # Quick-check verdicts hold for the shape whatever the policy, under the index's settings;
        # so do the search's figures of the ask (UUID exclusions and utilisation's state change them).
        shape = request_key(request, "")
        memo = index.quick_memo(shape)
        figures = (shape, request.nouse_uuids, utilisation_known)
        dctx, ask = index.per_shape(figures, lambda: _search_figures(request, settings, utilisation_known))
    else:
        dctx = device_context(request, settings, utilisation_known)

    def evaluate(node: Node) -> NodeEval:
        return evaluate_node(node, reserved, request, policy, settings, index.sctx, dctx)

    view: RequestView | None = None
    if search:
        found = best_first(request, index, settings, policy, keep + 1, evaluate, memo, dctx, ask)
        if not found.ranked:
            return Decision(
                node=None,
                devices=(),
                policy=policy,
                score=0.0,
                considered=found.considered,
                filtered=MappingProxyType(dict(found.filtered)),
                rejected=found.rejections(keep or 3),
            )
        return _decision(request, index, policy, found.ranked, found.considered, found.filtered)
    if node_name is not None:
        singles = [n for n in (index.node(node_name),) if n is not None]
    elif request.use_uuids:
        singles = [
            index.nodes[name] for name in sorted({index.uuid_node.get(u) or "" for u in request.use_uuids}) if name
        ]
    elif HOSTNAME_LABEL in request.node_selector:
        singles = [n for n in (index.node(request.node_selector[HOSTNAME_LABEL]),) if n is not None]
    elif mentions_hostname(request.node_selector, request.affinity):
        singles = list(index.nodes.values())
    else:
        dirty = {index.uuid_node[u] for u in reserved if u in index.uuid_node}
        dirty.update(index.uuid_node[u] for u in request.nouse_uuids if u in index.uuid_node)
        singles = [index.nodes[name] for name in sorted(dirty)]
        view = index.view(request_key(request, policy))
        _sync(view, index, request, evaluate)
    cap = max(0, settings.max_nodes_scored) if view is None else 0
    single_verdicts = []
    for node in singles:
        verdict = evaluate(node)
        single_verdicts.append((verdict, node.name))
        if cap and verdict.fits and sum(v.fits for v, _ in single_verdicts) >= cap:
            break
    skip = {n.name for n in singles}
    filtered: Counter[str] = Counter()
    considered = len(single_verdicts)
    if view is not None:
        considered = len(index.nodes)
        filtered.update({k: v for k, v in view.filtered.items() if v > 0})
        for name in skip:  # these were judged one by one, not by their class
            verdict = view.verdicts.get(index.class_of(name), NodeEval(True))
            if not verdict.fits:
                filtered[verdict.reason_class] -= 1
    for verdict, _ in single_verdicts:
        if not verdict.fits:
            filtered[verdict.reason_class] += 1
    filtered = Counter({k: v for k, v in filtered.items() if v > 0})
    ranked = _ranked(view, index, skip, single_verdicts, keep + 1, policy, rng_seed)
    if not ranked:
        return Decision(
            node=None,
            devices=(),
            policy=policy,
            score=0.0,
            considered=considered,
            filtered=MappingProxyType(dict(filtered)),
            rejected=_rejections(view, index, skip, single_verdicts, keep or 3, evaluate),
        )
    return _decision(request, index, policy, ranked, considered, filtered)


def _search_figures(
    request: GpuRequest, settings: PlacementSettings, utilisation_known: bool
) -> tuple[DeviceContext, Ask]:
    dctx = device_context(request, settings, utilisation_known)
    return dctx, ask_of(request, settings, dctx.util_bound)


def _decision(
    request: GpuRequest,
    index: PlacementIndex,
    policy: str,
    ranked: list[tuple[NodeEval, str]],
    considered: int,
    filtered: Mapping[str, int],
) -> Decision:
    """The decision for the first of `ranked`, the rest as runners-up."""
    verdict, chosen = ranked[0]
    node = index.nodes[chosen]
    devices = tuple(
        DeviceChoice(
            container=request.containers[ci].container,
            container_index=request.containers[ci].index,
            uuid=node.gpus[pos].uuid,
            gpu_index=node.gpus[pos].index,
            model=node.gpus[pos].model,
            memory_mib=mem,
            cores=cores,
        )
        for ci, pos, mem, cores in verdict.assignment
    )
    return Decision(
        node=chosen,
        devices=devices,
        policy=policy,
        score=verdict.score,
        considered=considered,
        filtered=MappingProxyType(dict(filtered)),
        runners_up=_runners_up(ranked, verdict),
        stale=node.freshness == Freshness.STALE,
    )


def _sync(view: RequestView, index: PlacementIndex, request: GpuRequest, evaluate: Callable[[Node], NodeEval]) -> None:
    """Bring the view up to the index: classes created, emptied or changed membership since."""
    end = index.log_base + len(index.log)
    behind = end - view.position
    if view.position < index.log_base or behind > len(index.classes):
        # Too far behind: re-add every class (verdicts of surviving classes are still right).
        view.verdicts = {cid: v for cid, v in view.verdicts.items() if cid in index.classes}
        view.sizes.clear()
        view.filtered.clear()
        view.heap.clear()
        changed: Iterable[int] = list(index.classes)
    else:
        changed = set(index.log[view.position - index.log_base :])
    for cid in changed:
        old = view.verdicts.get(cid)
        if old is not None and not old.fits:
            view.filtered[old.reason_class] -= view.sizes.get(cid, 0)
        cls = index.classes.get(cid)
        if cls is None:
            view.verdicts.pop(cid, None)
            view.sizes.pop(cid, None)
            view.stamps.pop(cid, None)
            continue
        verdict = (
            old or _prefilter(cls.free_desc, cls.cpu_free, cls.memory_free, request) or evaluate(cls.representative)
        )
        view.verdicts[cid] = verdict
        view.sizes[cid] = len(cls.ranks)
        if verdict.fits:
            stamp = view.stamps.get(cid, 0) + 1
            view.stamps[cid] = stamp
            heapq.heappush(view.heap, (*_order_key(verdict, cls.ranks[0]), cid, stamp, 0))
        else:
            view.filtered[verdict.reason_class] += len(cls.ranks)
    view.position = end
    if len(view.heap) > 4 * len(view.stamps) + 64:  # drop superseded entries now and then
        view.heap = [e for e in view.heap if view.stamps.get(e[4]) == e[5]]
        heapq.heapify(view.heap)


def _ranked(
    view: RequestView | None,
    index: PlacementIndex,
    skip: set[str],
    singles: list[tuple[NodeEval, str]],
    want: int,
    policy: str,
    rng_seed: int | None,
) -> list[tuple[NodeEval, str]]:
    """The best `want` feasible nodes in ranking order (random: one uniform draw first)."""
    if policy == "random":
        return _random_pick(view, index, skip, singles, rng_seed)
    local: list[tuple[int, float, float, int, int, int, int]] = [
        (*_order_key(v, index.rank.get(n, 0)), -1 - i, 0, 0) for i, (v, n) in enumerate(singles) if v.fits
    ]
    heapq.heapify(local)
    out: list[tuple[NodeEval, str]] = []
    taken: list[tuple[int, float, float, int, int, int, int]] = []
    main = view.heap if view is not None else []
    while len(out) < want:
        while main and view is not None and view.stamps.get(main[0][4]) != main[0][5]:
            heapq.heappop(main)  # superseded
        if main and (not local or main[0] < local[0]):
            entry = heapq.heappop(main)
            taken.append(entry)
        elif local:
            entry = heapq.heappop(local)
        else:
            break
        cid, j = entry[4], entry[6]
        if cid < 0:  # a node judged on its own
            out.append(singles[-1 - cid])
            continue
        assert view is not None
        members = (
            [r for r in index.classes[cid].ranks if index.names[r] not in skip] if skip else index.classes[cid].ranks
        )
        if j >= len(members):
            continue
        if members[j] != entry[3]:  # the class's first eligible node is later than keyed: re-key
            heapq.heappush(local, (*entry[:3], members[j], *entry[4:]))
            continue
        out.append((view.verdicts[cid], index.names[members[j]]))
        if j + 1 < len(members):
            heapq.heappush(local, (*entry[:3], members[j + 1], cid, entry[5], j + 1))
    for entry in taken:
        heapq.heappush(main, entry)
    return out


def _random_pick(
    view: RequestView | None,
    index: PlacementIndex,
    skip: set[str],
    singles: list[tuple[NodeEval, str]],
    seed: int | None,
) -> list[tuple[NodeEval, str]]:
    pool: list[tuple[NodeEval, list[str]]] = [(v, [n]) for v, n in singles if v.fits]
    if view is not None:
        for cid, verdict in view.verdicts.items():
            if verdict.fits:
                names = [index.names[r] for r in index.classes[cid].ranks]
                pool.append((verdict, [n for n in names if n not in skip] if skip else names))
    if not pool:
        return []
    tier = min(v.tier for v, _ in pool)
    pool = [(v, names) for v, names in pool if v.tier == tier and names]
    draw = random.Random(seed).randrange(sum(len(names) for _, names in pool))
    for verdict, names in pool:
        if draw < len(names):
            return [(verdict, names[draw])]
        draw -= len(names)
    return []


def _runners_up(ranked: list[tuple[NodeEval, str]], best: NodeEval) -> tuple[NodeVerdict, ...]:
    if len(ranked) < 2:
        return ()
    best_score = f"{best.score:.2f}"  # formatted once: each runner-up's reason quotes it
    return tuple([_why_lost(v, n, best, best_score) for v, n in ranked[1:]])


def _why_lost(v: NodeEval, name: str, best: NodeEval, best_score: str) -> NodeVerdict:
    """`best_score` is the winner's score as the reasons print it."""
    if v.tier > best.tier:
        why = "stale state or unknown utilisation, ranked lower"
    elif v.score < best.score:
        why = f"score {v.score:.2f} < {best_score}"
    elif v.tiebreak < best.tiebreak:
        why = f"equal score, weaker secondary preference ({v.tiebreak:.1f} < {best.tiebreak:.1f})"
    else:
        why = "equal score, later in node order"
    return NodeVerdict(name, True, v.score, why)


def _rejections(
    view: RequestView | None,
    index: PlacementIndex,
    skip: set[str],
    singles: list[tuple[NodeEval, str]],
    keep: int,
    evaluate: Callable[[Node], NodeEval],
) -> tuple[NodeVerdict, ...]:
    """The failures that came closest (latest stage, most free memory), with their real reasons."""
    # Rank cheaply on (stage, closeness, first rank); build name lists only for the few kept.
    failing: list[tuple[tuple[bool, int, int, int], int, NodeEval]] = [
        (closeness_key(v.stage, v.reason_class, v.closeness, index.rank.get(n, 0)), -1 - i, v)
        for i, (v, n) in enumerate(singles)
        if not v.fits
    ]
    if view is not None:
        classes = index.classes
        failing.extend(
            (closeness_key(v.stage, v.reason_class, v.closeness, classes[cid].ranks[0]), cid, v)
            for cid, v in view.verdicts.items()
            if not v.fits
        )
    best: list[tuple[NodeEval, list[str]]] = []
    for _, cid, verdict in heapq.nsmallest(keep + len(skip), failing, key=lambda e: e[0]):
        if cid < 0:
            names = [singles[-1 - cid][1]]
        else:
            names = [index.names[r] for r in index.classes[cid].ranks if index.names[r] not in skip]
        if names and len(best) < keep:
            best.append((verdict, names))
    out = []
    for verdict, names in best:
        reason = verdict.reason or evaluate(index.nodes[names[0]]).reason  # prefiltered: the real reason now
        more = f" (and {len(names) - 1} more like it)" if len(names) > 1 else ""
        out.append(NodeVerdict(names[0], False, 0.0, reason + more))
    return tuple(out)
