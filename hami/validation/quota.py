"""Tenant quota: what one pod counts against its namespace, and the check against the caps."""

from __future__ import annotations

from collections.abc import Iterator

from hami.requests import ResourceNames
from hami.validation.model import Finding, NamespaceUsage
from hami.validation.resources import ContainerGpu, effective, read_template
from hami.validation.settings import Quota
from hami.workloads import PodTemplate


def _memory_per_device(gpu: ContainerGpu, card_mib: int) -> int:
    if gpu.memory_mib is not None:
        return gpu.memory_mib
    # A percentage (or no memory figure: a whole card) only has a size on a card; the caller
    # passes the largest card, so the quota errs on the side of counting too much.
    percent = gpu.memory_percent if gpu.memory_percent is not None else 100
    return card_mib * percent // 100


def _cores_per_device(gpu: ContainerGpu) -> int:
    # No gpucores means no SM limit (HAMi): the container may use the whole device.
    return gpu.cores if gpu.cores else 100


def usage_of(gpus: list[ContainerGpu], card_mib: int) -> NamespaceUsage:
    asking = [g for g in gpus if g.devices > 0]
    return NamespaceUsage(
        memory_mib=effective([(g, g.devices * _memory_per_device(g, card_mib)) for g in asking]),
        cores=effective([(g, g.devices * _cores_per_device(g)) for g in asking]),
        gpus=effective([(g, g.devices) for g in asking]),
    )


def pod_gpu_usage(template: PodTemplate, card_mib: int, names: ResourceNames) -> NamespaceUsage:
    """What one pod counts against its namespace's quota; never raises (unreadable values count 0).

    Per dimension, Kubernetes' effective request (max of any init container vs app containers plus
    sidecars), as ResourceQuota does. Memory in MiB on a card of `card_mib`.
    """
    gpus, _ = read_template(template, names)
    return usage_of(gpus, card_mib)


def quota_findings(
    requested: NamespaceUsage,
    used: NamespaceUsage | None,
    quota: Quota,
    namespace: str,
    path: str,
) -> Iterator[Finding]:
    """`used` is the namespace's live usage for a Pod CREATE, None for a controller's template (which
    has no replicas yet, so only a template that alone exceeds the quota can be refused)."""
    dimensions = (
        ("memory", requested.memory_mib, used.memory_mib if used else 0, quota.memory_mib),
        ("cores", requested.cores, used.cores if used else 0, quota.cores),
        ("gpus", requested.gpus, used.gpus if used else 0, quota.gpus),
    )
    for dimension, asked, in_use, limit in dimensions:
        # A pod asking nothing of a dimension is never refused for it, even in a namespace already over
        # (the quota may have been lowered after its pods started).
        if limit is None or asked == 0 or in_use + asked <= limit:
            continue
        yield Finding(
            "tenant-quota",
            "quota" if used is not None else "quota-template",
            path,
            None,
            {"dimension": dimension, "used": in_use, "requested": asked, "limit": limit, "namespace": namespace},
        )
