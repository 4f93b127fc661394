"""Best-first search for binpack and spread: the best feasible nodes without scanning the cluster.

HAMi's node score after adding a request is the node's usage score plus a term fixed by the request
and the node's hardware group, so within one of the index's candidate lists (same tier, group and
free-memory bucket) the usage order *is* the score order. A heap holding the head of every list that
can hold the request pops nodes in exact ranking order (tier, score, node order); the first node
that passes the filters is the best one, and the search stops after `want` (winner + runners-up).

The ledger's reservations are baked into the index (`PlacementIndex.applied`, see index.py), so the
lists already hold every node at its true score: the search never reads the overlay, and a decision
costs O(log n + nodes rejected) whatever the number of pending reservations.

A node check is integer comparisons over the index's precomputed `NodeRec` (`quick`), remembered
per request shape while the record stays the same. The full `evaluate_node` runs only for requests
whose constraints the quick check does not cover (UUIDs, selectors, utilisation bound, separation),
which keeps the reasons exact, and for the winner of a request with several containers; the winner
of a lone container is judged from its record as well (`quick_verdict`, equal to evaluate_node).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

from hami.placement.decision import NodeVerdict
from hami.placement.evaluate import STAGE_DEVICES, STAGE_FIT, STAGE_NODE, NodeEval, closeness_key, device_context
from hami.placement.filters import OTHER_WORKLOAD, DeviceContext, needs_whole_card
from hami.placement.index import TIER_UNKNOWN, ListKey, NodeRec, PlacementIndex, first_bucket, first_level
from hami.placement.scorers import WEIGHT
from hami.placement.settings import PlacementSettings, nodes_to_check
from hami.requests import GpuRequest
from hami.state.model import Node

SEARCH_POLICIES = ("binpack", "spread")
_DENY_PROBES = 8  # nodes of the closest skipped buckets judged to explain a denial
Rejection = tuple[int, str, int]  # (stage, reason class, closeness)
_MEMORY = STAGE_DEVICES + 7  # DEVICE_FILTERS' "memory" entry


@dataclass(slots=True)
class Ask:
    """The request's figures the quick check and the score need, computed once per decision; the
    per-card-size and per-model figures are memoised as the search meets them (a handful each)."""

    request: GpuRequest
    need: int  # most devices any one container needs
    whole: bool  # every container wants whole cards
    min_cores: int
    pods_add: int
    cores_add: int
    single: tuple[int, int | None, int | None, int, bool] | None  # (count, mib, pct, cores, whole) of a lone container
    exact: bool  # the quick check covers every filter the request triggers (its reasons are the real ones)
    cpu: int
    memory: int
    use_types: tuple[str, ...]  # lower-cased
    nouse_types: tuple[str, ...]
    typed: bool = False  # use_types or nouse_types given
    _min_mem: dict[int, int] = field(default_factory=dict)
    _max_mem: dict[int, int] = field(default_factory=dict)
    _add_mem: dict[int, int] = field(default_factory=dict)
    _one_mem: dict[int, int] = field(default_factory=dict)
    _type_ok: dict[str, bool] = field(default_factory=dict)
    _first_bucket: dict[int, int] = field(default_factory=dict)
    _groups: dict[tuple[tuple[int, int], int, bool], tuple[int, float]] = field(default_factory=dict)

    def min_mem(self, card: int) -> int:
        """The smallest per-device memory any container asks on a card of `card` MiB (the memory filter)."""
        v = self._min_mem.get(card)
        if v is None:
            v = self._min_mem[card] = min((c.memory_on(card) for c in self.request.containers), default=0)
        return v

    def max_mem(self, card: int) -> int:
        """The largest per-device memory ask on such a card (what a bucket must hold)."""
        v = self._max_mem.get(card)
        if v is None:
            v = self._max_mem[card] = max((c.memory_on(card) for c in self.request.containers), default=0)
        return v

    def add_mem(self, card: int) -> int:
        """Memory the request adds to a node whose smallest card is `card` (HAMi's score)."""
        v = self._add_mem.get(card)
        if v is None:
            v = self._add_mem[card] = sum(c.count * c.memory_on(card) for c in self.request.containers)
        return v

    def one_mem(self, card: int) -> int:
        """The lone container's memory on one device of `card` MiB."""
        v = self._one_mem.get(card)
        if v is None:
            assert self.single is not None
            v = self._one_mem[card] = _mem_on(card, self.single[1], self.single[2])
        return v

    def first_bucket(self, card: int) -> int:
        """The index's buckets below this one hold no node whose largest free device can take the
        largest per-device ask on a `card` MiB card (see index.bucket_below)."""
        v = self._first_bucket.get(card)
        if v is None:
            v = self._first_bucket[card] = 0 if not self.request.containers else first_bucket(card, self.max_mem(card))
        return v

    def group_figures(self, group: tuple[int, int], split: int, binpack: bool) -> tuple[int, float]:
        """(first bucket, key offset) of a hardware group's lists for this ask (see `_key_offset`)."""
        key = (group, split, binpack)
        v = self._groups.get(key)
        if v is None:
            v = self._groups[key] = (self.first_bucket(group[1]), _key_offset(group, self, split, binpack))
        return v

    def type_ok(self, model: str) -> bool:
        """The type filter for a lower-cased model name (substring match, as device_type does)."""
        v = self._type_ok.get(model)
        if v is None:
            wanted = not self.use_types or any(t in model for t in self.use_types)
            v = self._type_ok[model] = wanted and not any(t in model for t in self.nouse_types)
        return v


def ask_of(request: GpuRequest, settings: PlacementSettings, util_bound: float | None) -> Ask:
    cs = request.containers
    lone = cs[0] if len(cs) == 1 else None
    return Ask(
        request=request,
        need=max((c.count for c in cs), default=0),
        whole=bool(cs) and all(needs_whole_card(c) for c in cs),
        min_cores=min((c.cores for c in cs), default=0),
        pods_add=sum(c.count for c in cs),
        cores_add=sum(c.count * (100 if needs_whole_card(c) else c.cores) for c in cs),
        single=None
        if lone is None
        else (lone.count, lone.memory_mib, lone.memory_percent, lone.cores, needs_whole_card(lone)),
        exact=not (
            request.use_uuids
            or request.nouse_uuids
            or util_bound is not None
            or (settings.separate_workloads and (request.workload_type or "") in OTHER_WORKLOAD)
            or request.node_selector
            or request.affinity
        ),
        cpu=request.cpu_milli,
        memory=request.memory_mib,
        use_types=tuple(t.lower() for t in request.use_types),
        nouse_types=tuple(t.lower() for t in request.nouse_types),
        typed=bool(request.use_types or request.nouse_types),
    )


def _mem_on(card: int, mib: int | None, pct: int | None) -> int:
    if mib is not None:
        return mib
    return card * (pct if pct is not None else 100) // 100


def quick(rec: NodeRec, a: Ask, settings: PlacementSettings) -> Rejection | float:
    """The node's HAMi score after the request, or why it cannot fit. Mirrors evaluate_node's stages
    for health, type, pods, cores, memory and capacity (a necessary condition for the rest), in one
    pass over the devices: each stage keeps the devices that passed the ones before. The record
    already carries the index's applied reservations."""
    if not _host_fits(rec, a):
        return (STAGE_NODE, "host-resources", 0)
    limit = settings.max_pods_per_gpu
    whole, min_cores, single, typed_ask = a.whole, a.min_cores, a.single, a.typed
    healthy = typed = pods_ok = cores_ok = mem_ok = fitting = 0
    free_pods = free_cores = free_mem = 0  # most free MiB among the devices that passed that stage
    card = -1  # the per-card asks of the last card size seen (a node's cards are usually all alike)
    min_mem = one_mem = 0
    for d in rec.devs:
        if not d.ok:
            continue
        healthy += 1
        if typed_ask and not a.type_ok(d.model):
            continue
        typed += 1
        free = d.free
        if d.pods >= limit or (whole and not (d.pods == 0 and d.cores_free == 100 and free >= d.total)):
            continue
        pods_ok += 1
        if free > free_pods:
            free_pods = free
        if d.cores_free < min_cores:
            continue
        cores_ok += 1
        if free > free_cores:
            free_cores = free
        if d.total != card:
            card = d.total
            min_mem = a.min_mem(card)
            one_mem = a.one_mem(card) if single is not None else 0
        if free < min_mem:
            continue
        mem_ok += 1
        if free > free_mem:
            free_mem = free
        if single is not None and (single[4] or (free >= one_mem and d.cores_free >= single[3])):
            fitting += 1
    need = a.need
    if typed < need:
        stage = (STAGE_DEVICES, "unhealthy") if healthy < need else (STAGE_DEVICES + 1, "gpu-type")
        return (*stage, rec.max_free)
    if pods_ok < need:
        return (STAGE_DEVICES + 5, "pods", rec.max_free)
    if cores_ok < need:
        return (STAGE_DEVICES + 6, "cores", free_pods)
    if mem_ok < need:
        return (STAGE_DEVICES + 7, "memory", free_cores)
    if single is not None and fitting < single[0]:
        return (STAGE_FIT, "capacity", free_mem)
    # several containers: which devices they share is the full evaluation's business
    return _score(rec, a, max(1, limit))


def quick_verdict(rec: NodeRec, a: Ask, settings: PlacementSettings, tier: int, binpack: bool) -> NodeEval | None:
    """The full verdict for a lone container the quick check judges exactly (`a.exact`), from the
    record: evaluate_node's device filters, HAMi's device order (`device_order`: best device score
    after adding the container, ties by device index), the devices it takes and the node score after
    them. The winner of nearly every GPU admission is judged here, without building Device views.
    None when the container does not fit (the caller then asks evaluate_node for the reason)."""
    assert a.single is not None
    count, _, _, cores, whole = a.single
    limit = settings.max_pods_per_gpu
    split = max(1, limit)
    order = []
    typed, min_cores = a.typed, a.min_cores
    card = min_mem = mem = -1  # the per-card asks of the last card size seen (a node's cards are usually alike)
    for pos, d in enumerate(rec.devs):
        if not d.ok or (typed and not a.type_ok(d.model)) or d.pods >= limit:
            continue  # device_health, device_type, device_pods
        if d.total != card:
            card = d.total
            min_mem, mem = a.min_mem(card), a.one_mem(card)
        if d.cores_free < min_cores or d.free < min_mem:
            continue  # device_cores, device_memory
        if whole:
            if not (d.pods == 0 and d.cores_free == 100 and d.free >= d.total):
                continue  # device_pods and device_fits both want an empty card
        elif d.free < mem or d.cores_free < cores:
            continue  # device_fits
        total = d.total or 1
        # hami_device_score(d, split, 1, cores, mem), in the same float operations
        score = WEIGHT * ((d.pods + 1) / split + (100 - d.cores_free + cores) / 100 + (d.total - d.free + mem) / total)
        order.append((-score if binpack else score, pos, mem))
    if count <= 0 or len(order) < count:
        return None
    order.sort()  # by score, then device index: what the stable sort of device_order gives
    taken = order[:count]
    n = len(rec.devs)
    used_mem = rec.used_mem + sum(mem for _, _, mem in taken)
    node_score = WEIGHT * (
        (rec.pods + count) / (split * n)
        + (rec.cores + count * (100 if whole else cores)) / (100 * n)
        + used_mem / (rec.total_mem or 1)
    )
    assignment = tuple((0, pos, mem, cores) for _, pos, mem in taken)
    return NodeEval(True, node_score if binpack else -node_score, 0.0, tier, assignment=assignment)


def _host_fits(rec: NodeRec, a: Ask) -> bool:
    """The quick check's first stage: the node's free host CPU and memory (where tracked)."""
    return (rec.cpu_free is None or rec.cpu_free >= a.cpu) and (rec.memory_free is None or rec.memory_free >= a.memory)


def _score(rec: NodeRec, a: Ask, split: int) -> float:
    """HAMi's node score after the request, from the record's sums (what the lists are sorted by)."""
    n = len(rec.devs) or 1
    return WEIGHT * (
        (rec.pods + a.pods_add) / (split * n)
        + (rec.cores + a.cores_add) / (100 * n)
        + (rec.used_mem + a.add_mem(rec.group[1])) / (rec.total_mem or 1)
    )


@dataclass(slots=True)
class Found:
    """What the search found: feasible nodes in ranking order, and what it rejected on the way."""

    ranked: list[tuple[NodeEval, str]] = field(default_factory=list)
    # A defaultdict, not a Counter: both count from 0, and this one is made and filled in C.
    filtered: defaultdict[str, int] = field(default_factory=partial(defaultdict, int))
    considered: int = 0
    # (closeness_key, name, verdict or None when only the quick check judged it)
    rejects: list[tuple[tuple[bool, int, int, int], str, NodeEval | None]] = field(default_factory=list)
    evaluate: Callable[[Node], NodeEval] | None = None
    nodes: Mapping[str, Node] = field(default_factory=dict)

    def reject(
        self,
        rank: int,
        name: str,
        stage: int,
        reason_class: str,
        closeness: int,
        v: NodeEval | None,
        *,
        count: bool = True,
    ) -> None:
        if count:  # probes of skipped buckets are already counted by their bucket
            self.filtered[reason_class] += 1
        self.rejects.append((closeness_key(stage, reason_class, closeness, rank), name, v))

    def rejections(self, keep: int) -> tuple[NodeVerdict, ...]:
        """The failures that came closest (see `closeness_key`), with their real reasons."""
        out = []
        for _, name, verdict in heapq.nsmallest(keep, self.rejects, key=lambda e: e[0]):
            if (verdict is None or not verdict.reason) and self.evaluate is not None:
                verdict = self.evaluate(self.nodes[name])  # only the few shown pay for the wording
            out.append(NodeVerdict(name, False, 0.0, verdict.reason if verdict else ""))
        return tuple(out)


def best_first(
    request: GpuRequest,
    index: PlacementIndex,
    settings: PlacementSettings,
    policy: str,
    want: int,
    evaluate: Callable[[Node], NodeEval],
    memo: dict[str, tuple[NodeRec, Rejection | float]] | None = None,
    dctx: DeviceContext | None = None,
    ask: Ask | None = None,
) -> Found:
    """The best `want` feasible nodes for binpack/spread in ranking order (see the module doc).

    `memo` (the index's `quick_memo` for this request shape and settings) remembers the quick check's
    verdict per node record: nodes that stay full for this shape, and the runners-up that stay the
    same between two decisions (only the winner's record changes), cost a lookup. `dctx` and
    `ask` are the request's device context and `ask_of` figures when the caller keeps them per shape.

    `evaluate` must judge nodes with the index's applied usage (`index.applied`) as the overlay, or
    the exact verdicts would disagree with the records the search ranks by.

    Heap entries are (tier, key, rank, seq, kind, ref, pos). A list element first enters *keyed by a
    bound* (kind 3): its usage key from the list plus a lower bound of what the request adds for its
    hardware group, so lists whose heads never reach the top never pay for an exact score. Popped,
    it is rejected there when the memo or one comparison can tell (a rejected node never ranks, so
    judging it early changes nothing), else re-keyed exactly (kind 0; by its remembered score when
    the memo has one); popped again, it is judged.
    kind 2: a verdict re-keyed."""
    dctx = dctx or device_context(request, settings, index.snapshot.utilisation_known)
    a = ask or ask_of(request, settings, dctx.util_bound)
    split = max(1, settings.max_pods_per_gpu)
    binpack = policy == "binpack"
    sign = 1.0 if binpack else -1.0
    found = Found(evaluate=evaluate, nodes=index.nodes)
    recs, names = index.recs, index.names
    heap: list[tuple[int, float, int, int, int, object, int]] = []
    seq = 0
    below: list[tuple[int, ListKey]] = []
    conservative = settings.degradation != "aggressive"
    stale = skipped = short = 0
    per_group: dict[tuple[int, int], tuple[int, float]] = {}  # (first bucket, key offset) per group
    min_level = first_level(100 if a.whole else a.min_cores) if request.containers else 0
    for key, (by_usage, by_idle) in index.lists.items():
        tier, group, bucket, level = key
        if tier == TIER_UNKNOWN or (tier == 2 and conservative):
            stale += len(by_usage)
            continue
        g = per_group.get(group)
        if g is None:
            g = per_group[group] = a.group_figures(group, split, binpack)
        if bucket < g[0]:
            skipped += len(by_usage)  # every node here has less free on its largest device
            below.append((bucket, key))
            continue
        if level < min_level:
            short += len(by_usage)  # every node here has fewer cores free on its best device
            below.append((bucket, key))
            continue
        order = by_usage if binpack else by_idle
        seq += 1
        heap.append((tier, order[0][0] + g[1], order[0][1], seq, 3, order, 0))
    if stale:
        found.filtered["freshness"] += stale
    if skipped:
        found.filtered["memory"] += skipped
    if short:
        found.filtered["cores" if not a.whole else "pods"] += short  # whole cards fail device_pods
    found.considered += stale + skipped + short
    heapq.heapify(heap)
    budget = nodes_to_check(settings, len(index.nodes)) or len(index.nodes) + 1
    exact, typed, single = a.exact, a.typed, a.single
    filtered, rejects, ranked = found.filtered, found.rejects, found.ranked
    pop, push = heapq.heappop, heapq.heappush
    checked = 0
    while heap and len(ranked) < want and checked < budget:
        tier, neg, rank, _, kind, ref, pos = pop(heap)
        name = names[rank]
        if kind == 2:  # a verdict re-keyed after full evaluation
            assert isinstance(ref, NodeEval)
            ranked.append((ref, name))
            continue
        rec = recs[name]
        q: Rejection | float | None = None
        if kind == 3:  # keyed by its bound: reject it now if that is cheap, else key it exactly
            hit = memo.get(name) if memo is not None else None
            if hit is not None and hit[0] is rec:
                q = hit[1]
                if isinstance(q, float):  # a remembered fit: key it exactly (its score), as below
                    seq += 1
                    push(heap, (tier, -sign * q, rank, seq, 0, ref, pos))
                    continue
            elif not typed and rec.max_free < a.min_mem(rec.group[1]):
                # The bucket the ask falls in holds nodes without the room: one comparison tells them
                # (not when types are asked: a type mismatch must be named as such, it ranks last).
                q = (_MEMORY, "memory", rec.max_free)
                if memo is not None:
                    memo[name] = (rec, q)
            else:
                seq += 1
                push(heap, (tier, -sign * _score(rec, a, split), rank, seq, 0, ref, pos))
                continue
        order = ref  # a list's element judged now: move the list on
        assert isinstance(order, list)
        if pos + 1 < len(order):
            sortkey, nxt = order[pos + 1]
            seq += 1
            push(heap, (tier, sortkey + per_group[rec.group][1], nxt, seq, 3, order, pos + 1))
        checked += 1
        found.considered += 1
        verdict: NodeEval | None = None
        judged = False  # quick_verdict ran for this node already
        if q is None:
            hit = memo.get(name) if memo is not None else None
            if hit is not None and hit[0] is rec:
                q = hit[1]
            else:
                if exact and single is not None and not ranked and _host_fits(rec, a):
                    # The likely winner, unseen in this state: its full verdict scans the devices
                    # anyway, and a fit there is exactly the quick check's pass, whose answer is
                    # then the score. Only a node that does not fit needs `quick` for its reason.
                    verdict, judged = quick_verdict(rec, a, settings, tier, binpack), True
                q = _score(rec, a, split) if verdict is not None else quick(rec, a, settings)
                if memo is not None:
                    memo[name] = (rec, q)
        if not isinstance(q, float):  # (the memo has it: every verdict is stored where it is made)
            if exact:  # the quick check's reason is the real one; the wording waits for a denial
                filtered[q[1]] += 1
                rejects.append((closeness_key(q[0], q[1], q[2], rank), name, None))
            else:
                _reject(rec, q, a, found, index)
            continue
        if exact and single is not None:
            if ranked:
                # Runners-up only explain the decision: the quick check is the whole verdict here.
                ranked.append((NodeEval(True, score=-neg, tier=tier), name))
                continue
            if not judged:
                verdict = quick_verdict(rec, a, settings, tier, binpack)
        if verdict is None:
            verdict = evaluate(index.nodes[name])
        if not verdict.fits:
            found.reject(rank, name, verdict.stage, verdict.reason_class, verdict.closeness, verdict)
            continue
        if (verdict.tier, -verdict.score) > (tier, neg):  # ranks lower than keyed (unknown utilisation)
            seq += 1
            push(heap, (verdict.tier, -verdict.score, rank, seq, 2, verdict, 0))
            continue
        ranked.append((verdict, name))
    index.evaluations += checked
    if not found.ranked:
        _probe_below(below, index, found, evaluate, a, settings)
    return found


_KEY_SLACK = 1e-9  # float rounding between a list's usage key and the exact score, with room to spare


def _key_offset(group: tuple[int, int], a: Ask, split: int, binpack: bool) -> float:
    """What the request adds to a list element's usage key, at most (so the sum never exceeds the
    exact heap key): binpack's key is -score, so the bound takes the largest memory share a node of
    the group can get (total memory is at least count × smallest card); spread's is +score, so it
    leaves the memory share out."""
    n, card = group
    nn = n or 1
    base = WEIGHT * (a.pods_add / (split * nn) + a.cores_add / (100 * nn))
    if not binpack:
        return base - _KEY_SLACK
    if n * card <= 0:
        return float("-inf")
    return -(base + WEIGHT * a.add_mem(card) / (n * card)) - _KEY_SLACK


def _reject(rec: NodeRec, q: Rejection, a: Ask, found: Found, index: PlacementIndex) -> None:
    if a.exact or found.evaluate is None:
        found.reject(rec.rank, rec.name, q[0], q[1], q[2], None)
        return
    # The request has filters the quick check skips, which may come first: take the real verdict.
    v = found.evaluate(index.nodes[rec.name])
    found.reject(rec.rank, rec.name, v.stage, v.reason_class, v.closeness, v)


def _probe_below(
    below: list[tuple[int, ListKey]],
    index: PlacementIndex,
    found: Found,
    evaluate: Callable[[Node], NodeEval],
    a: Ask,
    settings: PlacementSettings,
) -> None:
    """A denial names the closest nodes: judge the heads of the fullest buckets that were skipped.
    The quick check ranks them when its reasons are the real ones; only the few a denial shows are
    then evaluated in full, for their wording (see `Found.rejections`)."""
    probes = 0
    for _, key in sorted(below, reverse=True):
        for _, rank in index.lists[key][1]:
            if probes >= _DENY_PROBES:
                return
            probes += 1
            name = index.names[rank]
            q = quick(index.recs[name], a, settings) if a.exact else None
            if q is not None and not isinstance(q, float):
                found.reject(rank, name, q[0], q[1], q[2], None, count=False)
                continue
            v = evaluate(index.nodes[name])
            found.reject(rank, name, v.stage, v.reason_class, v.closeness, v, count=False)
