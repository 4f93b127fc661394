"""Expected fragmentation (frag.py) and the fgd/frag ranking (scorers.py) as the FGD study defines them."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from hami.placement.engine import PlacementSettings, build_index, place
from hami.placement.filters import Device
from hami.placement.frag import (
    FragModel,
    Shape,
    ShapeMix,
    cpu_per_milli,
    model_pressure,
    node_frag,
    shape_frag,
    stranded,
)
from hami.placement.scorers import ScoreContext, fgd_score, frag_cost, frag_rank
from hami.requests import ContainerGpuRequest, GpuRequest
from hami.state.model import Gpu, Node, Snapshot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from openb import TracePod, typical_mix

frees = st.lists(st.integers(0, 1000), min_size=1, max_size=8).map(tuple)


def test_fractional_shape_counts_only_slivers_smaller_than_its_share() -> None:
    assert shape_frag((1000, 190, 500), None, "T4", Shape(1, 470)) == 190
    assert shape_frag((1000, 190, 500), None, "T4", Shape(1, 150)) == 0


def test_shape_that_cannot_land_counts_all_free_share() -> None:
    free = (1000, 190, 500)
    assert shape_frag(free, None, "T4", Shape(2, 1000)) == 1690  # one whole card only
    assert shape_frag(free, None, "T4", Shape(1, 470, models=("V100M32",))) == 1690  # wrong model
    assert shape_frag(free, 1000, "T4", Shape(1, 470, cpu_milli=4000)) == 1690  # host CPU short


def test_host_only_shape_counts_all_free_share_as_the_study_does() -> None:
    assert shape_frag((1000, 300), 64000, "T4", Shape(0, 0, cpu_milli=2000)) == 1300


@given(frees)
def test_node_frag_is_between_zero_and_the_free_share(free: tuple[int, ...]) -> None:
    mix = ShapeMix(((Shape(1, 500), 0.5), (Shape(2, 1000), 0.3), (Shape(0, 0, 1000), 0.2)))
    assert 0.0 <= node_frag(free, None, "G2", mix) <= sum(free) + 1e-9


@given(frees)
def test_memo_answers_as_the_plain_function(free: tuple[int, ...]) -> None:
    mix = ShapeMix(((Shape(1, 320), 0.6), (Shape(1, 810), 0.4)))
    model = FragModel(mix, limit=4)
    assert model.frag(free, None, "G2") == node_frag(tuple(sorted(free)), None, "G2", mix)
    assert model.frag(tuple(reversed(free)), None, "G2") == model.frag(free, None, "G2")


def test_typical_walk_cuts_at_threshold_and_renormalises() -> None:
    counts = [(Shape(1, 1000), 50.0), (Shape(1, 500), 30.0), (Shape(1, 250), 15.0), (Shape(1, 100), 5.0)]
    mix = ShapeMix.from_counts(counts, threshold_pct=80.0, step=1)
    assert [s for s, _ in mix.shapes] == [Shape(1, 1000), Shape(1, 500)]
    assert abs(sum(w for _, w in mix.shapes) - 1.0) < 1e-9
    wider = ShapeMix.from_counts(counts, threshold_pct=80.0, step=10)  # a step takes shapes ten at a time
    assert len(wider.shapes) == 4


def test_equal_popularity_puts_the_larger_cpu_shape_first() -> None:
    mix = ShapeMix.from_counts([(Shape(1, 500, 1000), 1.0), (Shape(1, 500, 8000), 1.0)], 40.0, 1)
    assert mix.shapes[0][0].cpu_milli == 8000


def test_typical_mix_takes_host_only_pods_unless_told_not_to() -> None:
    pods = [TracePod(f"p{i}", 1000, 0, 0, 0, ()) for i in range(5)] + [
        TracePod(f"g{i}", 4000, 0, 1, 500, ()) for i in range(5)
    ]
    assert any(s.count == 0 for s, _ in typical_mix(pods, 100.0).shapes)
    assert all(s.count == 1 for s, _ in typical_mix(pods, 100.0, cpu_pods=False).shapes)


@given(st.floats(-5000, 5000), st.floats(-5000, 5000))
def test_fgd_score_is_an_integer_that_never_rewards_more_fragmentation(a: float, b: float) -> None:
    assert fgd_score(a) == int(fgd_score(a))
    assert 0 <= fgd_score(a) <= 100
    if a <= b:
        assert fgd_score(a) >= fgd_score(b)


def devices(*free: int) -> list[Device]:
    return [
        Device(i, Gpu(f"g{i}", i, "G2", 1000), f, 100, 0 if f == 1000 else 1, frozenset()) for i, f in enumerate(free)
    ]


def test_fgd_leaves_equal_integer_scores_to_the_node_order() -> None:
    # Δ of 0 and -10 milli both score 50: the study ranks them alike, whatever the node's state.
    assert fgd_score(0) == fgd_score(-10) == 50
    assert frag_rank("fgd", 0.0, devices(1000, 1000)) == frag_rank("fgd", -10.0, devices(1000, 190))
    assert frag_rank("fgd", -500.0, devices(1000)) > frag_rank("fgd", 500.0, devices(1000))


def test_frag_prefers_a_node_in_use_only_among_equal_integer_scores() -> None:
    empty, used = devices(1000, 1000), devices(1000, 190)
    assert frag_rank("frag", 0.0, used) > frag_rank("frag", -10.0, empty)
    assert frag_rank("frag", -200.0, empty) > frag_rank("frag", 0.0, used)  # a better score still wins


def test_stranded_share_is_the_free_gpu_the_free_cpu_cannot_feed() -> None:
    mix = ShapeMix(((Shape(1, 1000, 10_000), 0.5), (Shape(1, 500, 10_000), 0.25), (Shape(0, 0, 8000), 0.25)))
    per_milli = cpu_per_milli(mix)  # host-only shapes ask no GPU: (0.5·10000 + 0.25·10000) / (0.5·1000 + 0.25·500)
    assert abs(per_milli - 12.0) < 1e-9
    assert stranded(2000, 30_000, 10.0) == 0.0  # 30 cores feed 3000 milli
    assert stranded(2000, 5000, 10.0) == 1500.0
    assert stranded(2000, None, 10.0) == stranded(2000, 5000, 0.0) == 0.0  # no CPU figures: off
    assert cpu_per_milli(ShapeMix(((Shape(1, 500), 1.0),))) == 0.0  # the webhook's mixes carry no CPU


def test_model_pressure_is_pinned_demand_over_the_models_capacity_share() -> None:
    mix = ShapeMix(((Shape(1, 1000), 0.7), (Shape(1, 1000, models=("T4",)), 0.2), (Shape(1, 500, models=("P",)), 0.1)))
    p = model_pressure(mix, {"T4": 25, "G2": 50, "P100": 25})
    demand = 0.7 * 1000 + 0.2 * 1000 + 0.1 * 500
    assert abs(p["t4"] - (200 / demand) / 0.25) < 1e-9  # 21% of the demand on 25% of the cards
    assert abs(p["p100"] - (50 / demand) / 0.25) < 1e-9
    assert p["g2"] == 0.0


def ctx(mix: ShapeMix, cards: dict[str, int]) -> ScoreContext:
    return ScoreContext(1, 0, 8, FragModel(mix), cards)


def test_frag_cost_counts_new_stranding_only() -> None:
    sctx = ctx(ShapeMix(((Shape(1, 1000, 10_000), 1.0),)), {"G2": 8})  # 10 CPU per milli-GPU
    assert frag_cost(sctx, "G2", 8000, 8000, 80_000, 64_000) == 1600.0  # a 16-core host-only pod
    assert frag_cost(sctx, "G2", 0, 0, 80_000, 64_000) == 0.0  # no free GPU left to strand
    # A whole card with 5 cores un-strands 500 milli: no credit (it would lure pods to open such nodes).
    assert frag_cost(sctx, "G2", 8000, 7000, 75_000, 70_000) == 0.0


def test_frag_rank_adds_the_cost_to_the_delta_and_fgd_ignores_it() -> None:
    used = devices(1000, 190)
    assert frag_rank("frag", 0.0, used, 800.0)[0] == fgd_score(800.0) + 0.5
    assert frag_rank("fgd", 0.0, used, 800.0) == frag_rank("fgd", 0.0, used)


def host(name: str, model: str, cards: int, cpu: int, used: int = 0) -> Node:
    gpus = tuple(
        Gpu(f"{name}-{i}", i, model, 1000, memory_promised_mib=1000 if i < used else 0, pods=int(i < used))
        for i in range(cards)
    )
    return Node(name, gpus, cpu_milli_free=cpu, memory_mib_free=10**6)


def first_choice(policy: str, nodes: list[Node], mix: ShapeMix, request: GpuRequest) -> str | None:
    settings = PlacementSettings(default_policy=policy, max_pods_per_gpu=10**6)
    return place(request, build_index(Snapshot(tuple(nodes)), settings, mix), {}, settings).node


def test_frag_sends_a_cpu_pod_where_it_strands_no_gpu_and_fgd_does_not() -> None:
    """Both nodes in use and every shape still fits after the pod: FGD's Δ is 0 on both, so its
    node order picks a-tight, whose 80 cores feed its 6 free cards at the mix's 10 cores a card
    but 48 would feed only 4.8. frag counts those 1.2 cards stranded and takes b-full, whose cards
    are all taken anyway."""
    mix = ShapeMix(((Shape(1, 1000, 10_000), 0.8), (Shape(0, 0, 32_000), 0.2)))
    nodes = [host("a-tight", "G2", 8, 80_000, used=2), host("b-full", "T4", 2, 64_000, used=2)]
    cpu_pod = GpuRequest(containers=(), cpu_milli=32_000)
    assert first_choice("fgd", nodes, mix, cpu_pod) == "a-tight"
    assert first_choice("frag", nodes, mix, cpu_pod) == "b-full"


def test_frag_keeps_a_pinned_model_for_its_pinned_pods_and_fgd_does_not() -> None:
    """Pods pinned to T4 are rare in the mix (FGD's Δ for leaving a G2 node is too small to change
    its integer score), but T4 is a quarter of the cards: an unpinned pod costs them 0.08 milli per
    milli it takes there, enough for frag to take the G2 card."""
    mix = ShapeMix(((Shape(1, 1000), 0.98), (Shape(1, 1000, models=("T4",)), 0.02)))
    nodes = [host("a-t4", "T4", 2, 10**6), host("b-g2", "G2", 6, 10**6)]
    pod = GpuRequest(containers=(ContainerGpuRequest("c", "containers", 0, 1, memory_mib=1000),))
    assert first_choice("fgd", nodes, mix, pod) == "a-t4"
    assert first_choice("frag", nodes, mix, pod) == "b-g2"
