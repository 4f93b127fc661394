"""PNG figures from the replay's JSON: allocated GPU share against arrived demand, one panel per trace.

    python bench/replay.py ... --json > default.json    # one file per trace
    python bench/plots.py default.json gpushare40.json --out docs/img/replay_alloc.png

Each figure carries the machine, the command and the date the JSON recorded, so a plot never
travels without the run that made it. Matplotlib's Agg backend: no display needed.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STYLE = {"random": ":", "spread": ":", "bestfit": "--", "binpack": "--", "fgd": "-", "frag": "-"}


def load(paths: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in paths]


def footer(reports: list[dict[str, Any]]) -> str:
    """One line per distinct (machine, date), then the commands: what a reader needs to rerun it."""
    runs = sorted({f"{r.get('machine', '?')}, {r.get('date', '?')}" for r in reports})
    commands = [textwrap.fill(r.get("command", ""), 150, subsequent_indent="    ") for r in reports]
    return "\n".join(["machine: " + "; ".join(runs), *commands])


def plot_allocation(reports: list[dict[str, Any]], out: Path) -> Path:
    """Allocated % of GPU capacity against arrived demand % of capacity, a line per policy."""
    foot = footer(reports)
    rows = foot.count("\n") + 1
    fig, axes = plt.subplots(1, len(reports), figsize=(max(7.0, 4.2 * len(reports)), 4.2 + 0.1 * rows), squeeze=False)
    for ax, report in zip(axes[0], reports, strict=True):
        step = report.get("curve_step_pct", 5)
        for policy, row in report["policies"].items():
            curve = row.get("curve") or []
            xs = [step * (i + 1) for i in range(len(curve))]
            label = f"{policy} ({row['unallocated_at_100']:.2f}% idle @100)"
            ax.plot(xs, curve, STYLE.get(policy, "-"), label=label, linewidth=1.2)
        ax.plot([0, 100], [0, 100], color="grey", linewidth=0.5)
        ax.set_xlim(70, 130)
        ax.set_ylim(70, 100)
        ax.axvline(100, color="grey", linewidth=0.5)
        ax.set_title(f"{report['trace']} ({report['seeds']} seeds, median)", fontsize=9)
        ax.set_xlabel("arrived GPU demand, % of capacity")
        ax.set_ylabel("allocated GPU, % of capacity")
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
    fig.text(0.01, 0.01, foot, fontsize=5, family="monospace", va="bottom")
    fig.tight_layout(rect=(0, 0.02 + 0.022 * rows, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


STUDY = {  # the study's medians (unallocated GPU % at 100% arrival), where it reports them
    "openb_pod_list_default.csv": {"random": 13.75, "bestfit": 7.09, "fgd": 4.77},
    "openb_pod_list_gpushare40.csv": {"bestfit": 8.53, "fgd": 6.05},
    "openb_pod_list_multigpu30.csv": {"bestfit": 5.47, "fgd": 3.61},
    "openb_pod_list_gpuspec10.csv": {"bestfit": 6.88, "fgd": 5.30},
}


def table(reports: list[dict[str, Any]]) -> str:
    """A Markdown table: one row per (trace, policy), beside the study's figure where it has one."""
    lines = [
        "| trace | policy | unallocated@100 % median [min..max] | study | frag@100 % | µs/decision | seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    for report in reports:
        study = STUDY.get(report["trace"], {})
        for policy, row in report["policies"].items():
            lines.append(
                f"| {report['trace'].removeprefix('openb_pod_list_').removesuffix('.csv')} | {policy} "
                f"| {row['unallocated_at_100']:.2f} [{row['unallocated_min']:.2f}..{row['unallocated_max']:.2f}] "
                f"| {study.get(policy, '–')} | {row['frag_at_100']:.2f} | {row['us_per_decision']:,.0f} "
                f"| {row['seeds']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path, help="replay.py --json outputs, one per trace")
    parser.add_argument("--out", type=Path, default=Path("docs/img/replay_alloc.png"))
    parser.add_argument("--table", action="store_true", help="print a Markdown results table instead")
    args = parser.parse_args(argv)
    reports = load(args.reports)
    print(table(reports) if args.table else plot_allocation(reports, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
