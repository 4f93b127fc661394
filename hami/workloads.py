"""Pod specs out of Pods and pod controllers, with the JSON pointer to each.

Validation runs on every pod spec an object carries (a Deployment's template is refused at apply time
instead of failing on every replica later); mutation only ever touches a bare Pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True, slots=True)
class PodTemplate:
    """One pod spec inside an object.

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

    @property
    def labels(self) -> Mapping[str, str]:
        labels = self.metadata.get("labels")
        return labels if isinstance(labels, Mapping) else {}

    @property
    def annotations(self) -> Mapping[str, str]:
        annotations = self.metadata.get("annotations")
        return annotations if isinstance(annotations, Mapping) else {}

    def containers(self) -> list[tuple[str, int, Mapping[str, Any]]]:
        """(container kind, index, container) for every container of every kind."""
        found: list[tuple[str, int, Mapping[str, Any]]] = []
        for kind in CONTAINER_KINDS:
            items = self.spec.get(kind) or []
            if not isinstance(items, list):
                raise WorkloadError(f"{self.path}.{kind} must be a list")
            for index, container in enumerate(items):
                if not isinstance(container, Mapping):
                    raise WorkloadError(f"{self.path}.{kind}[{index}] must be an object")
                found.append((kind, index, container))
        return found


def object_name(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return ""
    name = metadata.get("name")
    if isinstance(name, str) and name:
        return name
    generate = metadata.get("generateName")
    return f"{generate}*" if isinstance(generate, str) and generate else ""


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
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
        return [PodTemplate("Pod", name, ns, metadata, _mapping(obj.get("spec"), "spec"), "spec", "/spec")]
    path = TEMPLATE_PATHS.get(kind) if isinstance(kind, str) else None
    if path is None:
        return []
    node: Any = obj
    for depth, key in enumerate(path):
        node = _mapping(node.get(key), ".".join(path[: depth + 1]))
    dotted = ".".join(path)
    pointer = "/" + "/".join(path)
    return [
        PodTemplate(
            kind,
            name,
            ns,
            _mapping(node.get("metadata"), f"{dotted}.metadata"),
            _mapping(node.get("spec"), f"{dotted}.spec"),
            f"{dotted}.spec",
            f"{pointer}/spec",
        )
    ]
