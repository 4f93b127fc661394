"""Precomputation over a Snapshot that keeps `place()` from scanning every node per request.

Nodes whose state is identical (same free figures per device, same labels but the hostname, same
host resources, same freshness) answer every request identically, so they form one *class*: a
request is evaluated once per class, and the answer is memoised per (class, request shape). Within
a class the tie goes to the node first in the index's fixed order (node name order, or a seeded
permutation), which is also the tie-break between classes with equal scores.

Built by the collector in the background; `update_node` lets the background keep it current
between snapshots (the trace replay uses it after every placement). Never built on the request path.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

from hami.placement.evaluate import NodeEval
from hami.placement.frag import DEFAULT_MIX, FragModel, ShapeMix
from hami.placement.scorers import ScoreContext
from hami.placement.selectors import HOSTNAME_LABEL
from hami.placement.settings import PlacementSettings
from hami.state.model import Node, Snapshot

_VIEW_LIMIT = 512
_LOG_LIMIT = 200_000


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
        self._class_of_key: dict[Hashable, int] = {}
        self._class_of_node: dict[str, int] = {}
        self._next_class = 0
        # Classes created or changed membership, in order; request views replay it to catch up.
        self.log: list[int] = []
        self.log_base = 0  # absolute position of log[0]
        self.views: OrderedDict[Hashable, RequestView] = OrderedDict()
        self.sctx = ScoreContext(
            split_count=max(1, settings.max_pods_per_gpu),
            max_cpu_milli=max((n.cpu_milli_free or 0 for n in snapshot.nodes), default=0),
            max_gpus=max((len(n.gpus) for n in snapshot.nodes), default=0),
            frag=FragModel(self.shapes),
        )
        for node in snapshot.nodes:
            self.update_node(node)

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, name: str) -> Node | None:
        return self.nodes.get(name)

    def view(self, key: Hashable) -> RequestView:
        """The per-request-shape view (LRU-bounded); the caller syncs it."""
        view = self.views.get(key)
        if view is None:
            view = self.views[key] = RequestView()
            if len(self.views) > _VIEW_LIMIT:
                self.views.popitem(last=False)
        else:
            self.views.move_to_end(key)
        return view

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
                del self.classes[old]
            elif self.classes[old].representative.name == name:
                self.classes[old].representative = self.nodes[self.names[members[0]]]
        previous = self.nodes.get(name)
        if previous is not None:
            for g in previous.gpus:
                self.uuid_node.pop(g.uuid, None)
        self.nodes[name] = node
        for g in node.gpus:
            self.uuid_node[g.uuid] = name
        key = state_key(node)
        cid = self._class_of_key.get(key)
        if cid is None or cid not in self.classes:
            cid = self._next_class
            self._next_class += 1
            self._class_of_key[key] = cid
            self.classes[cid] = NodeClass(
                [rank],
                node,
                tuple(sorted((g.effective_free_mib for g in node.gpus), reverse=True)),
                node.cpu_milli_free,
                node.memory_mib_free,
            )
            if len(self._class_of_key) > 4 * len(self.nodes) + 1024:  # drop keys of classes gone empty
                self._class_of_key = {k: c for k, c in self._class_of_key.items() if c in self.classes}
        else:
            bisect.insort(self.classes[cid].ranks, rank)
        self._class_of_node[name] = cid
        self._changed(cid)

    def class_of(self, name: str) -> int:
        return self._class_of_node.get(name, -1)

    def class_nodes(self, cid: int) -> Iterator[str]:
        for rank in self.classes[cid].ranks:
            yield self.names[rank]


def build_index(
    snapshot: Snapshot, settings: PlacementSettings, shapes: ShapeMix | None = None, *, order_seed: int | None = None
) -> PlacementIndex:
    """The index for `snapshot`; `order_seed` fixes a random tie order for the whole run (the study's
    protocol), otherwise ties go by node name."""
    return PlacementIndex(snapshot, settings, shapes, order_seed)
