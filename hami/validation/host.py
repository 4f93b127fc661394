"""Host-escape rules: privileged mode, added capabilities, host namespaces, Windows HostProcess and
container runtime sockets, in every container kind (init and ephemeral too) and at pod level.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from hami.validation.hostpaths import exposes_runtime_socket, normalise
from hami.validation.model import Finding
from hami.workloads import PodTemplate

# Pod Security Standards "baseline": the only capabilities a container may add.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
_HOST_NAMESPACES = (("hostNetwork", "host-network"), ("hostPID", "host-pid"), ("hostIPC", "host-ipc"))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _name(container: Mapping[str, Any], kind: str, index: int) -> str:
    name = container.get("name")
    return name if isinstance(name, str) and name else f"{kind}[{index}]"


def capability_name(raw: str) -> str:
    """`cap_sys_admin`, `CAP_SYS_ADMIN` and `SYS_ADMIN` are the same capability."""
    name = raw.strip().upper()
    return name[4:] if name.startswith("CAP_") else name


def _container_findings(container: Mapping[str, Any], kind: str, index: int, base: str) -> Iterator[Finding]:
    name = _name(container, kind, index)
    path = f"{base}.{kind}[{index}].securityContext"
    security = _mapping(container.get("securityContext"))
    if security.get("privileged") is True:
        yield Finding("privileged", "privileged", f"{path}.privileged", name)
    added = _mapping(security.get("capabilities")).get("add")
    if isinstance(added, list):
        for position, capability in enumerate(added):
            if isinstance(capability, str) and capability_name(capability) not in BASELINE_CAPABILITIES:
                yield Finding(
                    "capabilities",
                    "capability",
                    f"{path}.capabilities.add[{position}]",
                    name,
                    {"capability": capability},
                )
    if _mapping(security.get("windowsOptions")).get("hostProcess") is True:
        yield Finding("host-process", "host-process", f"{path}.windowsOptions.hostProcess", name)


def _socket_findings(template: PodTemplate, extra_sockets: tuple[str, ...]) -> Iterator[Finding]:
    """One finding per container mounting a socket volume, and one per such volume nobody mounts.

    Per container, so that on a Pod UPDATE an ephemeral container newly mounting an old volume is a new
    finding; unmounted volumes still count, because `kubectl debug` can mount them later.
    """
    spec = template.spec
    volumes = spec.get("volumes")
    exposing: dict[str, tuple[int, str]] = {}
    for index, volume in enumerate(volumes if isinstance(volumes, list) else []):
        host_path = _mapping(_mapping(volume).get("hostPath")).get("path")
        if isinstance(host_path, str) and exposes_runtime_socket(host_path, extra_sockets):
            exposing[str(_mapping(volume).get("name", f"volumes[{index}]"))] = (index, host_path)
    if not exposing:
        return
    mounted: set[str] = set()
    for kind, index, container in template.containers():
        mounts = container.get("volumeMounts")
        for position, mount in enumerate(mounts if isinstance(mounts, list) else []):
            volume_name = _mapping(mount).get("name")
            if volume_name not in exposing:
                continue
            mounted.add(volume_name)
            volume_index, host_path = exposing[volume_name]
            yield Finding(
                "runtime-socket",
                "socket-mounted",
                f"{template.path}.{kind}[{index}].volumeMounts[{position}]",
                _name(container, kind, index),
                {
                    "volume": volume_name,
                    "host_path": host_path,
                    "normal": normalise(host_path),
                    "volume_path": f"{template.path}.volumes[{volume_index}].hostPath.path",
                },
            )
    for volume_name, (volume_index, host_path) in exposing.items():
        if volume_name not in mounted:
            yield Finding(
                "runtime-socket",
                "socket-volume",
                f"{template.path}.volumes[{volume_index}].hostPath.path",
                None,
                {"volume": volume_name, "host_path": host_path, "normal": normalise(host_path)},
            )


def host_findings(template: PodTemplate, extra_sockets: tuple[str, ...] = ()) -> Iterator[Finding]:
    spec = template.spec
    for field, rule in _HOST_NAMESPACES:
        if spec.get(field) is True:
            yield Finding(rule, rule, f"{template.path}.{field}")
    pod_security = _mapping(spec.get("securityContext"))
    if _mapping(pod_security.get("windowsOptions")).get("hostProcess") is True:
        yield Finding("host-process", "host-process-pod", f"{template.path}.securityContext.windowsOptions.hostProcess")
    for kind, index, container in template.containers():
        yield from _container_findings(container, kind, index, template.path)
    yield from _socket_findings(template, extra_sockets)
