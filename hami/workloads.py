"""Pod specs out of Pods and pod controllers, with the JSON pointer to each.

Validation runs on every pod spec an object carries (a Deployment's template is refused at apply time
instead of failing on every replica later); mutation only ever touches a bare Pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

# kind -> path of the pod template's metadata/spec parent inside the object.
TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
HANDLED_KINDS = frozenset(TEMPLATE_PATHS) | {"Pod"}
CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")


class WorkloadError(ValueError):
    """The object is not shaped like its kind (e.g. spec.template is a list)."""


class PodTemplate(NamedTuple):
    """One pod spec inside an object (a NamedTuple: immutable, and cheaper to build than a frozen
    dataclass on a path every admission takes).

    `path` is the dotted field path for messages ("spec.template.spec"), `pointer` the RFC 6901
    pointer of the same place for patches ("/spec/template/spec").
    """

    kind: str  # kind of the object that carries it
    name: str  # object name, or generateName + "*" when the name is not chosen yet
    namespace: str
    metadata: Mapping[str, Any]  # the pod's metadata (template metadata for controllers)
    spec: Mapping[str, Any]
    path: str
    pointer: str
    # Read once when the template is made (shape errors surface there); every rule reuses it.
    container_list: tuple[tuple[str, int, Mapping[str, Any]], ...] = ()

    @property
    def labels(self) -> Mapping[str, str]:
        labels = self.metadata.get("labels")
        return labels if isinstance(labels, dict) else {}

    @property
    def annotations(self) -> Mapping[str, str]:
        annotations = self.metadata.get("annotations")
        return annotations if isinstance(annotations, dict) else {}

    def containers(self) -> tuple[tuple[str, int, Mapping[str, Any]], ...]:
        """(container kind, index, container) for every container of every kind."""
        return self.container_list


def read_containers(spec: Mapping[str, Any], path: str) -> tuple[tuple[str, int, Mapping[str, Any]], ...]:
    # isinstance(x, dict), not Mapping: the objects come from JSON/YAML, and the ABC check costs
    # several times more on a path that runs for every container of every admission.
    found: list[tuple[str, int, Mapping[str, Any]]] = []
    for kind in CONTAINER_KINDS:
        items = spec.get(kind) or []
        if not isinstance(items, list):
            raise WorkloadError(f"{path}.{kind} must be a list")
        for index, container in enumerate(items):
            if not isinstance(container, dict):
                raise WorkloadError(f"{path}.{kind}[{index}] must be an object")
            found.append((kind, index, container))
    return tuple(found)


def object_name(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        return ""
    name = metadata.get("name")
    if isinstance(name, str) and name:
        return name
    generate = metadata.get("generateName")
    return f"{generate}*" if isinstance(generate, str) and generate else ""


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WorkloadError(f"{where} must be an object")
    return value


def pod_templates(obj: Mapping[str, Any], namespace: str = "") -> list[PodTemplate]:
    """Every pod spec the object carries; empty for kinds the webhook does not handle."""
    kind = obj.get("kind")
    metadata = _mapping(obj.get("metadata"), "metadata")
    ns = metadata.get("namespace") or namespace or ""
    if not isinstance(ns, str):
        raise WorkloadError("metadata.namespace must be a string")
    name = object_name(obj)
    if kind == "Pod":
        spec = _mapping(obj.get("spec"), "spec")
        return [PodTemplate("Pod", name, ns, metadata, spec, "spec", "/spec", read_containers(spec, "spec"))]
    path = TEMPLATE_PATHS.get(kind) if isinstance(kind, str) else None
    if path is None:
        return []
    node: Any = obj
    for depth, key in enumerate(path):
        node = _mapping(node.get(key), ".".join(path[: depth + 1]))
    dotted = ".".join(path)
    pointer = "/" + "/".join(path)
    spec = _mapping(node.get("spec"), f"{dotted}.spec")
    return [
        PodTemplate(
            kind,
            name,
            ns,
            _mapping(node.get("metadata"), f"{dotted}.metadata"),
            spec,
            f"{dotted}.spec",
            f"{pointer}/spec",
            read_containers(spec, f"{dotted}.spec"),
        )
    ]
