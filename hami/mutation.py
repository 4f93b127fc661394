"""A placement decision as an RFC 6902 JSON patch on the Pod. Pure functions.

Rules that keep the patch safe on any pod kube-apiserver may send:
- every `add` targets a parent that exists in *this* pod (missing parents are added whole);
- the pod's own nodeSelector and required node affinity are intersected, never replaced: the
  hostname requirement is ANDed into every existing nodeSelectorTerm;
- env entries the pod already has under our names are replaced in place, not duplicated;
- a pod that already carries `hami.io/injected: "true"` gets no patch at all (reinvocation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

INJECTED = "hami.io/injected"
NODE = "hami.io/vgpu-node"
DEVICES = "hami.io/vgpu-devices-allocated"
DECISION = "hami.io/decision"
RESERVATION = "hami.io/reservation"
QUEUED = "hami.io/queued"
HOSTNAME_KEY = "kubernetes.io/hostname"

Patch = list[dict[str, Any]]


def escape(token: str) -> str:
    """RFC 6901: '~' -> '~0', '/' -> '~1' (annotation keys such as hami.io/injected)."""
    return token.replace("~", "~0").replace("/", "~1")


def already_injected(metadata: Mapping[str, Any]) -> bool:
    annotations = metadata.get("annotations")
    return isinstance(annotations, Mapping) and annotations.get(INJECTED) == "true"


def annotation_ops(metadata: Mapping[str, Any], values: Mapping[str, str]) -> Patch:
    existing = metadata.get("annotations")
    if not isinstance(existing, Mapping):
        return [{"op": "add", "path": "/metadata/annotations", "value": dict(values)}]
    return [
        {"op": "replace" if key in existing else "add", "path": f"/metadata/annotations/{escape(key)}", "value": value}
        for key, value in values.items()
    ]


def env_ops(container: Mapping[str, Any], index: int, values: Sequence[tuple[str, str]]) -> Patch:
    base = f"/spec/containers/{index}/env"
    env = container.get("env")
    if not isinstance(env, list):
        return [{"op": "add", "path": base, "value": [{"name": k, "value": v} for k, v in values]}]
    position = {e.get("name"): i for i, e in enumerate(env) if isinstance(e, Mapping)}
    ops: Patch = []
    for name, value in values:
        entry = {"name": name, "value": value}
        if name in position:
            ops.append({"op": "replace", "path": f"{base}/{position[name]}", "value": entry})
        else:
            ops.append({"op": "add", "path": f"{base}/-", "value": entry})
    return ops


def required_affinity_ops(spec: Mapping[str, Any], expression: Mapping[str, Any]) -> Patch:
    """AND `expression` into the pod's required node affinity, creating what is missing."""
    required = {"nodeSelectorTerms": [{"matchExpressions": [dict(expression)]}]}
    affinity = spec.get("affinity")
    if not isinstance(affinity, Mapping):
        return [
            {
                "op": "add",
                "path": "/spec/affinity",
                "value": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}},
            }
        ]
    node_affinity = affinity.get("nodeAffinity")
    if not isinstance(node_affinity, Mapping):
        return [
            {
                "op": "add",
                "path": "/spec/affinity/nodeAffinity",
                "value": {"requiredDuringSchedulingIgnoredDuringExecution": required},
            }
        ]
    base = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
    current = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = current.get("nodeSelectorTerms") if isinstance(current, Mapping) else None
    if not isinstance(terms, list) or not terms:
        return [{"op": "add", "path": base, "value": required}]
    ops: Patch = []
    for i, term in enumerate(terms):
        expressions = term.get("matchExpressions") if isinstance(term, Mapping) else None
        if isinstance(expressions, list):
            ops.append(
                {"op": "add", "path": f"{base}/nodeSelectorTerms/{i}/matchExpressions/-", "value": dict(expression)}
            )
        else:
            ops.append(
                {"op": "add", "path": f"{base}/nodeSelectorTerms/{i}/matchExpressions", "value": [dict(expression)]}
            )
    return ops


def preferred_affinity_ops(spec: Mapping[str, Any], nodes: Sequence[str], key: str) -> Patch:
    """Preferred affinity weighted by rank (first choice 100, then lower), appended to the pod's own."""
    weights = [max(1, 100 - i * (100 // max(1, len(nodes)))) for i in range(len(nodes))]
    items = [
        {"weight": w, "preference": {"matchExpressions": [{"key": key, "operator": "In", "values": [n]}]}}
        for w, n in zip(weights, nodes, strict=True)
    ]
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    current = (
        node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node_affinity, Mapping)
        else None
    )
    base = "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution"
    if isinstance(current, list):
        return [{"op": "add", "path": f"{base}/-", "value": item} for item in items]
    return [{"op": "add", "path": base, "value": items}]


def device_env(devices: Sequence[Any]) -> list[tuple[str, str]]:
    """HAMi-core's variables for one container's devices (memory limit per visible index)."""
    uuids = ",".join([d.uuid for d in devices])
    values = [("NVIDIA_VISIBLE_DEVICES", uuids), ("HAMI_VGPU_UUID", uuids)]
    cores = 0
    for i, d in enumerate(devices):  # one plain loop: every GPU admission runs this
        values.append((f"CUDA_DEVICE_MEMORY_LIMIT_{i}", f"{d.memory_mib}m"))
        if d.cores > cores:
            cores = d.cores
    if cores and cores < 100:
        values.append(("CUDA_DEVICE_SM_LIMIT", str(cores)))
    return values


def devices_annotation(devices_by_container: Sequence[Sequence[Any]]) -> str:
    """HAMi's format: 'UUID,NVIDIA,memMiB,cores:' per device, ';' after each container."""
    parts = []
    for devices in devices_by_container:
        parts.extend([f"{d.uuid},NVIDIA,{d.memory_mib},{d.cores}:" for d in devices])
        parts.append(";")
    return "".join(parts)


def pin_patch(pod: Mapping[str, Any], decision: Any, reservation_key: str, topology_key: str = HOSTNAME_KEY) -> Patch:
    """Pin the pod to the decision's node and hand each container its devices."""
    spec = pod.get("spec") or {}
    metadata = pod.get("metadata") or {}
    containers = spec.get("containers") or []
    by_container: dict[int, list[Any]] = {}
    for device in decision.devices:
        by_container.setdefault(device.container_index, []).append(device)
    ops = required_affinity_ops(spec, {"key": topology_key, "operator": "In", "values": [decision.node]})
    indices = sorted(by_container)
    for index in indices:
        ops += env_ops(containers[index], index, device_env(by_container[index]))
    ops += annotation_ops(
        metadata,
        {
            INJECTED: "true",
            NODE: decision.node,
            DEVICES: devices_annotation([by_container[i] for i in indices]),
            DECISION: decision.explain(),
            RESERVATION: reservation_key,
        },
    )
    return ops


def shortlist_patch(pod: Mapping[str, Any], nodes: Sequence[str], explanation: str, topology_key: str) -> Patch:
    """Restrict to the top-K nodes and prefer them by rank; kube-scheduler picks among them."""
    spec = pod.get("spec") or {}
    # Patch operations apply in order, so the preferred terms can go under a nodeAffinity that
    # the required-affinity operations have just created.
    ops = required_affinity_ops(spec, {"key": topology_key, "operator": "In", "values": list(nodes)})
    ops += preferred_affinity_ops(spec, nodes, topology_key)
    ops += annotation_ops(pod.get("metadata") or {}, {INJECTED: "true", DECISION: explanation})
    return ops


def queue_patch(pod: Mapping[str, Any], gate: str, reason: str) -> Patch:
    """Hold the pod with a scheduling gate until capacity appears (the collector removes it)."""
    spec = pod.get("spec") or {}
    gates = spec.get("schedulingGates")
    entry = {"name": gate}
    if isinstance(gates, list):
        ops: Patch = (
            []
            if any(isinstance(g, Mapping) and g.get("name") == gate for g in gates)
            else [{"op": "add", "path": "/spec/schedulingGates/-", "value": entry}]
        )
    else:
        ops = [{"op": "add", "path": "/spec/schedulingGates", "value": [entry]}]
    return ops + annotation_ops(pod.get("metadata") or {}, {QUEUED: "true", DECISION: reason})


def note_patch(pod: Mapping[str, Any], explanation: str) -> Patch:
    """Only explain (on_no_fit=allow, hands-off schedulers): kube-scheduler decides alone."""
    return annotation_ops(pod.get("metadata") or {}, {DECISION: explanation})
