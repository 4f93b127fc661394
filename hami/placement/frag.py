"""Expected GPU fragmentation of a node against a mix of pod shapes (FGD, USENIX ATC 2023).

"Beware of Fragmentation" (Weng et al.) measures, for each typical pod shape, how much of a node's
free GPU capacity that shape could NOT use: all of it when the shape cannot land on the node at all
(wrong model, too few GPUs with room, too little host CPU), otherwise the free slivers on GPUs
smaller than the shape's per-GPU ask. The expectation over the shape mix is the node's
fragmentation; FGD places a pod where this expectation grows least. Units are milli-GPU (1000 = one
whole card), so cards of different sizes compare by share, as in the study.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MILLI = 1000


@dataclass(frozen=True, slots=True)
class Shape:
    """A typical pod: `count` devices of `gpu_milli` each, plus host CPU; `models` empty = any model."""

    count: int
    gpu_milli: int
    cpu_milli: int = 0
    models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ShapeMix:
    """Shapes with their popularity (weights sum to 1)."""

    shapes: tuple[tuple[Shape, float], ...]

    @staticmethod
    def from_counts(counts: Iterable[tuple[Shape, float]], threshold_pct: float = 60.0, step: int = 10) -> ShapeMix:
        """The study's typical-pod walk (`GetTypicalPods`): most popular shapes first, `step` at a
        time, until they cover `threshold_pct` of all pods; then renormalised. Equal popularity is
        ordered as the study's reversed sort leaves it: larger CPU, then GPU share, count, model first."""
        ordered = sorted(
            ((s, w) for s, w in counts if w > 0),
            key=lambda sw: (sw[1], sw[0].cpu_milli, sw[0].gpu_milli, sw[0].count, sw[0].models),
            reverse=True,
        )
        total = sum(w for _, w in ordered)
        if total <= 0:
            return DEFAULT_MIX
        kept: list[tuple[Shape, float]] = []
        covered = 0.0
        while covered < threshold_pct * total / 100 and len(kept) < len(ordered):
            for shape, weight in ordered[len(kept) : len(kept) + step]:
                kept.append((shape, weight))
                covered += weight
        return ShapeMix(tuple((s, w / covered) for s, w in kept))

    @staticmethod
    def from_shapes(shapes: Iterable[Shape], threshold_pct: float = 60.0, step: int = 10) -> ShapeMix:
        return ShapeMix.from_counts(Counter(shapes).items(), threshold_pct, step)


# When nothing has been seen yet: the openb trace's broad mix (whole cards dominate, then the
# common fractional shares), without host CPU since the webhook does not track it.
DEFAULT_MIX = ShapeMix(
    (
        (Shape(1, 1000), 0.50),
        (Shape(1, 810), 0.13),
        (Shape(1, 470), 0.10),
        (Shape(1, 320), 0.05),
        (Shape(1, 650), 0.04),
        (Shape(1, 230), 0.03),
        (Shape(1, 500), 0.05),
        (Shape(2, 1000), 0.03),
        (Shape(4, 1000), 0.03),
        (Shape(8, 1000), 0.04),
    )
)


def matches(models: tuple[str, ...], model: str) -> bool:
    """Whether a card model is one of `models`: case-insensitive substring, HAMi's nvidia.com/use-gputype
    rule (the gpu-type filter and `shape_frag` both use it)."""
    return any(m.lower() in model.lower() for m in models)


def shape_frag(free: tuple[int, ...], cpu_free: int | None, model: str, shape: Shape) -> int:
    """Milli-GPU of `free` (per-device free milli) that `shape` cannot use on this node."""
    total = sum(free)
    if shape.count == 0 or shape.gpu_milli == 0:
        # A host-only shape can use none of the free GPU share: the study counts all of it (XL/XR).
        return total
    if shape.models and not matches(shape.models, model):
        return total
    if cpu_free is not None and cpu_free < shape.cpu_milli:
        return total
    if sum(1 for f in free if f >= shape.gpu_milli) < shape.count:
        return total
    return sum(f for f in free if f < shape.gpu_milli)


def node_frag(free: tuple[int, ...], cpu_free: int | None, model: str, mix: ShapeMix) -> float:
    """Expected fragmentation (milli-GPU) of a node with per-device `free` milli."""
    if not free or sum(free) == 0:
        return 0.0
    return sum(weight * shape_frag(free, cpu_free, model, shape) for shape, weight in mix.shapes)


def cpu_per_milli(mix: ShapeMix) -> float:
    """Host CPU (milli-cores) the mix's GPU shapes ask per milli-GPU, weighted by demand; 0 when the
    mix carries no CPU (the webhook's mixes), which turns CPU stranding off."""
    gpu = sum(w * s.count * s.gpu_milli for s, w in mix.shapes if s.count and s.gpu_milli)
    cpu = sum(w * s.cpu_milli for s, w in mix.shapes if s.count and s.gpu_milli)
    return cpu / gpu if gpu > 0 else 0.0


def stranded(free_total: int, cpu_free: int | None, per_milli: float) -> float:
    """Milli-GPU of a node's free share that its free host CPU cannot feed at `per_milli` CPU per
    milli-GPU: share no typical pod will use once the CPU is gone (the study's XL/XR case, seen
    before it happens instead of at the cliff where a shape stops fitting)."""
    if cpu_free is None or per_milli <= 0:
        return 0.0
    return max(0.0, free_total - cpu_free / per_milli)


def model_pressure(mix: ShapeMix, gpus_by_model: Mapping[str, int]) -> dict[str, float]:
    """Per card model (lower-cased): how much of its capacity the shapes pinned to it will need,
    relative to its share of the cluster. A pinned shape's demand is spread over the models it
    accepts in proportion to their capacity, so p(m) = Σ (pinned demand share / its models'
    capacity share). 0.3 on T4 says: pods that can run nowhere else expect about 30% of the T4
    cards; a milli taken there by anyone costs that pinned demand 0.3 milli on expectation."""
    total_gpus = sum(gpus_by_model.values())
    demand = sum(w * s.count * s.gpu_milli for s, w in mix.shapes)
    out = dict.fromkeys((m.lower() for m in gpus_by_model), 0.0)
    if total_gpus <= 0 or demand <= 0:
        return out
    for shape, weight in mix.shapes:
        if not shape.models or not shape.count:
            continue
        accepted = [m for m in gpus_by_model if matches(shape.models, m)]
        capacity = sum(gpus_by_model[m] for m in accepted)
        if capacity <= 0:
            continue
        share = weight * shape.count * shape.gpu_milli / demand
        for m in accepted:
            out[m.lower()] += share * total_gpus / capacity
    return out


class FragModel:
    """`node_frag` for one mix, memoised: nodes repeat the same few states, and the scorer asks for
    every candidate device of every candidate node. Bounded; cleared whole when full. Also holds the
    mix's figures `frag` ranks by beyond FGD's Δ (CPU per milli-GPU, model pressure)."""

    __slots__ = ("_cache", "_pressure", "cpu_per_milli", "limit", "mix")

    def __init__(self, mix: ShapeMix, limit: int = 500_000) -> None:
        self.mix = mix
        self.limit = limit
        self._cache: dict[tuple[tuple[int, ...], int | None, str], float] = {}
        self.cpu_per_milli = cpu_per_milli(mix)
        self._pressure: tuple[Mapping[str, int], dict[str, float]] | None = None

    def pressure(self, gpus_by_model: Mapping[str, int]) -> dict[str, float]:
        """`model_pressure` of this mix on a cluster, kept while the caller passes the same mapping."""
        if self._pressure is None or self._pressure[0] is not gpus_by_model:
            self._pressure = (gpus_by_model, model_pressure(self.mix, gpus_by_model))
        return self._pressure[1]

    def frag(self, free: tuple[int, ...], cpu_free: int | None, model: str) -> float:
        key = (tuple(sorted(free)), cpu_free, model)
        value = self._cache.get(key)
        if value is None:
            if len(self._cache) >= self.limit:
                self._cache.clear()
            value = self._cache[key] = node_frag(key[0], cpu_free, model, self.mix)
        return value
