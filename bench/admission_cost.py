"""What one GPU admission's own work costs, counted instead of timed: Python bytecodes per
admission, by function, and (under valgrind, when it is installed) machine instructions.

This machine's clock drifts: the null handler's throughput moves by 2x within seconds, so a change
of 5% in the webhook's own work is invisible in req/s short of hundreds of paired rounds. A count is
repeatable: the same code counts the same to within a tenth of a percent (the one thing that follows
the clock is the decision line's timestamp, whose date part is formatted again each second), so
two commits can be compared in one run each. What it measures is the handler's path without aiohttp and TLS
(the null handler pays those too): `decode_review`, `Decider.decide` with its reservation,
`encode_review`, the request metrics and the decision log line, for `--admissions` GPU pods (the
8 GiB slice of bench/admission.py) on the same simulated fleet of `--nodes` nodes.

The state is made deterministic: reservations do not expire and the collector does not sweep
during the count (both follow the wall clock, which valgrind slows 50-fold), so each admission
lands on a fleet filling up exactly as in the run before. Bytecodes are counted with sys.settrace's
opcode events; instructions with callgrind, collecting only inside the counted loop (it runs under
functools.reduce, whose C function is the collection toggle). Counts are not time: an instruction
count misses cache effects, a bytecode count also what each bytecode costs in C.

python bench/admission_cost.py [--nodes 1213] [--admissions 300] [--top 25] [--instructions] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.admission import review_body  # noqa: E402
from bench.cluster import write_bench_config  # noqa: E402
from hami import config as config_mod  # noqa: E402
from hami.admission import decode_review, encode_review  # noqa: E402
from hami.decide import Decider  # noqa: E402
from hami.observability import ADMISSIONS, configure_logging  # noqa: E402
from hami.runtime import Runtime  # noqa: E402

NEVER_S = 1e9  # reservations never expire, the collector never sweeps, the overlay is never re-synced
WARMUP = 300  # admissions before counting: caches, memos and the index's lists settle


def deterministic_config(nodes: int, tmp: Path) -> Path:
    args = argparse.Namespace(workload="gpu", nodes=nodes, refresh_s=NEVER_S)
    path = write_bench_config(args, tmp, port=0)
    doc = yaml.safe_load(path.read_text())
    doc["state"]["ledger"]["ttl_s"] = NEVER_S
    doc.setdefault("placement", {})["overlay_sync_s"] = NEVER_S
    path.write_text(yaml.safe_dump(doc))
    return path


def admission_loop(decider: Decider, bodies: list[bytes]) -> Callable[[], str]:
    """One call runs every body through the handler's steps; returns the last result."""

    def run() -> str:
        result = ""
        for body in bodies:
            review = decode_review(body)
            coroutine = decider.decide(review, "mutate")
            try:
                coroutine.send(None)  # the in-process ledger never suspends: decide runs to its end
            except StopIteration as stop:
                outcome = stop.value
            else:
                coroutine.close()
                raise RuntimeError("decide() suspended: the count needs the in-process ledger")
            encode_review(review.api_version, review.uid, outcome.verdict, with_patch=True)
            ADMISSIONS.observe("mutate", review.operation, review.kind, outcome.result, 0.001)
            decider.log_decision(review, "mutate", outcome, 0.001)
            result = outcome.result
        return result

    return run


def count_bytecodes(run: Callable[[], str]) -> tuple[collections.Counter[tuple[str, str, int]], int, str]:
    """(bytecodes per function, Python calls, last result) of one run, traced."""
    counts: collections.Counter[tuple[str, str, int]] = collections.Counter()
    calls = 0

    def tracer(frame: FrameType, event: str, _: Any) -> Any:
        nonlocal calls
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[(code.co_filename, code.co_name, code.co_firstlineno)] += 1
        elif event == "call":
            calls += 1
        return tracer

    sys.settrace(tracer)
    try:
        last = run()
    finally:
        sys.settrace(None)
    return counts, calls, last


def _short(filename: str) -> str:
    for prefix in (str(ROOT) + os.sep, sys.prefix + os.sep, sys.base_prefix + os.sep):
        if filename.startswith(prefix):
            return filename[len(prefix) :]
    return filename


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hami-cost-") as tmp:
        config = config_mod.load(str(deterministic_config(args.nodes, Path(tmp))))
        runtime = Runtime(config, "", {})
        indexed = asyncio.Event()
        runtime.on_index_updated.append(indexed.set)
        await runtime.start()
        try:
            if runtime.placement_index.snapshot.version == 0:  # the index follows the first snapshot
                async with asyncio.timeout(600):
                    await indexed.wait()
            decider = Decider(runtime)
            template = review_body("gpu", "mutate")
            n = args.admissions
            bodies = [template.replace(b"__UID__", f"cost-{i}".encode()) for i in range(WARMUP + 2 * n)]
            admission_loop(decider, bodies[:WARMUP])()
            counted = admission_loop(decider, bodies[WARMUP : WARMUP + n])
            if args.under_valgrind:  # the parent counts instructions: collection runs inside reduce() only
                return {"last_result": functools.reduce(lambda _, __: counted(), [0], "")}
            counts, calls, last = count_bytecodes(counted)
            # Timed on the next admissions (informative only: it drifts with the machine).
            started = time.process_time()
            admission_loop(decider, bodies[WARMUP + n :])()
            cpu = time.process_time() - started
            return _report(args, counts, calls, last, cpu)
        finally:
            await runtime.stop()


def _report(
    args: argparse.Namespace,
    counts: collections.Counter[tuple[str, str, int]],
    calls: int,
    last: str,
    cpu_s: float | None,
) -> dict[str, Any]:
    n = args.admissions
    total = sum(counts.values())
    return {
        "nodes": args.nodes,
        "admissions": n,
        "last_result": last,
        "bytecodes_per_admission": round(total / n, 1) if total else None,
        "python_calls_per_admission": round(calls / n, 1) if calls else None,
        "cpu_us_per_admission": round(cpu_s / n * 1e6, 1) if cpu_s is not None else None,
        "top": [
            {"function": f"{_short(f)}:{line} {name}", "bytecodes_per_admission": round(c / n, 1)}
            for (f, name, line), c in counts.most_common(args.top)
        ],
    }


def instructions_per_admission(args: argparse.Namespace) -> float:
    """Machine instructions per admission, counted by callgrind inside the loop only."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    command = [
        valgrind,
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        "--collect-atstart=no",
        "--toggle-collect=functools_reduce",
        sys.executable,
        __file__,
        "--nodes",
        str(args.nodes),
        "--admissions",
        str(args.admissions),
        "--under-valgrind",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : ([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"valgrind failed:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", "")) / args.admissions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1213, help="simulated fleet size (8 GPUs per node)")
    parser.add_argument("--admissions", type=int, default=300, help="GPU admissions counted (after 300 warm-up)")
    parser.add_argument("--top", type=int, default=25, help="functions listed, most bytecodes first")
    parser.add_argument("--instructions", action="store_true", help="also count instructions under valgrind")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--under-valgrind", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    real_stdout = sys.stdout
    with open(os.devnull, "w") as sink:
        sys.stdout = sink  # the decision lines are rendered (their cost counts) but not shown
        try:
            configure_logging("info", "json")
            report = asyncio.run(measure(args))
        finally:
            sys.stdout = real_stdout
    if args.under_valgrind:
        return
    if args.instructions:
        report["instructions_per_admission"] = round(instructions_per_admission(args))
    if args.json:
        print(json.dumps(report))
        return
    print(f"{args.admissions} GPU admissions at {args.nodes} nodes (last: {report['last_result']})")
    print(f"  bytecodes per admission:    {report['bytecodes_per_admission']:,.0f}")
    print(f"  Python calls per admission: {report['python_calls_per_admission']:,.0f}")
    if report.get("cpu_us_per_admission") is not None:
        print(f"  CPU per admission (timed, drifts with the machine): {report['cpu_us_per_admission']:.0f} us")
    if "instructions_per_admission" in report:
        print(f"  instructions per admission (callgrind): {report['instructions_per_admission']:,}")
    for row in report["top"]:
        print(f"  {row['bytecodes_per_admission']:8.1f}  {row['function']}")


if __name__ == "__main__":
    main()
