"""The agent's health verdict for one GPU: a pure function of what was read, shared by both backends."""

from __future__ import annotations

from dataclasses import dataclass

from hami.node.schema import EccCounts


@dataclass(frozen=True, slots=True)
class HealthSettings:
    hot_c: float = 90.0  # at or above this GPU temperature (°C) a card is reported unhealthy
    max_volatile_uncorrected: int = 0  # more uncorrected ECC errors since boot than this: unhealthy


def verdict(
    *,
    ecc: EccCounts | None,
    temperature_c: float | None,
    memory_readable: bool,
    settings: HealthSettings = HealthSettings(),
) -> tuple[bool, str]:
    """(healthy, reason). The first failing rule wins; the reason is short and meant for humans."""
    if not memory_readable:
        return False, "memory info unreadable"
    if ecc is not None and ecc.volatile_uncorrected > settings.max_volatile_uncorrected:
        return False, f"{ecc.volatile_uncorrected} uncorrected ECC errors since boot"
    if temperature_c is not None and temperature_c >= settings.hot_c:
        return False, f"temperature {temperature_c:.0f} C >= {settings.hot_c:.0f} C"
    return True, ""
