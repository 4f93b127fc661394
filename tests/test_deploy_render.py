"""deploy/: every kustomization renders, every object is schema-valid, and the safety properties
that production incidents taught us hold in the rendered YAML (not in the sources, which
overlays patch)."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

import kubernetes_validate
import pytest

from tests.test_deploy_lib import (
    INSTALLABLE,
    NAMESPACE,
    RENDERS,
    WEBHOOK,
    Obj,
    all_containers,
    find,
    flag_value,
    needs_kubectl,
    one,
    rendered,
    selector_matches,
    webhook_config_file,
    workloads,
)

pytestmark = needs_kubectl

K8S_VERSION = "1.30"  # the oldest we support: matchConditions GA, preStop sleep on by default
GPU_RESOURCES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "hami.io/vgpu",
    "hami.io/vgpu-memory",
    "hami.io/vgpu-cores",
)

# Custom resources have no schema in kubernetes-validate: check the fields the controllers need.
CRD_REQUIRED_SPEC: dict[tuple[str, str], tuple[str, ...]] = {
    ("cert-manager.io/v1", "Certificate"): ("secretName", "issuerRef"),
    ("cert-manager.io/v1", "Issuer"): (),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("selector", "endpoints"),
    ("monitoring.coreos.com/v1", "PodMonitor"): ("selector", "podMetricsEndpoints"),
    ("monitoring.coreos.com/v1", "PrometheusRule"): ("groups",),
}

ALL = tuple(RENDERS)


def webhook_configs(objs: tuple[Obj, ...]) -> list[Obj]:
    return find(objs, "MutatingWebhookConfiguration") + find(objs, "ValidatingWebhookConfiguration")


def webhook_deployment(objs: tuple[Obj, ...]) -> Obj:
    return one(objs, "Deployment", WEBHOOK)


def webhook_container(objs: tuple[Obj, ...]) -> Obj:
    return webhook_deployment(objs)["spec"]["template"]["spec"]["containers"][0]


def argv(container: Obj) -> list[str]:
    return list(container.get("command", [])) + list(container.get("args", []))


# --- rendering and schemas ---------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_renders_and_every_object_is_namespaced_correctly(name: str) -> None:
    objs = rendered(name)
    assert objs, f"{name} rendered nothing"
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    for obj in objs:
        ns = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert ns is None, f"{obj['kind']}/{obj['metadata']['name']} is cluster-scoped"
        else:
            assert ns == NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']} is in {ns!r}"


@pytest.mark.parametrize("name", ALL)
def test_every_object_validates_against_the_kubernetes_schema(name: str) -> None:
    errors = []
    for obj in rendered(name):
        key = (obj["apiVersion"], obj["kind"])
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if key in CRD_REQUIRED_SPEC:
            spec = obj.get("spec")
            assert isinstance(spec, dict), f"{where}: no spec"
            missing = [f for f in CRD_REQUIRED_SPEC[key] if f not in spec]
            assert not missing, f"{where}: spec lacks {missing}"
            continue
        try:
            # strict: unknown fields (typos such as `tagetPort`) are errors, as on the API server.
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{where}: no schema for {key}; add it to CRD_REQUIRED_SPEC if it is a CRD")
    assert not errors, "\n".join(errors)


def test_base_is_what_kubectl_kustomize_deploy_shows() -> None:
    kinds = {o["kind"] for o in rendered("base")}
    assert {"Deployment", "DaemonSet", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} <= kinds
    # The base stays free of optional CRDs so that it renders and applies on any cluster.
    assert not {o["apiVersion"] for o in rendered("base")} & {a for a, _ in CRD_REQUIRED_SPEC}


# --- webhook configurations ----------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_webhooks_exclude_system_namespaces_and_are_opt_in(name: str) -> None:
    objs = rendered(name)
    own_ns = webhook_deployment(objs)["metadata"]["namespace"]
    for cfg in webhook_configs(objs):
        for hook in cfg["webhooks"]:
            exprs = hook["namespaceSelector"]["matchExpressions"]
            excluded = [e for e in exprs if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"]
            assert excluded and {"kube-system", own_ns} <= set(excluded[0]["values"]), hook["name"]
            assert {"key": "hami-webhook/inject", "operator": "In", "values": ["enabled"]} in exprs, hook["name"]


@pytest.mark.parametrize("name", ALL)
def test_webhooks_are_fast_and_declare_their_side_effects(name: str) -> None:
    objs = rendered(name)
    service = one(objs, "Service", WEBHOOK)
    ports = {p["port"] for p in service["spec"]["ports"]}
    for cfg in webhook_configs(objs):
        # The self-signed Job patches /webhooks/0 of each configuration: keep one webhook each.
        assert len(cfg["webhooks"]) == 1, cfg["metadata"]["name"]
        for hook in cfg["webhooks"]:
            assert hook["timeoutSeconds"] <= 5
            assert hook["sideEffects"] == "NoneOnDryRun"
            assert hook["admissionReviewVersions"] == ["v1"]
            svc = hook["clientConfig"]["service"]
            assert (svc["name"], svc["namespace"]) == (WEBHOOK, service["metadata"]["namespace"])
            assert svc["port"] in ports
            assert "url" not in hook["clientConfig"]


@pytest.mark.parametrize("name", ALL)
def test_mutating_webhook_only_sees_gpu_pods(name: str) -> None:
    (cfg,) = find(rendered(name), "MutatingWebhookConfiguration")
    (hook,) = cfg["webhooks"]
    assert hook["clientConfig"]["service"]["path"] == "/mutate"
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["failurePolicy"] == "Ignore"
    conditions = hook["matchConditions"]
    assert conditions, "ordinary pods must not pay for the mutating webhook"
    text = " ".join(c["expression"] for c in conditions)
    assert "object.spec.containers" in text
    for resource in GPU_RESOURCES:
        assert f"'{resource}'" in text, f"{resource} missing from matchConditions"
    assert "limits" in text and "requests" in text
    assert [r["resources"] for r in hook["rules"]] == [["pods"]]


def _rule_set(hook: Obj) -> set[tuple[str, str, str]]:
    return {
        (group, resource, op)
        for rule in hook["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for op in rule["operations"]
    }


@pytest.mark.parametrize("name", ALL)
def test_validating_webhook_sees_pods_controllers_and_debug_containers(name: str) -> None:
    (cfg,) = find(rendered(name), "ValidatingWebhookConfiguration")
    (hook,) = cfg["webhooks"]
    assert hook["clientConfig"]["service"]["path"] == "/validate"
    assert hook["failurePolicy"] == "Fail"
    assert "matchConditions" not in hook, "validation applies to every pod, GPU or not"
    rules = _rule_set(hook)
    wanted = {("", "pods", op) for op in ("CREATE", "UPDATE")} | {("", "pods/ephemeralcontainers", "UPDATE")}
    for group, resources in (
        ("apps", ("deployments", "statefulsets", "daemonsets", "replicasets")),
        ("batch", ("jobs", "cronjobs")),
    ):
        wanted |= {(group, r, op) for r in resources for op in ("CREATE", "UPDATE")}
    assert wanted <= rules, sorted(wanted - rules)


def test_ca_bundle_is_left_to_the_certificate_provisioner() -> None:
    for name in ALL:
        for cfg in webhook_configs(rendered(name)):
            for hook in cfg["webhooks"]:
                assert not hook["clientConfig"].get("caBundle"), f"{name}: a committed caBundle goes stale"


# --- the webhook Deployment ----------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_webhook_deployment_is_highly_available(name: str) -> None:
    objs = rendered(name)
    dep = webhook_deployment(objs)
    spec = dep["spec"]["template"]["spec"]
    replicas = dep["spec"]["replicas"]
    assert replicas >= (3 if name.startswith("ha") else 2)
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert spec["priorityClassName"] == "system-cluster-critical"
    anti = spec["affinity"]["podAntiAffinity"]
    terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution", []) + [
        t["podAffinityTerm"] for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])
    ]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert any(
        t["topologyKey"] == "kubernetes.io/hostname"
        and all(pod_labels.get(k) == v for k, v in t["labelSelector"]["matchLabels"].items())
        for t in terms
    ), "replicas must be spread across nodes"
    if name.startswith("ha"):
        assert anti.get("requiredDuringSchedulingIgnoredDuringExecution"), "ha: anti-affinity must be required"
    pdbs = [
        p
        for p in find(objs, "PodDisruptionBudget")
        if all(pod_labels.get(k) == v for k, v in p["spec"]["selector"]["matchLabels"].items())
    ]
    assert len(pdbs) == 1 and pdbs[0]["spec"]["minAvailable"] == 1
    # A quota for the critical priority class must exist where clusters limit it.
    quotas = find(objs, "ResourceQuota")
    assert any(
        e["scopeName"] == "PriorityClass" and "system-cluster-critical" in e["values"]
        for q in quotas
        for e in q["spec"]["scopeSelector"]["matchExpressions"]
    )


@pytest.mark.parametrize("name", ALL)
def test_no_cpu_limits_anywhere_but_memory_bounded(name: str) -> None:
    for obj, spec in workloads(rendered(name)):
        for c in all_containers(spec):
            where = f"{obj['kind']}/{obj['metadata']['name']}/{c['name']}"
            res = c.get("resources", {})
            assert "cpu" not in res.get("limits", {}), f"{where}: CPU limits throttle latency (Gatekeeper #266)"
            assert "memory" in res.get("limits", {}), f"{where}: memory limit missing"
            assert {"cpu", "memory"} <= set(res.get("requests", {})), f"{where}: requests missing"


@pytest.mark.parametrize("name", ALL)
def test_webhook_probes_are_https_on_the_serving_port(name: str) -> None:
    container = webhook_container(rendered(name))
    listen_port = int(flag_value(argv(container), "--listen").rpartition(":")[2])
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert listen_port in named.values()
    paths = {}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["scheme"] == "HTTPS", probe
        port = get["port"] if isinstance(get["port"], int) else named[get["port"]]
        assert port == listen_port, probe
        paths[probe] = get["path"]
    assert paths["livenessProbe"] == "/healthz" and paths["readinessProbe"] == "/readyz"


@pytest.mark.parametrize("name", ALL)
def test_pods_meet_the_restricted_security_profile(name: str) -> None:
    for obj, spec in workloads(rendered(name)):
        pod_sc = spec.get("securityContext", {})
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
        assert not any("hostPath" in v for v in spec.get("volumes", [])), obj["metadata"]["name"]
        for c in all_containers(spec):
            where = f"{obj['kind']}/{obj['metadata']['name']}/{c['name']}"
            sc = c.get("securityContext", {})
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, where
            assert sc.get("runAsUser", pod_sc.get("runAsUser", 1)) != 0, where
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("privileged", False) is False, where
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not sc.get("capabilities", {}).get("add"), where
            seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
            assert seccomp.get("type") == "RuntimeDefault", where


def _mounts(container: Obj, spec: Obj) -> dict[str, tuple[Obj, Obj]]:
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in container.get("volumeMounts", [])}


@pytest.mark.parametrize("name", ALL)
def test_webhook_mounts_support_hot_reload_and_a_writable_state_dir(name: str) -> None:
    objs = rendered(name)
    spec = webhook_deployment(objs)["spec"]["template"]["spec"]
    container = spec["containers"][0]
    mounts = _mounts(container, spec)
    args = argv(container)
    state_dir = flag_value(args, "--state-dir")
    assert "emptyDir" in mounts[state_dir][1], "read-only root: the state dir must be an emptyDir"
    config_path = PurePosixPath(flag_value(args, "--config"))
    _, volume = mounts[str(config_path.parent)]
    assert volume["configMap"]["name"] == "hami-webhook-config"
    assert config_path.name in one(objs, "ConfigMap", "hami-webhook-config")["data"]
    for m, v in mounts.values():
        if "configMap" in v or "secret" in v:
            assert "subPath" not in m, "subPath mounts never see ConfigMap/Secret updates"
    # The TLS files the config names live in the mounted Secret.
    tls = webhook_config_file(objs)["tls"]
    cert_dir = str(PurePosixPath(tls["cert_file"]).parent)
    assert str(PurePosixPath(tls["key_file"]).parent) == cert_dir
    secret_volume = mounts[cert_dir][1]["secret"]
    assert secret_volume["secretName"] == "hami-webhook-tls"
    assert tls["service_name"] == WEBHOOK and tls["service_namespace"] == NAMESPACE


_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@pytest.mark.parametrize("name", ALL)
def test_env_references_expand(name: str) -> None:
    """$(VAR) only expands when VAR is defined earlier in env (args: anywhere in env);
    otherwise Kubernetes passes the literal text, e.g. a Redis URL with '$(REDIS_PASSWORD)' in it."""
    for obj, spec in workloads(rendered(name)):
        for c in all_containers(spec):
            seen: list[str] = []
            for var in c.get("env", []):
                for ref in _VAR_REF.findall(str(var.get("value", ""))):
                    assert ref in seen, f"{obj['metadata']['name']}/{c['name']}: {var['name']} uses $({ref}) first"
                seen.append(var["name"])
            for arg in argv(c):
                for ref in _VAR_REF.findall(arg):
                    assert ref in seen, f"{obj['metadata']['name']}/{c['name']}: argument uses undefined $({ref})"


@pytest.mark.parametrize("name", ALL)
def test_images_are_pinned(name: str) -> None:
    ours = set()
    for _, spec in workloads(rendered(name)):
        for c in all_containers(spec):
            image = c["image"]
            repo, _, tag = image.partition("@")[0].rpartition(":")
            assert repo and tag and "/" not in tag, f"{image}: no tag"
            assert tag != "latest", f"{image}: latest is not a version"
            if repo.endswith("/hami-webhook"):
                ours.add(image)
    assert len(ours) == 1, f"one release of our image everywhere, got {sorted(ours)}"


def test_deploy_config_loads_with_the_real_loader() -> None:
    """deploy's webhook.yaml plus each overlay's HAMI_* env must pass the webhook's own strict
    config loader (unknown keys are errors there), so a deploy typo cannot crash-loop pods."""
    config = pytest.importorskip("hami.config")
    sections = {f for f in config.Config.__dataclass_fields__}
    for name in INSTALLABLE:
        objs = rendered(name)
        data = webhook_config_file(objs)
        env = {e["name"]: e["value"] for e in webhook_container(objs).get("env", []) if "value" in e}
        env = {k: _VAR_REF.sub("secret", v) for k, v in env.items()}
        missing = sorted(
            {k for k in data if k not in sections}
            | {k[len("HAMI_") :].split("__")[0].lower() for k in env if k.startswith("HAMI_")} - sections
        )
        if missing:
            pytest.skip(f"hami.config.Config has no section(s) {missing} yet")
        loaded = config.load(path=None, environ=env, overrides=data)
        assert loaded.tls.cert_file == data["tls"]["cert_file"]


@pytest.mark.parametrize("name", ALL)
def test_agent_daemonset_runs_only_on_gpu_nodes_without_privilege(name: str) -> None:
    objs = rendered(name)
    ds = one(objs, "DaemonSet", "hami-agent")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["runtimeClassName"] == "nvidia"
    assert spec.get("automountServiceAccountToken") is False, "the agent never calls the API server"
    (c,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env.get("NVIDIA_DRIVER_CAPABILITIES") == "utility"
    node_name = next(e for e in c["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    args = argv(c)
    assert flag_value(args, "--node-name") == "$(NODE_NAME)"
    port = int(flag_value(args, "--listen").rpartition(":")[2])
    assert port in {p["containerPort"] for p in c["ports"]}
    # The webhook finds agents by what its config says: selector and port must match the DaemonSet.
    kube: dict[str, Any] = webhook_config_file(objs).get("state", {}).get("kube", {})
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert selector_matches(kube["agent_selector"], labels)
    assert kube["agent_port"] == port
    assert kube["agent_namespace"] == ds["metadata"]["namespace"]


def test_ha_shares_a_password_protected_redis() -> None:
    objs = rendered("ha")
    redis = one(objs, "Deployment", "hami-redis")
    svc = one(objs, "Service", "hami-redis")
    container = webhook_container(objs)
    env = {e["name"]: e for e in container["env"]}
    url = env["HAMI_STATE__REDIS_URL"]["value"]
    assert f"@{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:" in url
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "hami-redis"
    redis_c = redis["spec"]["template"]["spec"]["containers"][0]
    assert "--requirepass" in argv(redis_c)
    assert not any(isinstance(v, str) and "password" in v.lower() for v in (e.get("value") for e in redis_c["env"]))
    # Only the ha variants carry Redis.
    for name in ("base", "self-signed", "cert-manager"):
        assert not find(rendered(name), "Deployment", "hami-redis")


def test_cert_manager_injects_the_ca_of_the_certificate_the_pods_mount() -> None:
    for name in ("cert-manager", "ha"):
        objs = rendered(name)
        secret_name = next(
            v["secret"]["secretName"]
            for v in webhook_deployment(objs)["spec"]["template"]["spec"]["volumes"]
            if "secret" in v
        )
        for cfg in webhook_configs(objs):
            ref = cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            ns, _, cert_name = ref.partition("/")
            cert = one(objs, "Certificate", cert_name)
            assert cert["metadata"]["namespace"] == ns
            assert cert["spec"]["secretName"] == secret_name
            assert f"{WEBHOOK}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
            issuer = one(objs, cert["spec"]["issuerRef"]["kind"], cert["spec"]["issuerRef"]["name"])
            assert issuer["metadata"]["namespace"] == ns


def test_self_signed_job_writes_the_secret_and_patches_both_configurations() -> None:
    objs = rendered("self-signed")
    job = one(objs, "Job", "hami-webhook-certgen")
    spec = job["spec"]["template"]["spec"]
    steps = all_containers(spec)
    script = " ".join(argv(steps[0]))
    assert "hami_webhook.py certs" in script and f"--service {WEBHOOK}" in script
    assert '"hami-webhook-tls"' in script
    patched = {argv(c)[1] for c in steps[1:] if argv(c)[0] == "patch"}
    assert patched == {"mutatingwebhookconfiguration", "validatingwebhookconfiguration"}
    # Its RBAC reaches exactly the objects it touches, by name.
    role = one(objs, "ClusterRole", "hami-webhook-certgen")
    for rule in role["rules"]:
        assert rule["resourceNames"] == [WEBHOOK]
    for rule in one(objs, "Role", "hami-webhook-certgen")["rules"]:
        assert rule.get("resourceNames") == ["hami-webhook-tls"] or rule["verbs"] == ["create"]


@pytest.mark.parametrize("name", ALL)
def test_rbac_has_no_wildcards(name: str) -> None:
    for role in find(rendered(name), "ClusterRole") + find(rendered(name), "Role"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert "*" not in rule.get(key, []), f"{role['metadata']['name']}: wildcard in {key}"
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
