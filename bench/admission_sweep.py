"""Admission cost against cluster size: runs bench/admission.py over sizes and ledgers, plots it.

    python bench/admission_sweep.py --sizes 100,1213,5000,10000 --ledgers memory,redis --seconds 10 \
        --out docs/img/admission.png --json docs/admission.json

Each point is one `bench/admission.py --workload gpu` run (its own webhook and null-handler
processes); the plain-pod run is added once for reference. The figure states the machine, the
command and the date, as the numbers mean nothing without them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_one(workload: str, nodes: int, ledger: str, seconds: float) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "admission.py"),
        "--workload",
        workload,
        "--nodes",
        str(nodes),
        "--ledger",
        ledger,
        "--seconds",
        str(seconds),
        "--json",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def machine() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    system = f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores"
    return f"{system}, {cpu}, Python {platform.python_version()}"


def plot(results: list[dict[str, Any]], out: Path, command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_cpu, ax_lat) = plt.subplots(1, 2, figsize=(11, 4.2))
    for ledger in sorted({r["ledger"] for r in results if r["workload"] == "gpu"}):
        gpu_rows = (r for r in results if r["workload"] == "gpu" and r["ledger"] == ledger)
        rows = sorted(gpu_rows, key=lambda r: r["nodes"])
        nodes = [r["nodes"] for r in rows]
        ax_cpu.plot(nodes, [r["cpu_us_per_admission"] for r in rows], marker="o", label=f"GPU pod, {ledger} ledger")
        ax_lat.plot(nodes, [r["p50_ms"] for r in rows], marker="o", label=f"p50, {ledger}")
        ax_lat.plot(nodes, [r["p99_ms"] for r in rows], marker="x", linestyle="--", label=f"p99, {ledger}")
    null = [r["null"]["cpu_us_per_admission"] for r in results]
    if null:
        ax_cpu.axhline(sum(null) / len(null), color="grey", linestyle=":", label="null handler")
    for ax in (ax_cpu, ax_lat):
        ax.set_xscale("log")
        ax.set_xlabel("simulated GPU nodes (8 GPUs each)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_cpu.set_ylabel("CPU µs per admission (webhook process)")
    ax_lat.set_ylabel("latency ms (HTTPS, closed loop, 32 connections)")
    fig.suptitle("hami-webhook admission cost vs cluster size", fontsize=11)
    fig.text(0.01, 0.01, f"{machine()} · {dt.date.today().isoformat()} · {command}", fontsize=6.5)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1213,5000,10000")
    parser.add_argument("--ledgers", default="memory,redis")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", default="docs/img/admission.png")
    parser.add_argument("--json", dest="json_out", default="")
    args = parser.parse_args(argv)
    command = "python bench/admission_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])
    results = [run_one("plain", 4, "memory", args.seconds)]
    for ledger in args.ledgers.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            result = run_one("gpu", size, ledger, args.seconds)
            results.append(result)
            print(
                json.dumps(
                    {
                        k: result[k]
                        for k in (
                            "workload",
                            "nodes",
                            "ledger",
                            "rps",
                            "p50_ms",
                            "p99_ms",
                            "cpu_us_per_admission",
                            "rss_mb",
                            "ratio",
                        )
                    }
                ),
                flush=True,
            )
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps(
                {"machine": machine(), "date": dt.date.today().isoformat(), "command": command, "results": results},
                indent=1,
            )
        )
    plot(results, ROOT / args.out, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
