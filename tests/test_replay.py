"""The openb trace replay keeps working (quick mode; no timing assertions)."""

from __future__ import annotations

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
            "bestfit,frag,random",
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
    assert set(report["policies"]) == {"bestfit", "frag", "random"}
    for row in report["policies"].values():
        assert 0.0 <= row["unallocated_min"] <= row["unallocated_at_100"] <= row["unallocated_max"] <= 100.0
        assert row["seeds"] == 1
