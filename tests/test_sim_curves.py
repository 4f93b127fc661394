"""Curves of simulated readings: shapes over time and the YAML forms that describe them."""

from __future__ import annotations

import pytest

from hami.node.curves import Ramp, Sine, SpecError, Steps, parse_curve


def test_a_number_is_a_constant() -> None:
    curve = parse_curve(42, "x")
    assert curve.at(0) == curve.at(1e6) == 42.0


def test_sine_peaks_a_quarter_period_in_and_returns_after_a_period() -> None:
    curve = parse_curve({"sine": {"mean": 40, "amplitude": 20, "period_s": 60}}, "x")
    assert curve.at(0) == pytest.approx(40)
    assert curve.at(15) == pytest.approx(60)
    assert curve.at(45) == pytest.approx(20)
    assert curve.at(75) == pytest.approx(curve.at(15))


def test_sine_phase_shifts_the_wave() -> None:
    assert Sine(0, 1, 60, phase_s=15).at(0) == pytest.approx(Sine(0, 1, 60).at(15))


def test_ramp_holds_before_interpolates_during_and_holds_after() -> None:
    curve = parse_curve({"ramp": {"from": 10, "to": 90, "duration_s": 100, "start_s": 50}}, "x")
    assert curve.at(0) == 10
    assert curve.at(100) == pytest.approx(50)
    assert curve.at(500) == 90


def test_repeating_ramp_is_a_saw_tooth() -> None:
    curve = Ramp(start=0, end=100, duration_s=10, repeat=True)
    assert curve.at(5) == pytest.approx(50)
    assert curve.at(15) == pytest.approx(50)


def test_steps_take_the_last_step_reached_and_the_first_before_any() -> None:
    curve = parse_curve({"steps": [[30, 70], [10, 20], [90, 5]]}, "x")  # unsorted on purpose
    assert curve.at(0) == 20
    assert curve.at(10) == 20
    assert curve.at(29.9) == 20
    assert curve.at(30) == 70
    assert curve.at(1000) == 5


def test_steps_repeat() -> None:
    curve = parse_curve({"steps": {"points": [[0, 1], [5, 2]], "repeat_s": 10}}, "x")
    assert isinstance(curve, Steps)
    assert [curve.at(t) for t in (1, 6, 11, 16)] == [1, 2, 1, 2]


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (True, "x"),
        ("hot", "x"),
        ({"sine": {"mean": 1, "amplitude": 1}}, "x.sine.period_s"),
        ({"sine": {"mean": 1, "amplitude": 1, "period_s": 0}}, "x.sine.period_s"),
        ({"ramp": {"from": 1, "duration_s": 5}}, "x.ramp.to"),
        ({"steps": []}, "x.steps"),
        ({"steps": [[1, "a"]]}, "x.steps[0]"),
        ({"wobble": {}}, "wobble"),
        ({"sine": {}, "ramp": {}}, "one-key"),
    ],
)
def test_bad_curves_are_refused_naming_the_place(doc: object, fragment: str) -> None:
    with pytest.raises(SpecError, match=r".*" + fragment.replace("[", r"\[").replace("]", r"\]")):
        parse_curve(doc, "x")
