"""The failure drill end to end (real agents, Redis, the real decision path), with short phases."""

from __future__ import annotations

import shutil

import pytest

from hami.drill import CONSERVATIVE, PHASES, DrillSettings, render, run_drill

pytestmark = pytest.mark.integration


@pytest.mark.skipif(not shutil.which("redis-server"), reason="redis-server is not installed; CI installs it")
async def test_real_decisions_keep_answering_through_every_fault_and_each_mode_degrades_as_it_says() -> None:
    # 2 s phases: at a 0.5 s refresh the killed agent's breaker (fail_max 3) has opened by the phase's end.
    results = await run_drill(DrillSettings(phase_s=2.0, rate_per_s=20, prometheus=False))
    table = render(results)
    by = {(r.phase, r.mode): r for r in results}
    assert {phase for phase, _ in by} == set(PHASES)
    assert all(r.errors == 0 and r.answered > 0 for r in results), table
    assert all(r.admitted > 0 for r in results), table  # the fault hits one node; the others keep serving

    down_c, down_a = by[("agent_down", "conservative")], by[("agent_down", "aggressive")]
    victim = next(n for n, f in down_c.freshness.items() if f != "fresh")
    assert down_c.breakers[victim] == "open" and down_a.breakers[victim] == "open", table
    # Only the aggressive mode ever places on a node it cannot see, and it does when that node is asked for.
    assert all(r.stale_used == 0 for r in results if r.mode == CONSERVATIVE), table
    assert down_a.freshness[victim] == "stale" and down_a.stale_used > 0, table
    assert by[("baseline", "aggressive")].stale_used == 0, table
    assert down_c.while_excluded > 0 and down_c.denied > 0, table  # pods pinned to the excluded node are refused

    assert by[("redis_killed", "conservative")].fallback_reserves > 0, table  # Redis gone: in-process, no errors
    assert by[("baseline", "conservative")].breakers.get(victim, "closed") == "closed", table
