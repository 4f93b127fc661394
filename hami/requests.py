"""What a pod asks of GPUs, from resource names and annotations (HAMi's and ours).

HAMi's semantics are kept so existing manifests mean the same thing here:
- memory or cores without a count means one GPU;
- a count without memory means the whole card (memory percentage 100);
- `nvidia.com/gpumem` is MiB, `hami.io/vgpu-memory` is a quantity ("8Gi").
Limits are read first and requests second, as Kubernetes defaults an extended resource's request
to its limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hami.content_memo import ContentMemo
from hami.quantity import QuantityError, bytes_to_mib, parse_quantity, to_int_ceil
from hami.workloads import PodTemplate


@dataclass(frozen=True, slots=True)
class ResourceNames:
    """Resource names that mean GPU count, memory and cores. Configurable for renamed installs."""

    count: tuple[str, ...] = ("nvidia.com/gpu", "hami.io/vgpu")
    memory_mib: tuple[str, ...] = ("nvidia.com/gpumem",)  # plain MiB integers (HAMi)
    memory_quantity: tuple[str, ...] = ("hami.io/vgpu-memory",)  # byte quantities ("8Gi")
    memory_percent: tuple[str, ...] = ("nvidia.com/gpumem-percentage",)
    cores: tuple[str, ...] = ("nvidia.com/gpucores", "hami.io/vgpu-cores")

    # Every name above, built once: asked for each container of each admission.
    all: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())

    def __post_init__(self) -> None:
        names = self.count + self.memory_mib + self.memory_quantity + self.memory_percent + self.cores
        object.__setattr__(self, "all", frozenset(names))


DEFAULT_NAMES = ResourceNames()

# Annotations in (HAMi's names first, ours after).
USE_GPU_TYPE = "nvidia.com/use-gputype"
NOUSE_GPU_TYPE = "nvidia.com/nouse-gputype"
USE_GPU_UUID = "nvidia.com/use-gpuuuid"
NOUSE_GPU_UUID = "nvidia.com/nouse-gpuuuid"
SCHEDULING_POLICY = "hami.io/scheduling-policy"
NODE_POLICY = "hami.io/node-scheduler-policy"
GPU_POLICY = "hami.io/gpu-scheduler-policy"
MAX_GPU_UTIL = "hami.io/max-gpu-util"
WORKLOAD_TYPE = "hami.io/workload-type"


class RequestError(ValueError):
    """A GPU request that cannot be read; the message names the field and what was expected."""


@dataclass(frozen=True, slots=True)
class ContainerGpuRequest:
    """One container's GPU ask. Memory is per device; exactly one of mib/percent is set."""

    container: str
    kind: str  # containers | initContainers | ephemeralContainers
    index: int
    count: int
    memory_mib: int | None = None
    memory_percent: int | None = None
    cores: int = 0  # percent of one device; 0 means no SM limit (HAMi's default)

    def memory_on(self, card_mib: int) -> int:
        """MiB this container needs on a card of `card_mib` total."""
        if self.memory_mib is not None:
            return self.memory_mib
        return card_mib * (self.memory_percent if self.memory_percent is not None else 100) // 100


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """A pod's whole GPU ask plus the constraints and preferences that steer its placement."""

    containers: tuple[ContainerGpuRequest, ...]
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()
    node_policy: str | None = None
    gpu_policy: str | None = None
    max_gpu_util: float | None = None
    workload_type: str | None = None
    priority: int = 0
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity: Mapping[str, Any] = field(default_factory=dict)
    cpu_milli: int = 0  # host CPU and memory the pod needs; only the trace replay fills them
    memory_mib: int = 0

    @property
    def total_devices(self) -> int:
        return sum(c.count for c in self.containers)


def resource_value(container: Mapping[str, Any], name: str) -> Any:
    """The container's limit for `name`, else its request, else None."""
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return None
    for section in ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, dict) and name in values:
            return values[name]
    return None


def asks_any_gpu(container: Mapping[str, Any], names: frozenset[str]) -> bool:
    """Whether the container names any GPU resource: most do not, and then nothing else is read."""
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return False
    limits, requests = resources.get("limits"), resources.get("requests")
    return (isinstance(limits, dict) and not names.isdisjoint(limits)) or (
        isinstance(requests, dict) and not names.isdisjoint(requests)
    )


def _first(container: Mapping[str, Any], names: tuple[str, ...]) -> tuple[str, Any] | None:
    for name in names:
        value = resource_value(container, name)
        if value is not None:
            return name, value
    return None


def _integer(value: Any, field_path: str) -> int:
    try:
        amount = parse_quantity(value)
    except QuantityError as exc:
        raise RequestError(f"{field_path}: {exc}") from None
    if amount < 0:
        raise RequestError(f"{field_path}: must not be negative, got {value!r}")
    return to_int_ceil(amount)


def container_request(
    container: Mapping[str, Any], kind: str, index: int, path: str, names: ResourceNames = DEFAULT_NAMES
) -> ContainerGpuRequest | None:
    """The container's GPU ask, or None when it asks for no GPU at all. Raises RequestError."""
    # The pods of one workload repeat the same container: read each shape once.
    key = (repr(container.get("name")), repr(container.get("resources")), kind, index, path, names)
    return _READS.get(key, lambda: _container_request(container, kind, index, path, names))


def _container_request(
    container: Mapping[str, Any], kind: str, index: int, path: str, names: ResourceNames
) -> ContainerGpuRequest | None:
    where = f"{path}.{kind}[{index}].resources.limits"
    found_count = _first(container, names.count)
    found_mib = _first(container, names.memory_mib)
    found_qty = _first(container, names.memory_quantity)
    found_pct = _first(container, names.memory_percent)
    found_cores = _first(container, names.cores)
    if not any((found_count, found_mib, found_qty, found_pct, found_cores)):
        return None
    count = _integer(found_count[1], f"{where}[{found_count[0]}]") if found_count else 1
    memory_mib = memory_percent = None
    if found_mib:
        memory_mib = _integer(found_mib[1], f"{where}[{found_mib[0]}]")
    elif found_qty:
        try:
            memory_mib = bytes_to_mib(parse_quantity(found_qty[1]))
        except QuantityError as exc:
            raise RequestError(f"{where}[{found_qty[0]}]: {exc}") from None
    elif found_pct:
        memory_percent = _integer(found_pct[1], f"{where}[{found_pct[0]}]")
    cores = _integer(found_cores[1], f"{where}[{found_cores[0]}]") if found_cores else 0
    name = container.get("name")
    return ContainerGpuRequest(
        container=name if isinstance(name, str) else f"{kind}[{index}]",
        kind=kind,
        index=index,
        count=count,
        memory_mib=memory_mib,
        memory_percent=memory_percent,
        cores=cores,
    )


_READS: ContentMemo[ContainerGpuRequest | None] = ContentMemo()


def _csv(annotations: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = annotations.get(key)
    if not isinstance(value, str):
        return ()
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _float_annotation(annotations: Mapping[str, Any], key: str) -> float | None:
    value = annotations.get(key)
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise RequestError(f"metadata.annotations[{key}]: {value!r} is not a number") from None
    if not 0 <= number <= 100:
        raise RequestError(f"metadata.annotations[{key}]: {value!r} must be within 0..100")
    return number


def gpu_request(template: PodTemplate, names: ResourceNames = DEFAULT_NAMES) -> GpuRequest | None:
    """The pod's GPU ask, or None for a pod that asks for no GPU.

    Only app containers get devices: init containers run before them and HAMi gives them the
    same devices, so placement sizes the pod by its app containers (validation still counts init
    containers under Kubernetes' effective-request rule).
    """
    containers: list[ContainerGpuRequest] = []
    gpu_names = names.all
    for kind, index, container in template.containers():
        if kind != "containers" or not asks_any_gpu(container, gpu_names):
            continue
        request = container_request(container, kind, index, template.path, names)
        if request is not None and request.count > 0:
            containers.append(request)
    if not containers:
        return None
    annotations = template.annotations
    policy = annotations.get(SCHEDULING_POLICY)
    node_policy = annotations.get(NODE_POLICY, policy)
    gpu_policy = annotations.get(GPU_POLICY, policy)
    priority = template.spec.get("priority")
    node_selector = template.spec.get("nodeSelector")
    affinity = template.spec.get("affinity")
    workload = annotations.get(WORKLOAD_TYPE)
    return GpuRequest(
        containers=tuple(containers),
        use_types=_csv(annotations, USE_GPU_TYPE),
        nouse_types=_csv(annotations, NOUSE_GPU_TYPE),
        use_uuids=_csv(annotations, USE_GPU_UUID),
        nouse_uuids=_csv(annotations, NOUSE_GPU_UUID),
        node_policy=node_policy if isinstance(node_policy, str) else None,
        gpu_policy=gpu_policy if isinstance(gpu_policy, str) else None,
        max_gpu_util=_float_annotation(annotations, MAX_GPU_UTIL),
        workload_type=workload.strip().lower() if isinstance(workload, str) and workload.strip() else None,
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        node_selector=node_selector if isinstance(node_selector, Mapping) else {},
        affinity=affinity if isinstance(affinity, Mapping) else {},
    )
