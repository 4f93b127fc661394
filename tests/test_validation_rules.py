"""Table-driven tests: every rule x container kind x workload kind, and the path normalisation."""

from __future__ import annotations

from typing import Any

import pytest

from hami.validation import (
    Mode,
    NamespaceUsage,
    ValidationContext,
    ValidationSettings,
    Violation,
    exposes_runtime_socket,
    validate,
)
from hami.validation.hostpaths import normalise
from hami.workloads import pod_templates

WORKLOAD_KINDS = ("Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob")
TEMPLATE_PATH = {kind: "spec.template.spec" for kind in WORKLOAD_KINDS} | {
    "Pod": "spec",
    "CronJob": "spec.jobTemplate.spec.template.spec",
}
ALL_CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")
# Ephemeral containers cannot have resources, so resource rules apply to the other two kinds.
RESOURCE_CONTAINER_KINDS = ("containers", "initContainers")


def workload(
    kind: str, spec: dict[str, Any], labels: dict[str, str] | None = None, name: str = "w", namespace: str = "team-a"
) -> dict[str, Any]:
    """`spec` as the pod spec of an object of `kind`."""
    metadata = {"name": name, "namespace": namespace}
    template = {"metadata": {"labels": dict(labels or {})}, "spec": spec}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {**metadata, "labels": dict(labels or {})}, "spec": spec}
    if kind == "CronJob":
        return {
            "apiVersion": "batch/v1",
            "kind": kind,
            "metadata": metadata,
            "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": template}}},
        }
    return {"kind": kind, "metadata": metadata, "spec": {"template": template}}


def pod_spec(container_kind: str, container: dict[str, Any], **pod_fields: Any) -> dict[str, Any]:
    """A pod spec with `container` (named 'subject') placed in `container_kind`, beside a plain app container."""
    subject = {"name": "subject", "image": "busybox", **container}
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "busybox"}], **pod_fields}
    if container_kind == "containers":
        spec["containers"] = [subject]
    else:
        spec[container_kind] = [subject]
    return spec


def run(
    obj: dict[str, Any],
    settings: ValidationSettings | None = None,
    namespace: str = "team-a",
    **ctx: Any,
) -> list[Violation]:
    context = ValidationContext(ctx.pop("operation", "CREATE"), namespace, **ctx)
    return validate(obj, pod_templates(obj, namespace), context, settings or ValidationSettings())


def fired(violations: list[Violation]) -> set[str]:
    return {v.rule for v in violations}


HOST_CONTAINER_CASES: list[tuple[str, dict[str, Any], str, Mode]] = [
    ("privileged", {"securityContext": {"privileged": True}}, "securityContext.privileged", Mode.ENFORCE),
    (
        "capabilities",
        {"securityContext": {"capabilities": {"add": ["CHOWN", "SYS_ADMIN"]}}},
        "securityContext.capabilities.add[1]",
        Mode.WARN,
    ),
    (
        "capabilities",
        {"securityContext": {"capabilities": {"add": ["ALL"]}}},
        "securityContext.capabilities.add[0]",
        Mode.WARN,
    ),
    (
        "capabilities",
        {"securityContext": {"capabilities": {"add": ["cap_net_admin"]}}},
        "securityContext.capabilities.add[0]",
        Mode.WARN,
    ),
    (
        "host-process",
        {"securityContext": {"windowsOptions": {"hostProcess": True}}},
        "securityContext.windowsOptions.hostProcess",
        Mode.WARN,
    ),
    ("runtime-socket", {"volumeMounts": [{"name": "sock", "mountPath": "/s"}]}, "volumeMounts[0]", Mode.ENFORCE),
]


@pytest.mark.parametrize("workload_kind", WORKLOAD_KINDS)
@pytest.mark.parametrize("container_kind", ALL_CONTAINER_KINDS)
@pytest.mark.parametrize(("rule", "container", "suffix", "mode"), HOST_CONTAINER_CASES)
def test_host_rules_in_every_container_kind_and_workload(
    workload_kind: str, container_kind: str, rule: str, container: dict[str, Any], suffix: str, mode: Mode
) -> None:
    volumes = [{"name": "sock", "hostPath": {"path": "/var/run/docker.sock"}}]
    obj = workload(workload_kind, pod_spec(container_kind, container, volumes=volumes))
    violations = [v for v in run(obj) if v.rule == rule]
    assert len(violations) == 1
    index = 0
    expected_path = f"{TEMPLATE_PATH[workload_kind]}.{container_kind}[{index}].{suffix}"
    assert violations[0].path == expected_path
    assert violations[0].mode is mode
    assert violations[0].message.startswith(f"{workload_kind} team-a/w, container 'subject' ({expected_path}): ")
    assert fired(run(workload(workload_kind, pod_spec(container_kind, {}, volumes=[])))) == set()


@pytest.mark.parametrize("workload_kind", WORKLOAD_KINDS)
@pytest.mark.parametrize(
    ("pod_fields", "rule", "suffix"),
    [
        ({"hostNetwork": True}, "host-network", "hostNetwork"),
        ({"hostPID": True}, "host-pid", "hostPID"),
        ({"hostIPC": True}, "host-ipc", "hostIPC"),
        (
            {"securityContext": {"windowsOptions": {"hostProcess": True}}},
            "host-process",
            "securityContext.windowsOptions.hostProcess",
        ),
    ],
)
def test_pod_level_host_rules_in_every_workload(
    workload_kind: str, pod_fields: dict[str, Any], rule: str, suffix: str
) -> None:
    violations = run(workload(workload_kind, pod_spec("containers", {}, **pod_fields)))
    assert [(v.rule, v.path, v.mode) for v in violations] == [
        (rule, f"{TEMPLATE_PATH[workload_kind]}.{suffix}", Mode.WARN)
    ]
    assert ", container" not in violations[0].message


@pytest.mark.parametrize(
    "securityContext",
    [
        {"privileged": False},
        {"capabilities": {"add": ["NET_BIND_SERVICE", "CAP_CHOWN", "setuid", "Kill"], "drop": ["ALL"]}},
        {"capabilities": {"drop": ["SYS_ADMIN"]}},
        {"windowsOptions": {"hostProcess": False}},
        {"allowPrivilegeEscalation": False, "runAsNonRoot": True},
    ],
)
def test_safe_security_contexts_pass(securityContext: dict[str, Any]) -> None:
    for kind in ALL_CONTAINER_KINDS:
        assert run(workload("Pod", pod_spec(kind, {"securityContext": securityContext}))) == []


def test_socket_volume_names_every_mounting_container_and_unmounted_volumes() -> None:
    spec = {
        "initContainers": [{"name": "fetch", "volumeMounts": [{"name": "run", "mountPath": "/r"}]}],
        "containers": [
            {"name": "app", "volumeMounts": [{"name": "data", "mountPath": "/d"}, {"name": "run", "mountPath": "/r"}]}
        ],
        "volumes": [
            {"name": "data", "hostPath": {"path": "/data"}},
            {"name": "run", "hostPath": {"path": "/var/run/"}},
            {"name": "spare", "hostPath": {"path": "/run/crio"}},
        ],
    }
    violations = run(workload("Deployment", spec))
    assert [(v.rule, v.path) for v in violations] == [
        ("runtime-socket", "spec.template.spec.initContainers[0].volumeMounts[0]"),
        ("runtime-socket", "spec.template.spec.containers[0].volumeMounts[1]"),
        ("runtime-socket", "spec.template.spec.volumes[2].hostPath.path"),
    ]
    assert "container 'fetch'" in violations[0].message and "volume 'run'" in violations[0].message
    assert "spec.template.spec.volumes[1].hostPath.path" in violations[1].message
    assert "/run/crio" in violations[2].message


SOCKET_PATHS = [
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/var/run/containerd/containerd.sock",
    "/run/containerd/containerd.sock",
    "/run/crio/crio.sock",
    "/var/run/crio/crio.sock",
    "/var/run/cri-dockerd.sock",
    "/run/k3s/containerd/containerd.sock",
    "/var/run",
    "/run",
    "/run/containerd",
    "/run/k3s",
    "/var",
    "/",
    "//var//run//docker.sock",
    "/var/run/./docker.sock",
    "/var/lib/../run/docker.sock",
    "/run/containerd/",
    "/var/run/",
    "///",
    "/../var/run/crio/../containerd/containerd.sock",
    "var/run/docker.sock",
    "/srv/docker/docker.sock",
    "/var/snap/docker/common/run/docker.sock",
    "\\\\.\\pipe\\docker_engine",
    "//./pipe/containerd-containerd",
]
SAFE_PATHS = [
    "/data",
    "/var/log",
    "/var/lib/kubelet/device-plugins",
    "/run/user/1000",
    "/var/run/nvidia-persistenced",
    "/dev/shm",
    "/etc/ssl/certs",
    "/var/lib/docker.sock.d",
    "/run/containerd-extra",
    "/var/runner",
    "\\\\.\\pipe\\my-app",
]


@pytest.mark.parametrize("path", SOCKET_PATHS)
def test_runtime_socket_paths_after_normalisation(path: str) -> None:
    assert exposes_runtime_socket(path)
    obj = workload(
        "Pod",
        pod_spec(
            "containers",
            {"volumeMounts": [{"name": "v", "mountPath": "/v"}]},
            volumes=[{"name": "v", "hostPath": {"path": path}}],
        ),
    )
    assert fired(run(obj)) == {"runtime-socket"}


@pytest.mark.parametrize("path", SAFE_PATHS)
def test_other_host_paths_are_not_runtime_sockets(path: str) -> None:
    assert not exposes_runtime_socket(path)


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("/var/run/x", "/run/x"),
        ("//a//b/", "/a/b"),
        ("/a/./b/../c", "/a/c"),
        ("/var/run", "/run"),
        ("/var/runner", "/var/runner"),
        ("", "/"),
    ],
)
def test_normalise(raw: str, normal: str) -> None:
    assert normalise(raw) == normal


def test_extra_runtime_sockets_from_settings_and_their_directories() -> None:
    settings = ValidationSettings(extra_runtime_sockets=("/opt/runtime/api.sock",))
    for path in ("/opt/runtime/api.sock", "/opt/runtime", "/opt"):
        spec = pod_spec(
            "containers",
            {"volumeMounts": [{"name": "v", "mountPath": "/v"}]},
            volumes=[{"name": "v", "hostPath": {"path": path}}],
        )
        assert fired(run(workload("Pod", spec), settings)) == {"runtime-socket"}
        assert fired(run(workload("Pod", spec))) == set()


def gpu(**limits: Any) -> dict[str, Any]:
    return {"resources": {"limits": limits}}


RESOURCE_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("gpu-count", gpu(**{"nvidia.com/gpu": 3}), "resources.limits[nvidia.com/gpu]"),
    ("gpu-count", gpu(**{"hami.io/vgpu": 4, "hami.io/vgpu-memory": "1Gi"}), "resources.limits[hami.io/vgpu]"),
    (
        "vgpu-memory-required",
        gpu(**{"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30}),
        "resources.limits[nvidia.com/gpucores]",
    ),
    ("vgpu-memory-required", gpu(**{"hami.io/vgpu-cores": 50}), "resources.limits[hami.io/vgpu-cores]"),
    ("vgpu-memory-max", gpu(**{"hami.io/vgpu-memory": "96Gi"}), "resources.limits[hami.io/vgpu-memory]"),
    ("vgpu-granularity", gpu(**{"nvidia.com/gpumem": 3000}), "resources.limits[nvidia.com/gpumem]"),
    ("vgpu-range", gpu(**{"nvidia.com/gpumem-percentage": 101}), "resources.limits[nvidia.com/gpumem-percentage]"),
    (
        "vgpu-range",
        gpu(**{"nvidia.com/gpumem": 1024, "nvidia.com/gpucores": 150}),
        "resources.limits[nvidia.com/gpucores]",
    ),
    ("vgpu-range", gpu(**{"nvidia.com/gpumem": 0}), "resources.limits[nvidia.com/gpumem]"),
    ("malformed-quantity", gpu(**{"nvidia.com/gpu": "two"}), "resources.limits[nvidia.com/gpu]"),
    ("malformed-quantity", gpu(**{"nvidia.com/gpu": "1.5"}), "resources.limits[nvidia.com/gpu]"),
    ("malformed-quantity", gpu(**{"hami.io/vgpu-memory": "8GB"}), "resources.limits[hami.io/vgpu-memory]"),
    ("malformed-quantity", gpu(**{"nvidia.com/gpumem": -1024}), "resources.limits[nvidia.com/gpumem]"),
    ("malformed-quantity", gpu(**{"nvidia.com/gpucores": [50]}), "resources.limits[nvidia.com/gpucores]"),
    (
        "extended-overcommit",
        {"resources": {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}}},
        "resources.requests[nvidia.com/gpu]",
    ),
    ("extended-overcommit", {"resources": {"requests": {"nvidia.com/gpu": 1}}}, "resources.requests[nvidia.com/gpu]"),
    (
        "extended-overcommit",
        {"resources": {"requests": {"example.com/fpga": 1}, "limits": {"example.com/fpga": 2}}},
        "resources.requests[example.com/fpga]",
    ),
]


@pytest.mark.parametrize("workload_kind", WORKLOAD_KINDS)
@pytest.mark.parametrize("container_kind", RESOURCE_CONTAINER_KINDS)
@pytest.mark.parametrize(("rule", "container", "suffix"), RESOURCE_CASES)
def test_resource_rules_in_every_container_kind_and_workload(
    workload_kind: str, container_kind: str, rule: str, container: dict[str, Any], suffix: str
) -> None:
    violations = run(workload(workload_kind, pod_spec(container_kind, container)))
    assert fired(violations) == {rule}
    expected = f"{TEMPLATE_PATH[workload_kind]}.{container_kind}[0].{suffix}"
    assert [v.path for v in violations] == [expected]
    assert all(v.mode is Mode.ENFORCE for v in violations)


@pytest.mark.parametrize(
    "container",
    [
        gpu(**{"nvidia.com/gpu": 2}),
        gpu(**{"nvidia.com/gpu": "2"}),
        gpu(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096, "nvidia.com/gpucores": 30}),
        gpu(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100, "nvidia.com/gpucores": 0}),
        gpu(**{"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100}),
        gpu(**{"hami.io/vgpu-memory": "8Gi", "hami.io/vgpu-cores": 25}),
        gpu(**{"hami.io/vgpu-memory": "80Gi"}),
        gpu(**{"hami.io/vgpu-memory": "0.5Gi"}),
        {
            "resources": {
                "requests": {"nvidia.com/gpu": "1", "cpu": "500m"},
                "limits": {"nvidia.com/gpu": 1, "cpu": "1"},
            }
        },
        {"resources": {"requests": {"cpu": "1", "memory": "1Gi", "hugepages-2Mi": "64Mi"}}},
    ],
)
def test_compliant_gpu_requests_pass(container: dict[str, Any]) -> None:
    for kind in RESOURCE_CONTAINER_KINDS:
        assert run(workload("Pod", pod_spec(kind, container))) == []


@pytest.mark.parametrize(
    ("init", "apps", "expected"),
    [
        ([], [1, 1], 2),
        ([3], [1], 3),
        ([1], [2], 2),
        ([2, 3], [1], 3),
        ([("sidecar", 1)], [2], 3),
        ([("sidecar", 1), 2], [1], 3),
        ([2, ("sidecar", 1)], [1], 2),
    ],
)
def test_gpu_count_uses_the_effective_request(init: list[Any], apps: list[int], expected: int) -> None:
    def container(name: str, count: int | tuple[str, int]) -> dict[str, Any]:
        if isinstance(count, tuple):
            return {"name": name, "restartPolicy": "Always", **gpu(**{"nvidia.com/gpu": count[1]})}
        return {"name": name, **gpu(**{"nvidia.com/gpu": count})}

    spec = {
        "initContainers": [container(f"init{i}", c) for i, c in enumerate(init)],
        "containers": [container(f"app{i}", c) for i, c in enumerate(apps)],
    }
    capped = ValidationSettings(gpu_cap_default=expected - 1)
    violations = run(workload("Job", spec), capped)
    assert fired(violations) == {"gpu-count"}
    assert f"asks for {expected} GPUs" in violations[0].message
    assert run(workload("Job", spec), ValidationSettings(gpu_cap_default=expected)) == []


SOCKET_VOLUME = [{"name": "sock", "hostPath": {"path": "/run/containerd/containerd.sock"}}]
# rule -> (container, pod fields) that makes exactly that rule fire
TRIGGERS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "privileged": ({"securityContext": {"privileged": True}}, {}),
    "capabilities": ({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}, {}),
    "host-network": ({}, {"hostNetwork": True}),
    "host-pid": ({}, {"hostPID": True}),
    "host-ipc": ({}, {"hostIPC": True}),
    "host-process": ({"securityContext": {"windowsOptions": {"hostProcess": True}}}, {}),
    "runtime-socket": ({"volumeMounts": [{"name": "sock", "mountPath": "/s"}]}, {"volumes": SOCKET_VOLUME}),
    "gpu-count": (gpu(**{"nvidia.com/gpu": 3}), {}),
    "vgpu-memory-required": (gpu(**{"nvidia.com/gpucores": 50}), {}),
    "vgpu-memory-max": (gpu(**{"nvidia.com/gpumem": 163840}), {}),
    "vgpu-granularity": (gpu(**{"nvidia.com/gpumem": 1000}), {}),
    "vgpu-range": (gpu(**{"nvidia.com/gpumem-percentage": 200}), {}),
    "malformed-quantity": (gpu(**{"nvidia.com/gpu": "one"}), {}),
    "extended-overcommit": ({"resources": {"requests": {"nvidia.com/gpu": 1}}}, {}),
    "tenant-quota": (gpu(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192}), {}),
}
QUOTA_SETTINGS = {"quotas": {"team-a": {"memory": "4Gi"}}}


def test_every_rule_has_a_trigger() -> None:
    assert set(TRIGGERS) == set(ValidationSettings().rules)


@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("rule", sorted(TRIGGERS))
def test_every_rule_in_every_mode(rule: str, mode: Mode) -> None:
    container, pod_fields = TRIGGERS[rule]
    quota = QUOTA_SETTINGS if rule == "tenant-quota" else {}
    settings = ValidationSettings().with_overrides({**quota, "rules": {rule: mode.value}})
    violations = run(workload("Pod", pod_spec("containers", container, **pod_fields)), settings)
    assert {v.rule for v in violations} == (set() if mode is Mode.OFF else {rule})
    assert {v.mode for v in violations} <= {mode}


@pytest.mark.parametrize("workload_kind", WORKLOAD_KINDS)
def test_quota_counts_live_usage_only_for_pods(workload_kind: str) -> None:
    settings = ValidationSettings(quotas={"team-a": {"gpus": 2}})
    obj = workload(workload_kind, pod_spec("containers", gpu(**{"nvidia.com/gpu": 1})))
    violations = run(obj, settings, usage=NamespaceUsage(gpus=2))
    assert fired(violations) == ({"tenant-quota"} if workload_kind == "Pod" else set())
    too_big = workload(workload_kind, pod_spec("initContainers", gpu(**{"nvidia.com/gpu": 3})))
    assert fired(run(too_big, ValidationSettings(gpu_cap_default=-1, quotas={"team-a": {"gpus": 2}}))) == {
        "tenant-quota"
    }
