"""Precomputation over a Snapshot that keeps `place()` from scanning every node per request.

Nodes whose state is identical (same free figures per device, same labels but the hostname, same
host resources, same freshness) answer every request identically, so they form one *class*: a
request is evaluated once per class, and the answer is memoised per (class, request shape). Within
a class the tie goes to the node first in the index's fixed order (node name order, or a seeded
permutation), which is also the tie-break between classes with equal scores.

Beside the classes, for binpack and spread (the webhook's policies) the index keeps every node as
a `NodeRec` of plain ints, filed in *candidate lists* keyed by (tier, hardware group, bucket of its
largest free device, level of its most free cores) and sorted by HAMi's usage score: a request
asking m MiB and c% cores only looks at lists that can hold both, and within them walks the most
(binpack) or least (spread) used nodes first, so a decision visits a handful of nodes instead of
the cluster (see search.py's best-first search).

The index also owns the ledger reservations it has *applied*: `applied` (GPU UUID -> usage) is baked
into the node records and candidate lists exactly as if the snapshot had promised it, so the search
never reads the overlay. `apply_delta` moves only the nodes whose devices changed (the webhook calls
it after each reservation, O(devices reserved)); `sync_overlay` makes `applied` equal to a ledger
overlay by diffing it (O(overlay): background, or at most every few hundred ms on the request path).

Built by the collector in the background; `update_node` lets the background keep it current
between snapshots (the trace replay uses it after every placement). Never built on the request path.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar, cast

from hami.placement.evaluate import NodeEval
from hami.placement.frag import DEFAULT_MIX, FragModel, ShapeMix
from hami.placement.scorers import WEIGHT, ScoreContext
from hami.placement.selectors import HOSTNAME_LABEL
from hami.placement.settings import PlacementSettings
from hami.state.model import DeviceUsage, Freshness, Node, Snapshot

_VIEW_LIMIT = 512
# A node's largest effective free device, in sixteenths of its group's card: a request needing m MiB
# skips every bucket whose nodes all have less. Coarse on purpose: fewer lists, fewer heap heads.
BUCKETS = 16
TIER_UNKNOWN = -1  # never placeable; counted under "freshness"
_LOG_LIMIT = 200_000
_MEMO_SHAPES = 64  # request shapes whose quick-check verdicts and search figures are remembered
_MEMO_NODES = 4096  # quick-check verdicts remembered per shape before the memo starts over
T = TypeVar("T")


@dataclass(slots=True)
class RequestView:
    """One request shape's verdict on every class, kept current from the index's change log, so a
    repeated shape costs the classes that changed since its last use plus a heap pop."""

    position: int = -1  # absolute log position synced to; -1 = never built
    verdicts: dict[int, NodeEval] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    filtered: Counter[str] = field(default_factory=Counter)
    heap: list[tuple[int, float, float, int, int, int]] = field(default_factory=list)  # order key, cid, stamp
    stamps: dict[int, int] = field(default_factory=dict)


def state_key(node: Node) -> Hashable:
    """Everything placement reads from a node, except its name and GPU UUIDs."""
    labels = tuple(sorted((k, v) for k, v in node.labels.items() if k != HOSTNAME_LABEL))
    gpus = tuple(
        (
            g.index,
            g.model,
            g.memory_total_mib,
            g.effective_free_mib,
            g.cores_promised,
            g.pods,
            g.utilisation,
            g.temperature_c,
            g.ecc_uncorrected,
            g.healthy,
            g.workload_types,
        )
        for g in node.gpus
    )
    return (node.freshness, node.reason, labels, node.cpu_milli_free, node.memory_mib_free, gpus)


@dataclass(slots=True)
class NodeClass:
    """Nodes in one state: their ranks (sorted), one of them to evaluate, and prefilter figures."""

    ranks: list[int]
    representative: Node
    free_desc: tuple[int, ...]  # effective free MiB per device, largest first
    cpu_free: int | None
    memory_free: int | None


class DevRec(NamedTuple):
    """One device's figures as placement's quick check needs them (the index's applied usage included)."""

    uuid: str
    total: int
    free: int  # effective free MiB
    cores_free: int
    pods: int
    ok: bool  # healthy, not too hot, ECC within bound (per the index's settings)
    model: str  # lower-cased, as the type filter compares it


class NodeRec(NamedTuple):
    """A node as plain figures, precomputed in the background so a check is integer comparisons."""

    name: str
    rank: int
    tier: int  # 0 fresh, 2 stale, TIER_UNKNOWN
    group: tuple[int, int]  # (GPU count, smallest card MiB): HAMi's score per request is fixed per group
    devs: tuple[DevRec, ...]
    pods: int
    cores: int  # promised cores, summed
    used_mem: int  # total minus effective free, summed
    total_mem: int
    max_free: int
    max_cores_free: int  # most free cores on one device, percent
    cpu_free: int | None
    memory_free: int | None


ListKey = tuple[int, tuple[int, int], int, int]  # (tier, group, bucket, cores level)

# A node's most free cores on one device, in levels: level L holds [CORE_LEVELS[L-1], CORE_LEVELS[L]).
# A pod asking c% cores skips every level whose nodes all have less (nodes binpack filled up on
# cores but not memory would otherwise top its lists for every such pod); whole cards need 100.
CORE_LEVELS = (1, 10, 25, 50, 100)


def bucket_of(mib: int, card: int) -> int:
    """Bucket b holds free in [b·card/16, (b+1)·card/16); BUCKETS holds a whole free card (or more)."""
    return min(BUCKETS, mib * BUCKETS // card) if card > 0 else 0


def bucket_below(bucket: int, card: int, mib: int) -> bool:
    """True when every node of `bucket` has less than `mib` free on its largest device."""
    return bucket < BUCKETS and (bucket + 1) * card <= BUCKETS * mib


def first_bucket(card: int, mib: int) -> int:
    """The lowest bucket not below `mib` (bucket_below(b, card, mib) exactly when b < this)."""
    if card <= 0:
        return 0
    return min(BUCKETS, max(0, BUCKETS * mib // card))


def gpus_by_model(nodes: Iterable[Node]) -> dict[str, int]:
    """Cards per model over the cluster (frag's model pressure weighs pinned demand against it)."""
    out: Counter[str] = Counter()
    for node in nodes:
        for g in node.gpus:
            out[g.model] += 1
    return dict(out)


def usage_score(rec: NodeRec, split: int) -> float:
    """HAMi's node score before the request (binpack sorts by it descending, spread ascending)."""
    n = len(rec.devs)
    if not n:
        return 0.0
    return WEIGHT * (rec.pods / (split * n) + rec.cores / (100 * n) + rec.used_mem / (rec.total_mem or 1))


def is_empty_usage(u: DeviceUsage | None) -> bool:
    return u is None or (not u.memory_mib and not u.cores and not u.pods and not u.workload_types)


def plus(a: DeviceUsage | None, b: DeviceUsage) -> DeviceUsage:
    """Two usages of one device added up (what the ledger's sum does for two reservations)."""
    if a is None:
        return b
    return DeviceUsage(
        a.memory_mib + b.memory_mib, a.cores + b.cores, a.pods + b.pods, a.workload_types | b.workload_types
    )


def base_devs(node: Node, settings: PlacementSettings) -> tuple[DevRec, ...]:
    """The node's devices as the snapshot has them (no applied usage); kept per node by the index."""
    devs = []
    for g in node.gpus:
        ok = (
            g.healthy
            and (g.temperature_c is None or g.temperature_c <= settings.max_temperature_c)
            and (g.ecc_uncorrected is None or g.ecc_uncorrected <= settings.max_ecc_uncorrected)
        )
        devs.append(
            DevRec(
                g.uuid, g.memory_total_mib, g.effective_free_mib, 100 - g.cores_promised, g.pods, ok, g.model.lower()
            )
        )
    return tuple(devs)


def base_rec(node: Node, rank: int, settings: PlacementSettings) -> NodeRec:
    """The node's record as the snapshot has it (no applied usage): kept per node by the index."""
    devs = base_devs(node, settings)
    pods = cores = used = total = 0
    max_free = max_cores = 0
    card = -1
    for d in devs:
        pods += d.pods
        cores += 100 - d.cores_free
        used += d.total - d.free
        total += d.total
        if d.free > max_free:
            max_free = d.free
        if d.cores_free > max_cores:
            max_cores = d.cores_free
        if card < 0 or d.total < card:
            card = d.total
    return NodeRec(
        node.name,
        rank,
        _TIERS.get(node.freshness, TIER_UNKNOWN),
        (len(devs), max(card, 0)),
        devs,
        pods,
        cores,
        used,
        total,
        max_free,
        max_cores,
        node.cpu_milli_free,
        node.memory_mib_free,
    )


def with_applied(base: NodeRec, applied: Mapping[str, DeviceUsage]) -> NodeRec:
    """`base` with the applied usage of its devices taken off; `base` itself when none has any."""
    changed = [i for i, d in enumerate(base.devs) if d.uuid in applied]
    return moved(base, base, changed, applied) if changed else base


def moved(old: NodeRec, base: NodeRec, positions: Iterable[int], applied: Mapping[str, DeviceUsage]) -> NodeRec:
    """`old` (`base` with some applied usage) with the devices at `positions` brought up to date
    with `applied`. Runs after every reservation and its expiry, so only the changed devices are
    rebuilt and the sums move by their difference instead of being recounted over the node."""
    devs = list(old.devs)
    pods, cores, used = old.pods, old.cores, old.used_mem
    for i in positions:
        b = base.devs[i]
        r = applied.get(b.uuid)
        d = (
            b
            if r is None
            else DevRec(
                b.uuid, b.total, max(0, b.free - r.memory_mib), b.cores_free - r.cores, b.pods + r.pods, b.ok, b.model
            )
        )
        was = devs[i]
        devs[i] = d
        pods += d.pods - was.pods
        cores += was.cores_free - d.cores_free
        used += was.free - d.free
    max_free = max_cores = 0
    for d in devs:
        if d.free > max_free:
            max_free = d.free
        if d.cores_free > max_cores:
            max_cores = d.cores_free
    return NodeRec(
        base.name,
        base.rank,
        base.tier,
        base.group,
        tuple(devs),
        pods,
        cores,
        used,
        base.total_mem,
        max_free,
        max_cores,
        base.cpu_free,
        base.memory_free,
    )


_TIERS = {Freshness.FRESH: 0, Freshness.STALE: 2}


class PlacementIndex:
    """Node classes, the tie order, the score context and the evaluation memo for one snapshot."""

    def __init__(
        self,
        snapshot: Snapshot,
        settings: PlacementSettings,
        shapes: ShapeMix | None = None,
        order_seed: int | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.settings = settings
        self.shapes = shapes or DEFAULT_MIX
        names = sorted(n.name for n in snapshot.nodes)
        if order_seed is not None:
            random.Random(order_seed).shuffle(names)
        self.names: list[str] = names
        self.rank: dict[str, int] = {name: i for i, name in enumerate(names)}
        self.nodes: dict[str, Node] = {}
        self.classes: dict[int, NodeClass] = {}
        self.uuid_node: dict[str, str] = {}
        self._position: dict[str, int] = {}  # uuid -> its device's position in the node's record
        self._class_of_key: dict[Hashable, int] = {}
        self._key_of_class: dict[int, Hashable] = {}  # to forget a key when its class empties
        self._class_of_node: dict[str, int] = {}
        self._next_class = 0
        # Classes created or changed membership, in order; request views replay it to catch up.
        self.log: list[int] = []
        self.log_base = 0  # absolute position of log[0]
        self.views: OrderedDict[Hashable, RequestView] = OrderedDict()
        self.memos: OrderedDict[Hashable, dict[str, tuple[NodeRec, tuple[int, str, int] | float]]] = OrderedDict()
        self._per_shape: OrderedDict[Hashable, Any] = OrderedDict()
        self.recs: dict[str, NodeRec] = {}
        self._base: dict[str, NodeRec] = {}  # per node: its record without applied usage
        # Per list: (binpack order, spread order) of (sort key, rank); ties by rank in both.
        self.lists: dict[ListKey, tuple[list[tuple[float, int]], list[tuple[float, int]]]] = {}
        self.evaluations = 0  # nodes checked by the best-first search (tests bound it)
        # Reservations baked into `recs`/`lists` (uuid -> usage; never an empty usage), and the
        # overlay mapping they were last made equal to, by identity (None once a delta moved on).
        self.applied: dict[str, DeviceUsage] = {}
        self.last_synced: Mapping[str, DeviceUsage] | None = None
        self._split = max(1, settings.max_pods_per_gpu)
        self.sctx = ScoreContext(
            split_count=max(1, settings.max_pods_per_gpu),
            max_cpu_milli=max((n.cpu_milli_free or 0 for n in snapshot.nodes), default=0),
            max_gpus=max((len(n.gpus) for n in snapshot.nodes), default=0),
            frag=FragModel(self.shapes),
            gpus_by_model=gpus_by_model(snapshot.nodes),
        )
        for node in snapshot.nodes:
            self.update_node(node)

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, name: str) -> Node | None:
        return self.nodes.get(name)

    def view(self, key: Hashable) -> RequestView:
        """The per-request-shape view (LRU-bounded); the caller syncs it."""
        return _lru(self.views, key, RequestView, _VIEW_LIMIT)

    def quick_memo(self, key: Hashable) -> dict[str, tuple[NodeRec, tuple[int, str, int] | float]]:
        """Per request shape: the quick check's verdict of a node (a rejection, or its score), valid
        while its record is the same object (records are replaced, never changed). Nodes full for a
        shape (cores, pods) stay at the top of binpack's lists, and the runners-up of one decision are
        mostly the next one's: the memo makes both a lookup. LRU-bounded."""
        memo = _lru(self.memos, key, dict, _MEMO_SHAPES)
        if len(memo) > _MEMO_NODES:  # entries of records long replaced: start over
            memo.clear()
        return memo

    def per_shape(self, key: Hashable, build: Callable[[], T]) -> T:
        """What `build` derives from one request shape under the index's settings (the search's
        figures of the ask), built once and kept LRU-bounded like the quick memos: the pods of one
        workload repeat their shape, and each would otherwise derive it again."""
        return cast(T, _lru(self._per_shape, key, build, _MEMO_SHAPES))

    def _changed(self, cid: int) -> None:
        self.log.append(cid)
        if len(self.log) > _LOG_LIMIT:  # views behind the cut rebuild from scratch
            cut = len(self.log) // 2
            del self.log[:cut]
            self.log_base += cut

    def update_node(self, node: Node) -> None:
        """Put `node` (new, or a new state of a known node) into its class. Background use only."""
        name = node.name
        if name not in self.rank:  # a node that joined after the index was built goes last in the order
            self.rank[name] = len(self.names)
            self.names.append(name)
        rank = self.rank[name]
        old = self._class_of_node.pop(name, None)
        if old is not None:
            members = self.classes[old].ranks
            del members[bisect.bisect_left(members, rank)]
            self._changed(old)
            if not members:
                # A state key is a tuple per GPU: at 10,000 nodes whose readings move every sweep,
                # keeping the keys of emptied classes cost ~100 MB before any pruning caught up.
                del self.classes[old]
                del self._class_of_key[self._key_of_class.pop(old)]
            elif self.classes[old].representative.name == name:
                self.classes[old].representative = self.nodes[self.names[members[0]]]
        previous = self.nodes.get(name)
        if previous is not None:
            for g in previous.gpus:
                self.uuid_node.pop(g.uuid, None)
                self._position.pop(g.uuid, None)
        self.nodes[name] = node
        for position, g in enumerate(node.gpus):
            self.uuid_node[g.uuid] = name
            self._position[g.uuid] = position
        key = state_key(node)
        cid = self._class_of_key.get(key)
        if cid is None or cid not in self.classes:
            cid = self._next_class
            self._next_class += 1
            self._class_of_key[key] = cid
            self._key_of_class[cid] = key
            self.classes[cid] = NodeClass(
                [rank],
                node,
                tuple(sorted((g.effective_free_mib for g in node.gpus), reverse=True)),
                node.cpu_milli_free,
                node.memory_mib_free,
            )
        else:
            bisect.insort(self.classes[cid].ranks, rank)
        self._class_of_node[name] = cid
        self._changed(cid)
        self._base.pop(name, None)  # a new state: its devices are read again
        self._file(node, rank)

    def _file(self, node: Node, rank: int, changed: list[int] | None = None) -> None:
        """Move the node's record into the candidate list its new figures belong to. `changed`:
        the positions of the only devices whose applied usage changed since its record was made."""
        old = self.recs.get(node.name)
        if old is not None:
            key = _list_key(old)
            binpack, spread = self.lists[key]
            score = usage_score(old, self._split)
            del binpack[bisect.bisect_left(binpack, (-score, rank))]
            del spread[bisect.bisect_left(spread, (score, rank))]
            if not binpack:
                del self.lists[key]
        base = self._base.get(node.name)
        if base is None or self.nodes.get(node.name) is not node:
            base = self._base[node.name] = base_rec(node, rank, self.settings)
            changed = None  # a new state: every device is read again
        if changed is not None and old is not None:
            rec = moved(old, base, changed, self.applied)
        else:
            rec = with_applied(base, self.applied) if self.applied else base
        self.recs[node.name] = rec
        binpack, spread = self.lists.setdefault(_list_key(rec), ([], []))
        score = usage_score(rec, self._split)
        bisect.insort(binpack, (-score, rank))
        bisect.insort(spread, (score, rank))

    def apply_delta(self, changes: Mapping[str, DeviceUsage | None]) -> int:
        """Set the applied usage of these UUIDs (absolute values; None or an empty usage removes it)
        and re-file only the nodes they belong to. Returns how many nodes moved. O(devices changed).

        A UUID of a node the index does not know yet is kept, and applied when the node arrives."""
        touched: dict[str, list[int]] = {}  # node -> positions of its changed devices
        applied = self.applied
        for uuid, usage in changes.items():
            if is_empty_usage(usage):
                if applied.pop(uuid, None) is None:
                    continue
            elif applied.get(uuid) == usage:
                continue
            else:
                assert usage is not None
                applied[uuid] = usage
            name = self.uuid_node.get(uuid)
            if name is not None:
                touched.setdefault(name, []).append(self._position[uuid])
        self.last_synced = None  # `applied` no longer equals that mapping
        for name, positions in touched.items():
            node = self.nodes.get(name)
            if node is not None:
                self._file(node, self.rank[name], positions)
        return len(touched)

    def add_usage(self, shares: Mapping[str, DeviceUsage]) -> int:
        """Add one reservation's per-device usage to what is applied (the webhook, after a reserve)."""
        return self.apply_delta({uuid: plus(self.applied.get(uuid), share) for uuid, share in shares.items()})

    def remove_usage(self, shares: Mapping[str, DeviceUsage]) -> int:
        """Take back what `add_usage` added (a reservation the ledger refused)."""
        changes: dict[str, DeviceUsage | None] = {}
        for uuid, share in shares.items():
            current = self.applied.get(uuid)
            if current is None:
                continue
            left = DeviceUsage(
                current.memory_mib - share.memory_mib,
                current.cores - share.cores,
                current.pods - share.pods,
                current.workload_types,
            )
            changes[uuid] = left if (left.memory_mib > 0 or left.cores > 0 or left.pods > 0) else None
        return self.apply_delta(changes) if changes else 0

    def sync_overlay(self, overlay: Mapping[str, DeviceUsage]) -> int:
        """Make `applied` equal to `overlay` (the ledger's), moving only the nodes that differ.

        O(len(overlay) + len(applied)), so never per request: skipped outright when `overlay` is the
        very mapping last synced, which the ledger hands out unchanged until a reservation changes."""
        if overlay is self.last_synced:
            return 0
        applied = self.applied
        # `is not` first: a device the ledger did not touch since is the very same record.
        changes: dict[str, DeviceUsage | None] = {
            u: v for u, v in overlay.items() if (a := applied.get(u)) is not v and a != v
        }
        changes.update((u, None) for u in applied if u not in overlay)
        refiled = self.apply_delta(changes) if changes else 0
        self.last_synced = overlay
        return refiled

    def class_of(self, name: str) -> int:
        return self._class_of_node.get(name, -1)

    def class_nodes(self, cid: int) -> Iterator[str]:
        for rank in self.classes[cid].ranks:
            yield self.names[rank]


def _lru(cache: OrderedDict[Hashable, Any], key: Hashable, build: Callable[[], Any], limit: int) -> Any:
    """The entry of `key`, built on a miss; the least recently used entry goes beyond `limit`."""
    found = cache.get(key)
    if found is None:
        found = cache[key] = build()
        if len(cache) > limit:
            cache.popitem(last=False)
    elif next(reversed(cache)) != key:  # the pods of one workload come in a row: already the newest
        cache.move_to_end(key)  # (an equality test of the keys' parts, no hashing of them again)
    return found


def _list_key(rec: NodeRec) -> ListKey:
    return (
        rec.tier,
        rec.group,
        bucket_of(rec.max_free, rec.group[1]),
        bisect.bisect_right(CORE_LEVELS, rec.max_cores_free),
    )


def first_level(cores: int) -> int:
    """The lowest cores level not below a device need of `cores` percent."""
    return bisect.bisect_right(CORE_LEVELS, cores)


def build_index(
    snapshot: Snapshot, settings: PlacementSettings, shapes: ShapeMix | None = None, *, order_seed: int | None = None
) -> PlacementIndex:
    """The index for `snapshot`; `order_seed` fixes a random tie order for the whole run (the study's
    protocol), otherwise ties go by node name."""
    return PlacementIndex(snapshot, settings, shapes, order_seed)
