"""GPU resource rules: the per-pod GPU count cap and vGPU slicing compliance."""

from __future__ import annotations

from collections.abc import Iterator

from hami.validation.model import Finding
from hami.validation.resources import ContainerGpu, effective


def gpu_count_findings(gpus: list[ContainerGpu], cap: int, namespace: str, template_path: str) -> Iterator[Finding]:
    """The pod's effective GPU count (Kubernetes' init-vs-app rule) above the namespace's cap."""
    if cap < 0:
        return
    total = effective([(g, g.devices) for g in gpus])
    if total <= cap:
        return
    contributors = [g for g in gpus if g.devices > 0]
    biggest = max(contributors, key=lambda g: g.devices)
    breakdown = ", ".join(f"'{g.name}': {g.devices}" for g in contributors)
    yield Finding(
        "gpu-count",
        "gpu-count",
        biggest.count_field or biggest.path,
        biggest.name if len(contributors) == 1 else None,
        {"total": total, "cap": cap, "namespace": namespace, "breakdown": breakdown, "where": template_path},
    )


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def _suggest(mib: int, step: int, card_mib: int) -> int:
    """The next multiple of `step`, unless that no longer fits the largest card (then the one below)."""
    up = _round_up(mib, step)
    return up if up <= card_mib or card_mib < step else card_mib // step * step


def slicing_findings(gpu: ContainerGpu, largest_card_mib: int, granularity_mib: int) -> Iterator[Finding]:
    """A shared-GPU request must say how much memory it wants, within the card and the granularity."""
    if gpu.cores is not None and gpu.cores > 100:
        yield Finding("vgpu-range", "cores-range", gpu.cores_field or gpu.path, gpu.name, {"value": gpu.cores})
    elif gpu.cores is not None and 0 < gpu.cores < 100 and gpu.memory_field is None:
        # A slice of the SMs without a memory figure would get the whole card's memory (HAMi's
        # default), starving whoever shares the card.
        yield Finding(
            "vgpu-memory-required", "memory-required", gpu.cores_field or gpu.path, gpu.name, {"cores": gpu.cores}
        )
    if gpu.memory_percent is not None:
        if gpu.memory_percent > 100:
            yield Finding(
                "vgpu-range", "percent-range", gpu.memory_field or gpu.path, gpu.name, {"value": gpu.memory_percent}
            )
        elif gpu.memory_percent == 0:
            yield Finding("vgpu-range", "memory-zero", gpu.memory_field or gpu.path, gpu.name, {"value": "0%"})
    if gpu.memory_mib is None:
        return
    field = gpu.memory_field or gpu.path
    if gpu.memory_mib == 0:
        yield Finding("vgpu-range", "memory-zero", field, gpu.name, {"value": "0"})
        return
    if gpu.memory_mib > largest_card_mib:
        yield Finding(
            "vgpu-memory-max", "memory-max", field, gpu.name, {"mib": gpu.memory_mib, "card": largest_card_mib}
        )
    if granularity_mib and gpu.memory_mib % granularity_mib:
        yield Finding(
            "vgpu-granularity",
            "granularity",
            field,
            gpu.name,
            {
                "mib": gpu.memory_mib,
                "step": granularity_mib,
                "suggest": _suggest(gpu.memory_mib, granularity_mib, largest_card_mib),
            },
        )
