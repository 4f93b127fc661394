"""The openb trace replay keeps working (quick mode; no timing assertions)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "openb"


@pytest.mark.skipif(not DATA.is_dir(), reason="openb trace not present")
@pytest.mark.parametrize("pods", ["openb_pod_list_default.csv", "openb_pod_list_multigpu30.csv"])
def test_quick_replay_prints_one_valid_json_object(pods: str) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "replay.py"),
            "--trace-dir",
            str(DATA),
            "--pods",
            pods,
            "--quick",
            "--policies",
            "bestfit,fgd,frag,random",
            "--workers",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    report = json.loads(out.stdout)
    assert set(report["policies"]) == {"bestfit", "fgd", "frag", "random"}
    assert report["machine"] and report["date"] and "--quick" in report["command"]
    for row in report["policies"].values():
        assert 0.0 <= row["unallocated_min"] <= row["unallocated_at_100"] <= row["unallocated_max"] <= 100.0
        assert row["seeds"] == 1
        curve = row["curve"]  # allocation never shrinks: deletions are ignored
        assert curve and all(0.0 <= a <= b <= 100.0 for a, b in itertools.pairwise(curve))


def test_arrivals_shuffle_every_pod_then_resample_to_130_percent() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from openb import TracePod
    from replay import INFLATION, arrivals

    pods = [TracePod(f"p{i}", 1000, 0, 1, 100 * (1 + i % 10), ()) for i in range(50)]
    capacity = sum(p.gpu_demand_milli for p in pods)
    order = arrivals(pods, capacity, seed=3)
    assert sorted(p.name for p in order[: len(pods)]) == sorted(p.name for p in pods)
    assert sum(p.gpu_demand_milli for p in order) >= INFLATION * capacity
    assert sum(p.gpu_demand_milli for p in order[:-1]) < INFLATION * capacity  # no more than needed
    assert order == arrivals(pods, capacity, seed=3)
