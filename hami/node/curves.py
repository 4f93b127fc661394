"""Values that change over simulated time: constants, sines, ramps and steps.

A simulated card's utilisation or temperature is described in YAML either as a number or as a
one-key mapping naming the shape, e.g. ``{sine: {mean: 40, amplitude: 20, period_s: 60}}``.
Every curve is a pure function of the simulated time ``t`` (seconds since the simulation
started), so a fleet replays identically from the same seed and the same clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class SpecError(ValueError):
    """A simulation file that cannot be read; the message names the offending path."""


class Curve(Protocol):
    def at(self, t: float) -> float: ...


@dataclass(frozen=True, slots=True)
class Constant:
    value: float

    def at(self, t: float) -> float:
        return self.value


@dataclass(frozen=True, slots=True)
class Sine:
    mean: float
    amplitude: float
    period_s: float
    phase_s: float = 0.0  # shifts the wave, so identical cards need not peak together

    def at(self, t: float) -> float:
        return self.mean + self.amplitude * math.sin(2.0 * math.pi * (t + self.phase_s) / self.period_s)


@dataclass(frozen=True, slots=True)
class Ramp:
    """Linear from `start` to `end` over `duration_s`, beginning at `start_s`; holds `end` afterwards
    unless `repeat` (a saw-tooth, e.g. a memory leak that a restart clears)."""

    start: float
    end: float
    duration_s: float
    start_s: float = 0.0
    repeat: bool = False

    def at(self, t: float) -> float:
        elapsed = t - self.start_s
        if elapsed <= 0:
            return self.start
        if self.repeat:
            elapsed = math.fmod(elapsed, self.duration_s)
        elif elapsed >= self.duration_s:
            return self.end
        return self.start + (self.end - self.start) * elapsed / self.duration_s


@dataclass(frozen=True, slots=True)
class Steps:
    """Piecewise constant: the value of the last step whose time has come (the first before any).
    With `repeat_s` > 0 the pattern starts over every `repeat_s` seconds."""

    points: tuple[tuple[float, float], ...]  # (at_s, value), sorted by at_s
    repeat_s: float = 0.0

    def at(self, t: float) -> float:
        if self.repeat_s > 0:
            t = math.fmod(t, self.repeat_s)
        value = self.points[0][1]
        for at_s, step_value in self.points:
            if at_s > t:
                break
            value = step_value
        return value


def _number(doc: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{where}.{key} must be a number, got {value!r}")
    return float(value)


def _positive(doc: Mapping[str, Any], key: str, where: str) -> float:
    value = _number(doc, key, where)
    if value <= 0:
        raise SpecError(f"{where}.{key} must be > 0, got {value}")
    return value


def _steps(doc: Any, where: str) -> Steps:
    # Either a bare list of [at_s, value] pairs, or {points: [...], repeat_s: N}.
    repeat_s = 0.0
    if isinstance(doc, Mapping):
        repeat_s = _number(doc, "repeat_s", where, 0.0)
        doc = doc.get("points")
    if not isinstance(doc, list) or not doc:
        raise SpecError(f"{where} must be a non-empty list of [at_s, value] pairs")
    points: list[tuple[float, float]] = []
    for i, pair in enumerate(doc):
        if not (isinstance(pair, list | tuple) and len(pair) == 2):
            raise SpecError(f"{where}[{i}] must be an [at_s, value] pair, got {pair!r}")
        at_s, value = pair
        if isinstance(at_s, bool) or isinstance(value, bool):
            raise SpecError(f"{where}[{i}] must hold numbers, got {pair!r}")
        if not isinstance(at_s, int | float) or not isinstance(value, int | float):
            raise SpecError(f"{where}[{i}] must hold numbers, got {pair!r}")
        points.append((float(at_s), float(value)))
    return Steps(points=tuple(sorted(points)), repeat_s=repeat_s)


def parse_curve(doc: Any, where: str) -> Curve:
    """Read one curve from its YAML form. Raises SpecError naming `where` on anything odd."""
    if isinstance(doc, bool):
        raise SpecError(f"{where} must be a number or a curve, got {doc!r}")
    if isinstance(doc, int | float):
        return Constant(float(doc))
    if not isinstance(doc, Mapping) or len(doc) != 1:
        raise SpecError(f"{where} must be a number or a one-key mapping (sine, ramp, steps), got {doc!r}")
    ((kind, body),) = doc.items()
    at = f"{where}.{kind}"
    if kind == "steps":
        return _steps(body, at)
    if not isinstance(body, Mapping):
        raise SpecError(f"{at} must be a mapping, got {body!r}")
    if kind == "sine":
        return Sine(
            mean=_number(body, "mean", at),
            amplitude=_number(body, "amplitude", at),
            period_s=_positive(body, "period_s", at),
            phase_s=_number(body, "phase_s", at, 0.0),
        )
    if kind == "ramp":
        return Ramp(
            start=_number(body, "from", at),
            end=_number(body, "to", at),
            duration_s=_positive(body, "duration_s", at),
            start_s=_number(body, "start_s", at, 0.0),
            repeat=bool(body.get("repeat", False)),
        )
    raise SpecError(f"{where}: unknown curve {kind!r} (expected sine, ramp or steps)")
