"""Faults a simulated node can suffer: scheduled in its YAML, or switched at run time over HTTP.

The failure drills inject faults into a running agent (``POST /faults``) without restarting it,
so the state here is the one mutable thing about a simulated node. Everything else is derived
from the simulated time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from hami.node.curves import SpecError

# NVML calls a fault can make fail with "Not Supported" (field absent, recorded in `errors`).
FIELD_CALLS = ("utilisation", "temperature", "power", "ecc", "processes")


@dataclass(frozen=True, slots=True)
class Faults:
    slow_s: float = 0.0  # every read takes this much longer
    hang: bool = False  # reads never finish until the fault is cleared
    nvml_error: bool = False  # the whole read fails (BackendError)
    unsupported: tuple[str, ...] = ()  # these calls fail: the fields are absent and listed in `errors`
    ecc_corrected: int = 0  # added to the volatile and aggregate corrected counters
    ecc_uncorrected: int = 0  # added to the volatile and aggregate uncorrected counters
    temp_spike_c: float = 0.0  # added to the temperature
    gpu: int = -1  # index of the card the ECC/temperature faults hit; -1: every card

    def hits(self, index: int) -> bool:
        return self.gpu < 0 or self.gpu == index

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


NO_FAULTS = Faults()
_NAMES = tuple(f.name for f in fields(Faults))


def parse_faults(doc: Mapping[str, Any], where: str, base: Faults = NO_FAULTS) -> Faults:
    """`base` with the keys of `doc` replaced; unknown keys and wrong types raise SpecError."""
    changes: dict[str, Any] = {}
    for key, value in doc.items():
        if key in ("slow_s", "temp_spike_c"):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise SpecError(f"{where}.{key} must be a number >= 0, got {value!r}")
            changes[key] = float(value)
        elif key in ("hang", "nvml_error"):
            if not isinstance(value, bool):
                raise SpecError(f"{where}.{key} must be true or false, got {value!r}")
            changes[key] = value
        elif key in ("ecc_corrected", "ecc_uncorrected", "gpu"):
            if isinstance(value, bool) or not isinstance(value, int) or value < (-1 if key == "gpu" else 0):
                raise SpecError(f"{where}.{key} must be a whole number >= 0, got {value!r}")
            changes[key] = value
        elif key == "unsupported":
            calls = [value] if isinstance(value, str) else value
            if not isinstance(calls, list | tuple) or any(c not in FIELD_CALLS for c in calls):
                raise SpecError(f"{where}.unsupported must list some of {', '.join(FIELD_CALLS)}, got {value!r}")
            changes[key] = tuple(calls)
        else:
            raise SpecError(f"{where}: unknown fault {key!r} (known: {', '.join(_NAMES)}, clear)")
    return replace(base, **changes)


@dataclass(frozen=True, slots=True)
class ScheduledFault:
    """A fault from the simulation file, active on [at_s, until_s) of simulated time."""

    at_s: float
    until_s: float
    faults: Faults


def parse_scheduled(doc: Any, where: str) -> ScheduledFault:
    if not isinstance(doc, Mapping):
        raise SpecError(f"{where} must be a mapping, got {doc!r}")
    body = dict(doc)
    window: list[float] = []
    for key, default in (("at_s", 0.0), ("until_s", math.inf)):
        value = body.pop(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(f"{where}.{key} must be a number, got {value!r}")
        window.append(float(value))
    return ScheduledFault(at_s=window[0], until_s=window[1], faults=parse_faults(body, where))


class FaultState:
    """One node's faults: the scheduled ones plus the runtime overlay the drills switch."""

    __slots__ = ("runtime", "scheduled")

    def __init__(self, scheduled: tuple[ScheduledFault, ...] = ()) -> None:
        self.scheduled = scheduled
        self.runtime = NO_FAULTS

    def apply(self, doc: Mapping[str, Any]) -> Faults:
        """Apply a POST /faults body: `clear` first (when true), then each key replaces the current value."""
        body = dict(doc)
        clear = body.pop("clear", False)
        if not isinstance(clear, bool):
            raise SpecError(f"faults.clear must be true or false, got {clear!r}")
        self.runtime = parse_faults(body, "faults", NO_FAULTS if clear else self.runtime)
        return self.runtime

    def active(self, t: float) -> tuple[Faults, ...]:
        found = tuple(s.faults for s in self.scheduled if s.at_s <= t < s.until_s)
        return (*found, self.runtime) if self.runtime != NO_FAULTS else found
