"""Per-container GPU figures for validation, read tolerantly: a malformed value becomes a finding.

`hami.requests` raises on the first bad value because placement cannot go on without it; validation
must instead report every bad value with its field path and keep checking the rest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from hami.content_memo import ContentMemo
from hami.quantity import QuantityError, bytes_to_mib, parse_quantity
from hami.requests import ResourceNames, asks_any_gpu
from hami.validation.model import Finding
from hami.workloads import PodTemplate

# Kubernetes' own resources; everything else with a domain is an extended resource.
_NATIVE = frozenset({"cpu", "memory", "ephemeral-storage", "storage"})


@dataclass(frozen=True, slots=True)
class ContainerGpu:
    """What one container asks of GPUs; None where it did not say (or said something unreadable)."""

    kind: str  # containers | initContainers | ephemeralContainers
    index: int
    name: str
    path: str  # "spec.template.spec.containers[0]"
    restartable: bool  # a sidecar init container (restartPolicy: Always) runs alongside the app
    count: int | None  # summed over every count name
    count_field: str | None  # the field of the (first) count given
    memory_mib: int | None  # per device, from a MiB or a byte-quantity name
    memory_percent: int | None
    memory_field: str | None
    cores: int | None
    cores_field: str | None

    @property
    def asks_gpu(self) -> bool:
        return any(v is not None for v in (self.count, self.memory_mib, self.memory_percent, self.cores))

    @property
    def devices(self) -> int:
        """Devices this container takes: HAMi's rule, memory or cores alone mean one GPU."""
        if self.count is not None:
            return self.count
        return 1 if self.asks_gpu else 0


def _is_extended(name: str) -> bool:
    if name in _NATIVE or name.startswith("hugepages-") or "/" not in name:
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io") or name.startswith("requests."))


def _section(container: Mapping[str, Any], section: str) -> Mapping[str, Any]:
    resources = container.get("resources")
    values = resources.get(section) if isinstance(resources, dict) else None
    return values if isinstance(values, dict) else {}


def _field(base: str, section: str, name: str) -> str:
    return f"{base}.resources.{section}[{name}]"


def _raw(container: Mapping[str, Any], name: str, base: str) -> tuple[Any, str] | None:
    """The limit, else the request (Kubernetes defaults an extended request to its limit)."""
    for section in ("limits", "requests"):
        values = _section(container, section)
        if name in values:
            return values[name], _field(base, section, name)
    return None


def quantity(value: Any) -> Fraction:
    """parse_quantity, with float infinities and NaN (Python's json accepts them) as QuantityError too."""
    try:
        return parse_quantity(value)
    except (OverflowError, ValueError) as exc:
        if isinstance(exc, QuantityError):
            raise
        raise QuantityError(f"{value!r} is not a quantity") from None


def _parse(value: Any, path: str, integral: bool, findings: list[Finding], container: str) -> Fraction | None:
    try:
        amount = quantity(value)
    except QuantityError:
        findings.append(Finding("malformed-quantity", "malformed", path, container, {"value": str(value)}))
        return None
    if amount < 0:
        findings.append(Finding("malformed-quantity", "negative", path, container, {"value": str(value)}))
        return None
    if integral and amount.denominator != 1:
        # The API server refuses fractional extended resources ("must be an integer").
        findings.append(Finding("malformed-quantity", "fractional", path, container, {"value": str(value)}))
        return None
    return amount


def _integer(
    container: Mapping[str, Any], names: tuple[str, ...], base: str, findings: list[Finding], label: str
) -> tuple[int | None, str | None]:
    """Sum of every listed name the container gives (a malformed one contributes nothing)."""
    total: int | None = None
    first: str | None = None
    for name in names:
        found = _raw(container, name, base)
        if found is None:
            continue
        amount = _parse(found[0], found[1], True, findings, label)
        first = first or found[1]
        if amount is not None:
            total = (total or 0) + int(amount)
    return total, first


def read_container(
    container: Mapping[str, Any], kind: str, index: int, base_path: str, names: ResourceNames
) -> tuple[ContainerGpu, list[Finding]]:
    findings: list[Finding] = []
    raw_name = container.get("name")
    name = raw_name if isinstance(raw_name, str) and raw_name else f"{kind}[{index}]"
    path = f"{base_path}.{kind}[{index}]"
    restartable = kind == "initContainers" and container.get("restartPolicy") == "Always"
    if not asks_any_gpu(container, names.all):
        # Most containers ask for no GPU: skip the per-name lookups (this runs for every admission).
        return ContainerGpu(kind, index, name, path, restartable, None, None, None, None, None, None, None), findings
    # The pods of one workload repeat the same container: read each shape once.
    key = (name, restartable, repr(container.get("resources")), kind, index, base_path, names)
    gpu, found = _GPU_READS.get(key, lambda: _read_gpu(container, kind, index, name, path, restartable, names))
    return gpu, list(found)


_GPU_READS: ContentMemo[tuple[ContainerGpu, tuple[Finding, ...]]] = ContentMemo()


def _read_gpu(
    container: Mapping[str, Any], kind: str, index: int, name: str, path: str, restartable: bool, names: ResourceNames
) -> tuple[ContainerGpu, tuple[Finding, ...]]:
    """read_container for a container that names a GPU resource (pure: memoised by its input)."""
    findings: list[Finding] = []
    count, count_field = _integer(container, names.count, path, findings, name)
    memory_mib: int | None = None
    memory_field: str | None = None
    mib, mib_field = _integer(container, names.memory_mib, path, findings, name)
    if mib_field is not None:
        memory_mib, memory_field = mib, mib_field
    else:
        for qty_name in names.memory_quantity:
            found = _raw(container, qty_name, path)
            if found is None:
                continue
            amount = _parse(found[0], found[1], False, findings, name)
            memory_field = found[1]
            memory_mib = bytes_to_mib(amount) if amount is not None else None
            break
    percent: int | None = None
    if memory_field is None:
        percent, memory_field = _integer(container, names.memory_percent, path, findings, name)
    cores, cores_field = _integer(container, names.cores, path, findings, name)
    gpu = ContainerGpu(
        kind, index, name, path, restartable, count, count_field, memory_mib, percent, memory_field, cores, cores_field
    )
    return gpu, tuple(findings)


def read_template(template: PodTemplate, names: ResourceNames) -> tuple[list[ContainerGpu], list[Finding]]:
    """Every container's GPU figures (ephemeral containers have no resources) and malformed values."""
    gpus: list[ContainerGpu] = []
    findings: list[Finding] = []
    for kind, index, container in template.containers():
        if kind == "ephemeralContainers":
            continue
        gpu, found = read_container(container, kind, index, template.path, names)
        gpus.append(gpu)
        findings.extend(found)
    return gpus, findings


def overcommit_findings(template: PodTemplate) -> Iterator[Finding]:
    """Extended resources whose requests differ from limits, or that have requests but no limit."""
    for kind, index, container in template.containers():
        if kind == "ephemeralContainers":
            continue
        raw_name = container.get("name")
        name = raw_name if isinstance(raw_name, str) and raw_name else f"{kind}[{index}]"
        base = f"{template.path}.{kind}[{index}]"
        limits = _section(container, "limits")
        for resource, requested in _section(container, "requests").items():
            if not isinstance(resource, str) or not _is_extended(resource):
                continue
            path = _field(base, "requests", resource)
            if resource not in limits:
                yield Finding(
                    "extended-overcommit", "no-limit", path, name, {"resource": resource, "request": requested}
                )
            elif not _same_quantity(requested, limits[resource]):
                yield Finding(
                    "extended-overcommit",
                    "differs",
                    path,
                    name,
                    {"resource": resource, "request": requested, "limit": limits[resource]},
                )


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        return quantity(a) == quantity(b)
    except QuantityError:
        return str(a) == str(b)  # unreadable values are reported by malformed-quantity


def effective(values: list[tuple[ContainerGpu, int]]) -> int:
    """Kubernetes' effective pod request of one resource from per-container amounts.

    max(sum of app containers + sidecars, max over init containers of (that init container + the
    sidecars started before it)); sidecars (restartable init containers) keep running, so they add up.
    """
    sidecars = 0
    init_peak = 0
    apps = 0
    for gpu, amount in values:
        if gpu.kind == "initContainers":
            if gpu.restartable:
                sidecars += amount
                init_peak = max(init_peak, sidecars)
            else:
                init_peak = max(init_peak, sidecars + amount)
        elif gpu.kind == "containers":
            apps += amount
    return max(apps + sidecars, init_peak)
