"""Filter plugins: each a small pure function that says whether a node or device may take the pod.

Node filters return a reason when they reject; device filters return a reason for one device. Each
filter has a reason class, which `Decision.filtered` counts nodes by.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from hami.placement.frag import matches
from hami.placement.selectors import node_labels, selector_allows
from hami.placement.settings import PlacementSettings
from hami.requests import ContainerGpuRequest, GpuRequest
from hami.state.model import DeviceUsage, Freshness, Gpu, Node

OTHER_WORKLOAD = {"training": "inference", "inference": "training"}


def gib(mib: int) -> str:
    return f"{mib / 1024:.1f}Gi"


class Device(NamedTuple):
    """One GPU as placement sees it: the snapshot plus the ledger's pending reservations.

    A NamedTuple rather than a frozen dataclass: one is built per device per evaluation, and a
    tuple is several times cheaper to build on that path."""

    pos: int  # position in Node.gpus
    gpu: Gpu
    free_mib: int  # effective free minus reserved
    cores_free: int
    pods: int
    workloads: frozenset[str]

    @property
    def empty(self) -> bool:
        return self.pods == 0 and self.cores_free == 100 and self.free_mib >= self.gpu.memory_total_mib

    @property
    def used_mib(self) -> int:
        return self.gpu.memory_total_mib - self.free_mib


def device_view(pos: int, gpu: Gpu, reserved: DeviceUsage | None) -> Device:
    if reserved is None:
        return Device(pos, gpu, gpu.effective_free_mib, 100 - gpu.cores_promised, gpu.pods, gpu.workload_types)
    return Device(
        pos,
        gpu,
        max(0, gpu.effective_free_mib - reserved.memory_mib),
        100 - gpu.cores_promised - reserved.cores,
        gpu.pods + reserved.pods,
        gpu.workload_types | reserved.workload_types,
    )


# ---- node filters: (node, request, settings) -> reason or "" ------------------------------------


def node_freshness(node: Node, settings: PlacementSettings) -> str:
    if node.freshness == Freshness.UNKNOWN:
        return f"state unknown ({node.reason or 'agent never answered'})"
    if node.freshness == Freshness.STALE and settings.degradation != "aggressive":
        return f"state stale ({node.reason or 'agent not answering'})"
    return ""


def node_selector(node: Node, request: GpuRequest) -> str:
    if not request.node_selector and not request.affinity:
        return ""
    ok, why = selector_allows(request.node_selector, request.affinity, node_labels(node.name, node.labels))
    return "" if ok else why


def node_host_resources(node: Node, request: GpuRequest) -> str:
    if node.cpu_milli_free is not None and node.cpu_milli_free < request.cpu_milli:
        return f"host CPU {node.cpu_milli_free}m free, needs {request.cpu_milli}m"
    if node.memory_mib_free is not None and node.memory_mib_free < request.memory_mib:
        return f"host memory {gib(node.memory_mib_free)} free, needs {gib(request.memory_mib)}"
    return ""


# ---- device filters: (device, request, settings, context) -> reason or "" -----------------------


@dataclass(frozen=True, slots=True)
class DeviceContext:
    """What device filters need beyond the device and the request, computed once per request."""

    util_bound: float | None
    utilisation_known: bool
    min_memory_on: Callable[[int], int]  # smallest per-device memory ask among containers, by card size
    min_cores: int
    needs_empty: bool  # every container wants whole cards
    # Reason classes of DEVICE_FILTERS that cannot reject anything for this request (no types, no
    # UUIDs, no workload to separate, no utilisation bound): evaluation skips them.
    inactive: frozenset[str] = frozenset()


def device_health(d: Device, request: GpuRequest, s: PlacementSettings, ctx: DeviceContext) -> str:
    g = d.gpu
    if not g.healthy:
        return f"GPU-{g.index} unhealthy"
    if g.temperature_c is not None and g.temperature_c > s.max_temperature_c:
        return f"GPU-{g.index} at {g.temperature_c:.0f}C > {s.max_temperature_c:.0f}C"
    if g.ecc_uncorrected is not None and g.ecc_uncorrected > s.max_ecc_uncorrected:
        return f"GPU-{g.index} has {g.ecc_uncorrected} uncorrected ECC errors"
    return ""


def device_type(d: Device, request: GpuRequest, s: PlacementSettings, ctx: DeviceContext) -> str:
    if request.use_types and not matches(request.use_types, d.gpu.model):
        return f"GPU-{d.gpu.index} is {d.gpu.model}, pod wants {','.join(request.use_types)}"
    if matches(request.nouse_types, d.gpu.model):
        return f"GPU-{d.gpu.index} is {d.gpu.model}, pod excludes it"
    return ""


def device_uuid(d: Device, request: GpuRequest, s: PlacementSettings, ctx: DeviceContext) -> str:
    if request.use_uuids and d.gpu.uuid not in request.use_uuids:
        return f"GPU-{d.gpu.index} not among the pod's GPU UUIDs"
    if d.gpu.uuid in request.nouse_uuids:
        return f"GPU-{d.gpu.index} excluded by UUID"
    return ""


def device_separation(d: Device, request: GpuRequest, s: PlacementSettings, ctx: DeviceContext) -> str:
    other = OTHER_WORKLOAD.get(request.workload_type or "")
    if s.separate_workloads and other is not None and other in d.workloads:
        return f"GPU-{d.gpu.index} runs {other}"
    return ""


def device_utilisation(d: Device, request: GpuRequest, s: PlacementSettings, ctx: DeviceContext) -> str:
    if ctx.util_bound is None:
        return ""
    util = d.gpu.utilisation if ctx.utilisation_known else None
    if util is None:
        return "" if s.degradation == "aggressive" else f"GPU-{d.gpu.index} utilisation unknown"
    if util > ctx.util_bound:
        return f"GPU-{d.gpu.index} at {util:.0f}% utilisation > {ctx.util_bound:.0f}%"
    return ""


def device_pods(d: Device, request: GpuRequest, s: PlacementSettings, ctx: DeviceContext) -> str:
    if d.pods >= s.max_pods_per_gpu:
        return f"GPU-{d.gpu.index} already shared by {d.pods} pods"
    if ctx.needs_empty and not d.empty:
        return f"GPU-{d.gpu.index} is not empty, pod wants whole cards"
    return ""


def device_cores(d: Device, request: GpuRequest, s: PlacementSettings, ctx: DeviceContext) -> str:
    if d.cores_free < ctx.min_cores:
        return f"GPU-{d.gpu.index} has {d.cores_free}% cores free, needs {ctx.min_cores}%"
    return ""


def device_memory(d: Device, request: GpuRequest, s: PlacementSettings, ctx: DeviceContext) -> str:
    need = ctx.min_memory_on(d.gpu.memory_total_mib)
    if d.free_mib < need:
        return f"GPU-{d.gpu.index} has {gib(d.free_mib)} effective free, needs {gib(need)}"
    return ""


DeviceFilter = Callable[[Device, GpuRequest, PlacementSettings, DeviceContext], str]

# Cheapest and most decisive first; the reason class names the filter in Decision.filtered.
DEVICE_FILTERS: tuple[tuple[str, DeviceFilter], ...] = (
    ("unhealthy", device_health),
    ("gpu-type", device_type),
    ("gpu-uuid", device_uuid),
    ("separation", device_separation),
    ("utilisation", device_utilisation),
    ("pods", device_pods),
    ("cores", device_cores),
    ("memory", device_memory),
)


def needs_whole_card(c: ContainerGpuRequest) -> bool:
    return c.memory_percent == 100 or c.cores >= 100 or (c.memory_mib is None and c.memory_percent is None)


def device_fits(d: Device, c: ContainerGpuRequest, mem: int) -> bool:
    """Whether `d` can still take container `c` (needing `mem` MiB on it)."""
    if needs_whole_card(c):
        return d.empty
    return d.free_mib >= mem and d.cores_free >= c.cores
