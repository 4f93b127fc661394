"""The failure drill end to end (real agents, Redis, Prometheus), with short phases."""

from __future__ import annotations

import shutil

import pytest

from hami.drill import DrillSettings, PhaseStats, render, run_drill

pytestmark = pytest.mark.integration


@pytest.mark.skipif(not shutil.which("redis-server"), reason="redis-server is not installed; CI installs it")
async def test_drill_keeps_answering_through_every_fault_and_each_mode_degrades_as_it_says() -> None:
    results = await run_drill(DrillSettings(phase_s=1.5, rate_per_s=20, prometheus=False))
    by = {(r.phase, r.mode): r for r in results}
    assert all(r.errors == 0 and r.answered > 0 for r in results), render(results)

    down_c, down_a = by[("agent_down", "conservative")], by[("agent_down", "aggressive")]
    victim = next(n for n, f in down_c.freshness.items() if f != "fresh")
    assert down_c.stale_used == 0 and down_c.while_excluded > 0  # conservative: excluded, never used stale
    assert down_a.freshness[victim] == "stale" and down_a.stale_used > 0  # aggressive: last state kept, used
    assert by[("redis_killed", "conservative")].fallback_reserves > 0  # Redis gone: in-process, no errors
    recovery: PhaseStats = by[("recovery", "conservative")]
    assert recovery.admitted > 0 and by[("baseline", "conservative")].breakers.get(victim, "closed") == "closed"
