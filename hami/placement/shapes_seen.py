"""The mix of pod shapes the cluster has seen: `frag`'s reference for what is still to come.

Fragmentation is only defined against a workload ("is this 190-milli sliver useful to anyone?"),
so the webhook learns it from the pods it places: each container's device count and its share of
the chosen card in milli-GPU (the scarcer of memory and cores, as the scorer counts it). The index
takes a new mix in the background; until enough pods were seen, the built-in default mix serves.
"""

from __future__ import annotations

from collections import deque

from hami.placement.decision import Decision
from hami.placement.frag import Shape, ShapeMix
from hami.requests import GpuRequest
from hami.state.model import Snapshot

MILLI = 1000


class ShapeTracker:
    def __init__(self, window: int = 5000, minimum: int = 50) -> None:
        self._recent: deque[Shape] = deque(maxlen=window)  # bounded: the recent past, not all time
        self.minimum = minimum
        self.seen = 0  # shapes observed since start (tells the runtime when to refresh the mix)

    def observe(self, decision: Decision, request: GpuRequest, snapshot: Snapshot) -> None:
        node = snapshot.node(decision.node or "")
        for container in request.containers:
            first = next((d for d in decision.devices if d.container_index == container.index), None)
            if first is None:
                continue
            card = node.gpu(first.uuid) if node else None
            total = card.memory_total_mib if card else 0
            memory_share = first.memory_mib * MILLI // total if total else MILLI
            core_share = container.cores * MILLI // 100 if container.cores else 0
            milli = min(MILLI, max(memory_share, core_share))
            self._recent.append(Shape(container.count, MILLI if container.count > 1 else round(milli, -1)))
            self.seen += 1

    def mix(self, threshold_pct: float) -> ShapeMix | None:
        """The study's typical-shape mix over the recent window; None until enough pods were seen."""
        if len(self._recent) < self.minimum:
            return None
        return ShapeMix.from_shapes(self._recent, threshold_pct, step=1)  # as the study's experiments
