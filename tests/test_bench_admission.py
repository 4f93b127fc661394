"""The admission benchmark's quick mode keeps working (figures are printed, never asserted)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_bench(*args: str) -> dict[str, Any]:
    """bench/admission.py in quick mode (aiohttp load generator, 4 connections, no warm-up)."""
    command = [sys.executable, str(ROOT / "bench" / "admission.py"), "--warmup", "0", "--concurrency", "4"]
    result = subprocess.run(
        [*command, "--no-wrk", "--json", *args], capture_output=True, text=True, cwd=ROOT, timeout=180
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.parametrize(("workload", "ledger"), [("plain", "memory"), ("gpu", "memory"), ("gpu", "redis")])
def test_admission_bench_quick_mode_prints_its_figures(workload: str, ledger: str) -> None:
    report = run_bench(
        "--workload", workload, "--nodes", "300", "--seconds", "1", "--idle-s", "0.5", "--ledger", ledger
    )
    for key in ("rps", "p50_ms", "p99_ms", "cpu_us_per_admission", "rss_mb", "ratio", "null"):
        assert key in report
    assert report["errors"] == 0, report
    assert report["rps"] > 0 and report["null"]["rps"] > 0, report
    if workload == "gpu":
        # The GPU pods were really placed (300 nodes hold 12,000 such 8Gi/20% slices: more than a 1 s run uses).
        assert report["answers"].get("patched", 0) > 0, report
        results = report["ledger_results"]
        assert results.get("ok", 0) > 0 and not any(k.startswith("fallback") for k in results), report
    else:
        assert report["answers"] == {"allowed": 20}, report


def test_paired_mode_loads_both_servers_in_turn_and_reports_an_interval() -> None:
    report = run_bench("--workload", "plain", "--paired", "--repeat", "3", "--seconds", "0.5")
    assert report["mode"] == "paired" and len(report["rounds"]) == 3, report
    assert all(r["rps"] > 0 and r["null_rps"] > 0 for r in report["rounds"]), report
    low, high = report["ratio_ci95"]
    assert low <= report["ratio"] <= high, report
    assert report["errors"] == 0 and report["null"]["errors"] == 0, report
    assert report["answers"] == {"allowed": 20}, report  # the webhook was resumed after its last window


def test_bootstrap_interval_brackets_the_median_and_is_reproducible() -> None:
    sys.path.insert(0, str(ROOT))
    from bench.admission import bootstrap_median_ci

    values = [0.5, 0.6, 0.7, 0.72, 0.75, 0.8, 0.9, 1.1]
    low, high = bootstrap_median_ci(values)
    assert min(values) <= low <= 0.735 <= high <= max(values)
    assert bootstrap_median_ci(values) == (low, high)  # seeded
    assert bootstrap_median_ci([0.7] * 5) == (0.7, 0.7)


def run_cost(*args: str) -> dict[str, Any]:
    command = [sys.executable, str(ROOT / "bench" / "admission_cost.py"), "--nodes", "40", "--json", *args]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def test_admission_cost_counts_the_same_for_the_same_code() -> None:
    """The point of counting: two runs of unchanged code agree, so small changes show. Not to the
    last bytecode: the decision line's timestamp formats its date part again whenever the clock
    crosses a second (hami/observability.py: iso_utc), some 20 bytecodes each time."""
    first = run_cost("--admissions", "30", "--top", "5")
    assert first["last_result"] == "patched", first  # the pods were placed, not denied
    assert first["bytecodes_per_admission"] > 1000 and first["python_calls_per_admission"] > 10, first
    assert len(first["top"]) == 5 and first["top"][0]["bytecodes_per_admission"] > 0, first
    second = run_cost("--admissions", "30", "--top", "5")
    drift = abs(second["bytecodes_per_admission"] - first["bytecodes_per_admission"])
    assert drift <= 0.0005 * first["bytecodes_per_admission"], (first, second)


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_admission_cost_counts_instructions_under_valgrind() -> None:
    report = run_cost("--admissions", "20", "--instructions")
    assert report["instructions_per_admission"] > report["bytecodes_per_admission"] > 0, report
