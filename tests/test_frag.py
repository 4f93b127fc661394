"""Expected fragmentation (frag.py) and the fgd/frag ranking (scorers.py) as the FGD study defines them."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from hami.placement.filters import Device
from hami.placement.frag import FragModel, Shape, ShapeMix, node_frag, shape_frag
from hami.placement.scorers import fgd_score, frag_rank
from hami.state.model import Gpu

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
