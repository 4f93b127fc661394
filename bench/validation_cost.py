"""Validation cost per request: the decision code's validation step over the manifest corpus.

    python bench/validation_cost.py [--repeat 2000]

Times `hami.validation.validate` (what both endpoints run on every object) for each manifest of
tests/corpus, in-process, and prints the median and the slowest kinds. The end-to-end cost of an
admission (TLS, HTTP, JSON, log line) is bench/admission.py's job; this isolates the rules.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hami.validation import ValidationContext, ValidationSettings, validate  # noqa: E402
from hami.workloads import pod_templates  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args(argv)
    corpus = ROOT / "tests" / "corpus"
    settings = ValidationSettings()
    costs: list[tuple[float, str, int]] = []
    for path in sorted(corpus.glob("*.yaml")):
        if path.name == "expected.yaml":
            continue
        obj = yaml.safe_load(path.read_text())
        context = ValidationContext(operation="CREATE", namespace="team-a")
        started = time.perf_counter()
        for _ in range(args.repeat):
            found = validate(obj, pod_templates(obj, "team-a"), context, settings)
        costs.append(((time.perf_counter() - started) / args.repeat * 1e6, path.name, len(found)))
    values = [c for c, _, _ in costs]
    print(f"validation over {len(costs)} corpus manifests, {args.repeat} runs each")
    print(
        f"  median {statistics.median(values):.1f} µs, p90 {sorted(values)[int(0.9 * len(values))]:.1f} µs, "
        f"max {max(values):.1f} µs per object (templates extracted + every rule)"
    )
    for cost, name, violations in sorted(costs, reverse=True)[:5]:
        print(f"  {cost:7.1f} µs  {name} ({violations} violations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
