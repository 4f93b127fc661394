"""`GET /metrics`: one node's status as Prometheus text, under dcgm-exporter's names and labels,
so the GPU dashboards and alerts people already have keep working against our agent."""

from __future__ import annotations

import math
from collections.abc import Callable

from hami.node.cache import ReadStats
from hami.node.schema import GpuStatus, NodeStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LABELS = ("gpu", "UUID", "device", "modelName", "Hostname")

# (name, help, value of a card or None when absent). dcgm-exporter types the ECC totals as
# counters; here they are gauges, since the text format's counter convention (a "_total"
# suffix in lower case) does not fit dcgm's names. Dashboards match series names, which agree.
_GPU_GAUGES: tuple[tuple[str, str, Callable[[GpuStatus], float | None]], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.utilisation_gpu),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda g: g.utilisation_memory),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: g.memory_used_mib),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda g: g.memory_free_mib),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temperature_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.power_w),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", lambda g: g.power_limit_w),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        lambda g: g.ecc.volatile_corrected if g.ecc else None,
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        lambda g: g.ecc.volatile_uncorrected if g.ecc else None,
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Total number of single-bit persistent ECC errors.",
        lambda g: g.ecc.aggregate_corrected if g.ecc else None,
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Total number of double-bit persistent ECC errors.",
        lambda g: g.ecc.aggregate_uncorrected if g.ecc else None,
    ),
    ("hami_agent_gpu_healthy", "1 when the agent judges the card healthy, else 0.", lambda g: float(g.healthy)),
)


def _escape(value: str) -> str:
    # Label values per the text format: backslash, double quote and newline are escaped.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return (
        repr(float(value))
        if math.isfinite(value)
        else ("NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf"))
    )


def render(node: str, status: NodeStatus | None, stats: ReadStats) -> bytes:
    """Prometheus text (format 0.0.4) for one node; `status` is None when the latest read failed.

    Written by hand rather than through prometheus_client's registry: a fleet agent renders
    thousands of nodes, and building metric families per scrape cost ~10x more. The tests read
    the output back with prometheus_client's own parser.
    """
    host = _escape(node)
    lines: list[str] = []
    if status is not None:
        labels = [
            f'gpu="{g.index}",UUID="{_escape(g.uuid)}",device="nvidia{g.index}",'
            f'modelName="{_escape(g.model)}",Hostname="{host}"'
            for g in status.gpus
        ]
        for name, text, value_of in _GPU_GAUGES:
            samples = [
                f"{name}{{{label}}} {_number(value)}"
                for gpu, label in zip(status.gpus, labels, strict=True)
                if (value := value_of(gpu)) is not None  # absent fields are absent series, never a fake 0
            ]
            if samples:
                lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", *samples]
    lines += [
        "# HELP hami_agent_read_errors_total Failed GPU reads: kind=read a whole read failed, "
        "kind=call one NVML call failed (field absent).",
        "# TYPE hami_agent_read_errors_total counter",
        f'hami_agent_read_errors_total{{Hostname="{host}",kind="read"}} {_number(stats.read_errors)}',
        f'hami_agent_read_errors_total{{Hostname="{host}",kind="call"}} {_number(stats.call_errors)}',
        "# HELP hami_agent_reads_total GPU reads done (scrapes share reads).",
        "# TYPE hami_agent_reads_total counter",
        f'hami_agent_reads_total{{Hostname="{host}"}} {_number(stats.reads)}',
        "# HELP hami_agent_read_ok 1 when the latest read succeeded.",
        "# TYPE hami_agent_read_ok gauge",
        f'hami_agent_read_ok{{Hostname="{host}"}} {_number(1.0 if status is not None else 0.0)}',
    ]
    return ("\n".join(lines) + "\n").encode()
