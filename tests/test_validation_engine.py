"""Modes, exemptions, opt-out, quotas, UPDATE handling, settings, messages in both languages."""

from __future__ import annotations

import copy
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.requests import ResourceNames
from hami.validation import (
    ALL_RULES,
    SECURITY_RULES,
    Mode,
    NamespaceUsage,
    ValidationSettings,
    pod_gpu_usage,
    render_denial,
    render_warnings,
)
from hami.validation.messages import CATALOGUE, render
from hami.validation.model import Finding
from hami.workloads import pod_templates
from tests.test_validation_rules import fired, gpu, pod_spec, run, workload

PRIVILEGED = {"securityContext": {"privileged": True}}


@pytest.mark.parametrize("mode", list(Mode))
def test_each_mode_is_applied_to_its_rule(mode: Mode) -> None:
    obj = workload("Pod", pod_spec("containers", PRIVILEGED))
    violations = run(obj, ValidationSettings(rules={"privileged": mode.value}))
    if mode is Mode.OFF:
        assert violations == []
    else:
        assert [(v.rule, v.mode) for v in violations] == [("privileged", mode)]
    assert render_warnings(violations) == ([violations[0].warning] if mode is Mode.WARN else [])


@pytest.mark.parametrize(
    ("value", "mode"),
    [({"enabled": False}, None), ({"enabled": True, "mode": "audit"}, Mode.AUDIT), (False, None), ("WARN", Mode.WARN)],
)
def test_rule_settings_accept_enabled_and_mode(value: Any, mode: Mode | None) -> None:
    violations = run(
        workload("Pod", pod_spec("containers", PRIVILEGED)), ValidationSettings(rules={"privileged": value})
    )
    assert [v.mode for v in violations] == ([mode] if mode else [])


def test_rules_left_out_keep_their_defaults() -> None:
    settings = ValidationSettings(rules={"capabilities": "enforce"})
    spec = pod_spec(
        "containers", {"securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}}, hostPID=True
    )
    modes = {v.rule: v.mode for v in run(workload("Pod", spec), settings)}
    assert modes == {"privileged": Mode.ENFORCE, "capabilities": Mode.ENFORCE, "host-pid": Mode.WARN}


@pytest.mark.parametrize(
    "overrides",
    [
        {"rules": {"no-such-rule": "enforce"}},
        {"rules": {"privileged": "deny"}},
        {"rules": {"privileged": {"mode": "warn", "level": 3}}},
        {"language": "fr"},
        {"opt_out_rules": ("privileged",)},
        {"quotas": {"team-a": {"memory": "lots"}}},
        {"quotas": {"team-a": {"gpus": -1}}},
        {"quotas": {"team-a": {"vram": 4}}},
        {"gpu_cap_default": -2},
        {"gpu_cap_namespaces": {"x": "many"}},
        {"memory_granularity_mib": -256},
    ],
)
def test_bad_settings_fail_at_load(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ValidationSettings().with_overrides(overrides)


@pytest.mark.parametrize(
    ("ctx", "exempt"),
    [
        ({"namespace": "kube-system"}, True),
        ({"namespace": "hami-system"}, True),
        ({"namespace": "team-a", "user": "alice"}, False),
        ({"namespace": "team-a", "user": "system:serviceaccount:ci:deployer"}, True),
        ({"namespace": "team-a", "groups": ("system:authenticated", "platform-admins")}, True),
        ({"namespace": "team-a", "groups": ("system:serviceaccounts:kube-system",)}, False),
        ({"namespace": "sandbox-17"}, True),
    ],
)
def test_exempt_namespaces_users_and_groups(ctx: dict[str, Any], exempt: bool) -> None:
    settings = ValidationSettings(
        exempt_namespaces=("kube-system", "hami-system", "sandbox-*"),
        exempt_users=("system:serviceaccount:ci:*",),
        exempt_groups=("platform-admins",),
    )
    namespace = ctx.pop("namespace")
    violations = run(
        workload("Pod", pod_spec("containers", PRIVILEGED), namespace=namespace), settings, namespace, **ctx
    )
    assert (violations == []) is exempt


def test_default_exempt_groups_keep_controller_created_pods_validated() -> None:
    """The replicaset controller creates pods as a kube-system service account: they must still be checked."""
    obj = workload("Pod", pod_spec("containers", gpu(**{"nvidia.com/gpu": 4})))
    groups = ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated")
    assert fired(run(obj, user="system:serviceaccount:kube-system:replicaset-controller", groups=groups)) == {
        "gpu-count"
    }


def test_opt_out_label_skips_resource_rules_never_host_escape() -> None:
    container = {**PRIVILEGED, **gpu(**{"nvidia.com/gpu": 4, "nvidia.com/gpucores": 10})}
    spec = pod_spec("containers", container, hostNetwork=True)
    everything = run(workload("Deployment", spec))
    assert fired(everything) == {"privileged", "gpu-count", "vgpu-memory-required", "host-network"}
    opted = run(workload("Deployment", spec, labels={"hami.io/policy-opt-out": "true"}))
    assert fired(opted) == {"privileged", "host-network"}
    other_value = run(workload("Deployment", spec, labels={"hami.io/policy-opt-out": "yes"}))
    assert fired(other_value) == fired(everything)


def test_opt_out_rules_can_keep_the_quota() -> None:
    settings = ValidationSettings(
        quotas={"team-a": {"gpus": 1}}, opt_out_rules=("gpu-count", "vgpu-memory-required", "vgpu-granularity")
    )
    obj = workload(
        "Pod", pod_spec("containers", gpu(**{"nvidia.com/gpu": 4})), labels={"hami.io/policy-opt-out": "true"}
    )
    assert fired(run(obj, settings)) == {"tenant-quota"}


def test_gpu_cap_per_namespace_and_cap_zero() -> None:
    settings = ValidationSettings(gpu_cap_default=2, gpu_cap_namespaces={"ai-core-production": -1, "web": 0, "big": 4})
    for namespace, count, denied in [
        ("team-a", 3, True),
        ("ai-core-production", 64, False),
        ("web", 1, True),
        ("big", 4, False),
    ]:
        obj = workload("Deployment", pod_spec("containers", gpu(**{"nvidia.com/gpu": count})), namespace=namespace)
        assert (fired(run(obj, settings, namespace)) == {"gpu-count"}) is denied


def test_extra_count_names_from_settings() -> None:
    names = ResourceNames(count=("nvidia.com/gpu", "hami.io/vgpu", "example.com/gpu"))
    obj = workload("Pod", pod_spec("containers", gpu(**{"example.com/gpu": 2, "nvidia.com/gpu": 1})))
    assert fired(run(obj, ValidationSettings(resources=names))) == {"gpu-count"}
    assert run(obj) == []
    assert fired(run(obj, ValidationSettings().with_overrides({"resources": {"count": ["example.com/gpu"]}}))) == set()


def test_largest_card_comes_from_the_live_inventory_else_the_fallback() -> None:
    obj = workload("Pod", pod_spec("containers", gpu(**{"hami.io/vgpu-memory": "32Gi"})))
    assert run(obj) == []  # 80 GiB fallback
    violations = run(obj, largest_card_mib=24576)  # a cluster of 24 GiB cards
    assert fired(violations) == {"vgpu-memory-max"}
    assert "32Gi" in violations[0].message and "24Gi" in violations[0].message
    assert fired(run(obj, ValidationSettings(largest_card_mib_fallback=16384))) == {"vgpu-memory-max"}


def test_granularity_is_configurable() -> None:
    obj = workload("Pod", pod_spec("containers", gpu(**{"nvidia.com/gpumem": 1000})))
    violations = run(obj)
    assert "use 1024 MiB" in violations[0].message
    assert fired(run(obj, ValidationSettings(memory_granularity_mib=0))) == set()
    assert fired(run(obj, ValidationSettings(memory_granularity_mib=8))) == set()
    assert fired(run(obj, ValidationSettings(memory_granularity_mib=512))) == {"vgpu-granularity"}


QUOTA = ValidationSettings(quotas={"team-a": {"memory": "32Gi", "cores": 200, "gpus": 3}})


@pytest.mark.parametrize(
    ("used", "limits", "dimensions"),
    [
        (NamespaceUsage(), {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192}, set()),
        (NamespaceUsage(24576, 100, 2), {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192}, set()),  # exactly at the caps
        (NamespaceUsage(24577, 0, 0), {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192}, {"memory"}),
        (NamespaceUsage(0, 150, 0), {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192}, {"cores"}),
        (NamespaceUsage(0, 0, 3), {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192}, {"count"}),
        (NamespaceUsage(0, 0, 0), {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}, {"memory"}),  # 50% of 80Gi
    ],
)
def test_quota_counts_live_usage_plus_this_pod(
    used: NamespaceUsage, limits: dict[str, Any], dimensions: set[str]
) -> None:
    violations = run(workload("Pod", pod_spec("containers", gpu(**limits))), QUOTA, usage=used)
    assert {v.message.split("'s GPU ")[1].split(" quota")[0] for v in violations} == dimensions
    assert all(v.rule == "tenant-quota" and v.mode is Mode.ENFORCE for v in violations)


def test_quota_denial_shows_used_requested_and_limit() -> None:
    obj = workload("Pod", pod_spec("containers", gpu(**{"nvidia.com/gpu": 1, "hami.io/vgpu-memory": "8Gi"})))
    [violation] = run(obj, QUOTA, usage=NamespaceUsage(memory_mib=30 * 1024))
    assert "used 30Gi + requested 8Gi = 38Gi, limit 32Gi" in violation.message
    [zh] = run(obj, QUOTA.with_overrides({"language": "zh"}), usage=NamespaceUsage(memory_mib=30 * 1024))
    assert "已用 30Gi + 本次申请 8Gi = 38Gi，上限 32Gi" in zh.message


def test_quota_percentages_use_the_live_card_size() -> None:
    obj = workload("Pod", pod_spec("containers", gpu(**{"nvidia.com/gpumem-percentage": 50})))
    assert run(obj, QUOTA, largest_card_mib=49152) == []  # 24 GiB of a 48 GiB card
    assert fired(run(obj, QUOTA, largest_card_mib=98304)) == {"tenant-quota"}  # 48 GiB of 96 GiB


def test_quota_never_refuses_a_pod_for_a_dimension_it_does_not_use() -> None:
    obj = workload("Pod", pod_spec("containers", {}))
    assert run(obj, QUOTA, usage=NamespaceUsage(10**6, 10**4, 100)) == []


def test_controller_templates_are_not_counted_against_live_usage_unless_one_pod_cannot_fit() -> None:
    fits = workload("Deployment", pod_spec("containers", gpu(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192})))
    assert run(fits, QUOTA, usage=NamespaceUsage(32768, 200, 3)) == []
    too_big = workload("CronJob", pod_spec("containers", gpu(**{"nvidia.com/gpu": 2, "nvidia.com/gpumem": 20480})))
    [violation] = run(too_big, QUOTA)
    assert violation.rule == "tenant-quota" and "could never run" in violation.message


def test_default_quota_applies_to_unlisted_namespaces() -> None:
    settings = ValidationSettings(quotas={"team-a": {}}, default_quota={"gpus": 1})
    obj = workload("Pod", pod_spec("containers", gpu(**{"nvidia.com/gpu": 2})), namespace="team-z")
    assert fired(run(obj, settings, "team-z")) == {"tenant-quota"}
    assert run(workload("Pod", pod_spec("containers", gpu(**{"nvidia.com/gpu": 2}))), settings) == []


@pytest.mark.parametrize(
    ("spec", "card", "usage"),
    [
        (pod_spec("containers", gpu(**{"nvidia.com/gpu": 2})), 40960, NamespaceUsage(81920, 200, 2)),
        (
            pod_spec("containers", gpu(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096, "nvidia.com/gpucores": 30})),
            40960,
            NamespaceUsage(4096, 30, 1),
        ),
        (pod_spec("containers", gpu(**{"nvidia.com/gpumem-percentage": 25})), 40960, NamespaceUsage(10240, 100, 1)),
        (
            pod_spec("containers", gpu(**{"hami.io/vgpu": 2, "hami.io/vgpu-memory": "10Gi", "hami.io/vgpu-cores": 20})),
            0,
            NamespaceUsage(20480, 40, 2),
        ),
        (
            pod_spec("initContainers", gpu(**{"nvidia.com/gpu": 3, "nvidia.com/gpumem": 1024})),
            40960,
            NamespaceUsage(3072, 300, 3),
        ),
        (pod_spec("containers", gpu(**{"nvidia.com/gpu": "x"})), 40960, NamespaceUsage()),
        (pod_spec("containers", {}), 40960, NamespaceUsage()),
    ],
)
def test_pod_gpu_usage(spec: dict[str, Any], card: int, usage: NamespaceUsage) -> None:
    [template] = pod_templates(workload("Pod", spec))
    assert pod_gpu_usage(template, card, ResourceNames()) == usage


# ---------------------------------------------------------------- UPDATE


def with_ephemeral(obj: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    new["spec"].setdefault("ephemeralContainers", []).append(
        {"name": "debugger-abc12", "image": "busybox", **container}
    )
    return new


def test_pod_update_denies_a_privileged_debug_container() -> None:
    old = workload("Pod", pod_spec("containers", gpu(**{"nvidia.com/gpu": 1})))
    new = with_ephemeral(old, PRIVILEGED)  # kubectl debug --profile=sysadmin
    violations = run(new, operation="UPDATE", old_object=old)
    assert [(v.rule, v.path) for v in violations] == [
        ("privileged", "spec.ephemeralContainers[0].securityContext.privileged")
    ]
    assert "container 'debugger-abc12'" in violations[0].message


def test_pod_update_does_not_redeny_what_the_old_pod_already_had() -> None:
    old = workload("Pod", pod_spec("containers", {**PRIVILEGED, **gpu(**{"nvidia.com/gpu": 4})}, hostPID=True))
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"team": "a"}
    assert run(relabelled, operation="UPDATE", old_object=old) == []
    debug = with_ephemeral(old, {"securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}})
    assert [(v.rule, v.mode) for v in run(debug, operation="UPDATE", old_object=old)] == [("capabilities", Mode.WARN)]


def test_pod_update_catches_an_ephemeral_container_mounting_an_existing_socket_volume() -> None:
    volumes = [{"name": "sock", "hostPath": {"path": "/run/containerd"}}]
    old = workload("Pod", pod_spec("containers", {}, volumes=volumes))
    new = with_ephemeral(old, {"volumeMounts": [{"name": "sock", "mountPath": "/host"}]})
    assert [v.path for v in run(new, operation="UPDATE", old_object=old)] == [
        "spec.ephemeralContainers[0].volumeMounts[0]"
    ]


def test_pod_update_does_not_recount_the_quota() -> None:
    old = workload("Pod", pod_spec("containers", gpu(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192})))
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["image"] = "busybox:1.37"
    assert run(new, QUOTA, operation="UPDATE", old_object=old, usage=NamespaceUsage(10**6, 10**4, 100)) == []


def test_controller_update_with_an_unchanged_template_is_not_rejudged() -> None:
    old = workload("ReplicaSet", pod_spec("containers", PRIVILEGED))
    scaled = copy.deepcopy(old)
    scaled["spec"]["replicas"] = 0  # the deployment controller scaling down an old ReplicaSet
    assert run(scaled, operation="UPDATE", old_object=old) == []
    changed = copy.deepcopy(old)
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "busybox:1.37"
    assert fired(run(changed, operation="UPDATE", old_object=old)) == {"privileged"}
    assert fired(run(changed, operation="UPDATE")) == {"privileged"}


def test_objects_being_deleted_are_never_refused() -> None:
    old = workload("Deployment", pod_spec("containers", PRIVILEGED))
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["containers"][0]["image"] = "busybox:1.37"
    new["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert run(new, operation="UPDATE", old_object=old) == []


def test_other_operations_and_kinds_are_not_validated() -> None:
    obj = workload("Pod", pod_spec("containers", PRIVILEGED))
    assert run(obj, operation="DELETE") == []
    assert run(obj, operation="CONNECT") == []
    assert run({"kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"privileged": "true"}}) == []


# ---------------------------------------------------------------- messages


def test_denial_lists_every_enforced_violation_with_paths_limits_and_fixes() -> None:
    spec = pod_spec("initContainers", PRIVILEGED, hostIPC=True)
    spec["containers"][0].update(gpu(**{"nvidia.com/gpu": 3}))
    violations = run(workload("Deployment", spec, name="trainer"))
    denial = render_denial(violations, "Deployment", "trainer", "en", "team-a")
    lines = denial.splitlines()
    assert lines[0] == "hami-webhook denied Deployment team-a/trainer: 2 policy violations"
    assert lines[1].startswith(
        "[1] Deployment team-a/trainer, container 'subject' "
        "(spec.template.spec.initContainers[0].securityContext.privileged): "
    )
    assert "Fix:" in lines[1]
    assert "the cap of 2" in lines[2] and "Fix:" in lines[2] and "spec.template.spec.containers[0]" in lines[2]
    assert "hostIPC" not in denial  # a warning, not part of the denial
    assert render_warnings(violations) == [v.warning for v in violations if v.rule == "host-ipc"]


def test_chinese_messages() -> None:
    spec = pod_spec("containers", {**PRIVILEGED, **gpu(**{"nvidia.com/gpu": 8})})
    violations = run(workload("Pod", spec, name="intern"), ValidationSettings(language="zh"))
    denial = render_denial(violations, "Pod", "intern", "zh", "team-a")
    assert denial.startswith("hami-webhook 拒绝了 Pod team-a/intern：共 2 项策略违规")
    assert "Pod team-a/intern 的容器 'subject'（spec.containers[0].securityContext.privileged）：特权模式" in denial
    assert "单个 Pod 申请 8 张 GPU" in denial and "最多 2 张" in denial


def test_catalogues_have_the_same_keys_and_placeholders() -> None:
    assert set(CATALOGUE["en"]) == set(CATALOGUE["zh"])
    fields = string.Formatter()
    for key, (long_en, short_en) in CATALOGUE["en"].items():
        long_zh, short_zh = CATALOGUE["zh"][key]
        for en, zh in ((long_en, long_zh), (short_en, short_zh)):
            assert {f[1] for f in fields.parse(en) if f[1]} >= {f[1] for f in fields.parse(zh) if f[1]}


SAMPLE_PARAMS = {
    "capability": "CAP_SYS_ADMINISTRATION",
    "volume": "v" * 63,
    "host_path": "/" + "x" * 200,
    "normal": "/" + "x" * 200,
    "volume_path": "spec.volumes[12].hostPath.path",
    "total": 16,
    "cap": 2,
    "namespace": "n" * 63,
    "breakdown": "'a': 8, 'b': 8",
    "where": "spec",
    "cores": 30,
    "mib": 1000,
    "card": 81920,
    "step": 256,
    "suggest": 1024,
    "value": "1" * 80,
    "resource": "example.com/" + "r" * 60,
    "request": "1",
    "limit": "2",
}


@pytest.mark.parametrize("language", ["en", "zh"])
@pytest.mark.parametrize("key", sorted(CATALOGUE["en"]))
def test_every_message_renders_and_warnings_stay_under_120_characters(key: str, language: str) -> None:
    params = dict(SAMPLE_PARAMS)
    if key.startswith("quota"):
        params.update(dimension="memory", used=10**6, requested=10**6, limit=10**6)
    finding = Finding("privileged", key, "spec.containers[0].x", "c" * 63, params)
    violation = render(finding, Mode.WARN, "StatefulSet", "n" * 63, "w" * 253, language)
    assert len(violation.warning) < 120
    assert violation.warning.startswith("hami/privileged: ")
    assert "spec.containers[0].x" in violation.message


def test_all_rules_are_known_and_security_rules_are_a_subset() -> None:
    assert set(SECURITY_RULES) < set(ALL_RULES)
    assert set(ValidationSettings().rules) == set(ALL_RULES)


# ---------------------------------------------------------------- never an exception for bad values

RESOURCE_NAMES = sorted(ResourceNames().all | {"example.com/fpga"})
VALUES = st.one_of(
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["8Gi", "0.5", "1e3", "-1", "1.5Gi", "100m", "", " 2 ", "1Ki", "9" * 40]),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(
    limits=st.dictionaries(st.sampled_from(RESOURCE_NAMES), VALUES, max_size=4),
    requests=st.dictionaries(st.sampled_from(RESOURCE_NAMES), VALUES, max_size=3),
    kind=st.sampled_from(["containers", "initContainers"]),
)
def test_malformed_values_are_violations_never_exceptions(
    limits: dict[str, Any], requests: dict[str, Any], kind: str
) -> None:
    obj = workload("Pod", pod_spec(kind, {"resources": {"limits": limits, "requests": requests}}))
    violations = run(obj, QUOTA, usage=NamespaceUsage(1, 1, 1))
    assert all(v.path.startswith(f"spec.{kind}[0].resources") for v in violations)
    [template] = pod_templates(obj)
    usage = pod_gpu_usage(template, 81920, ResourceNames())
    assert min(usage.memory_mib, usage.cores, usage.gpus) >= 0


@pytest.mark.parametrize(
    ("mib", "card", "suggest"),
    [(1000, 81920, 1024), (3000, 81920, 3072), (100000, 81920, 81920), (24500, 24564, 24320)],
)
def test_granularity_suggestion_fits_the_largest_card(mib: int, card: int, suggest: int) -> None:
    obj = workload("Pod", pod_spec("containers", gpu(**{"nvidia.com/gpumem": mib})))
    [violation] = [v for v in run(obj, largest_card_mib=card) if v.rule == "vgpu-granularity"]
    assert f"use {suggest} MiB" in violation.message


def test_the_clean_fast_paths_never_hide_a_violation() -> None:
    """The fast paths may only skip what the full rules would find nothing in: over the whole corpus,
    every template called clean yields no finding when the rules run anyway, and every template
    called host-clean (a GPU pod may be) yields no host-escape finding."""
    from pathlib import Path

    import yaml

    import hami.validation.engine as engine
    from hami.validation.host import host_findings
    from hami.validation.model import ValidationContext
    from hami.validation.settings import ValidationSettings
    from hami.workloads import pod_templates

    corpus = Path(__file__).parent / "corpus"
    clean = dirty = host_clean = host_dirty = 0
    context = ValidationContext(operation="CREATE", namespace="team-a")
    for path in sorted(corpus.glob("*.yaml")):
        if path.name == "expected.yaml":
            continue
        for template in pod_templates(yaml.safe_load(path.read_text()), "team-a"):
            host, native = engine.clean_parts(template)
            assert engine.trivially_clean(template) == (host and native)
            if host:
                host_clean += 1
                assert list(host_findings(template)) == [], path.name
            else:
                host_dirty += 1
            if not (host and native):
                dirty += 1
                continue
            clean += 1
            original = engine.clean_parts
            engine.clean_parts = lambda _t: (False, False)  # run every rule on it
            try:
                findings = list(engine.template_findings(template, context, ValidationSettings(), True))
            finally:
                engine.clean_parts = original
            assert findings == [], (path.name, findings)
    assert clean >= 3 and dirty >= 50 and host_clean > clean and host_dirty >= 20  # every path is exercised


@pytest.mark.parametrize(
    "risk",
    [
        {"hostNetwork": True},
        {"hostPID": True},
        {"securityContext": {"windowsOptions": {"hostProcess": True}}},
        {"volumes": [{"name": "v", "hostPath": {"path": "/var/run"}}]},
        {"containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True}}]},
        {"containers": [{"name": "c", "image": "x", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]},
        {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
        {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"example.com/dongle": 1}}}]},
        {"initContainers": [{"name": "i", "image": "x", "securityContext": {"privileged": True}}]},
        {"ephemeralContainers": [{"name": "e", "image": "x", "securityContext": {"windowsOptions": {}}}]},
    ],
)
def test_anything_a_rule_reads_leaves_the_fast_path(risk: dict) -> None:
    from hami.validation.engine import clean_parts, trivially_clean
    from hami.workloads import pod_templates

    base = {
        "name": "c",
        "image": "nginx",
        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": {"runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }
    spec = {"containers": [base], **risk}
    (template,) = pod_templates({"kind": "Pod", "metadata": {"name": "p"}, "spec": spec}, "ns")
    assert not trivially_clean(template)
    host, native = clean_parts(template)
    assert host != ("resources" not in str(risk))  # a host risk leaves the host path, a resource the other
    assert native == ("resources" not in str(risk))
    (plain,) = pod_templates({"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [base]}}, "ns")
    assert trivially_clean(plain)


async def test_admitted_pods_count_against_their_namespace_quota_until_it_is_full() -> None:
    """Through the Decider: the ledger's pending reservations are the namespace's live usage, so a
    namespace capped at 2 GPUs gets two 1-GPU pods placed and the third denied by tenant-quota; a
    namespace without a cap is never counted."""
    import asyncio
    import json

    from hami import config as config_mod
    from hami.admission import decode_review
    from hami.decide import Decider
    from hami.runtime import Runtime
    from tests.webhook_fixture import gpu_container, pod, review_of

    overrides = {"validation": {"quotas": {"capped": {"gpus": 2}}}}
    runtime = Runtime(config_mod.load(None, environ={}, overrides=overrides))
    await runtime.start()
    try:
        for _ in range(200):  # the first snapshot, then the index built from it
            if runtime.readiness()[0]:
                break
            await asyncio.sleep(0.05)
        decider = Decider(runtime)

        async def admit(namespace: str, name: str) -> Any:
            card = gpu_container(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1024})
            obj = pod(name, containers=[card])
            obj["metadata"]["namespace"] = namespace
            review = review_of(obj, namespace=namespace)
            return await decider.decide(decode_review(json.dumps(review).encode()), "mutate")

        assert [(await admit("capped", f"p{i}")).result for i in range(2)] == ["patched", "patched"]
        third = await admit("capped", "p2")
        assert third.result == "denied" and "tenant-quota" in third.fields["violations"][0]["rule"]
        assert "2" in third.verdict.message  # the limit is named
        assert [(await admit("open", f"q{i}")).result for i in range(3)] == ["patched"] * 3
    finally:
        await runtime.stop()
