"""RBAC follows the code: the permissions the webhook's ServiceAccount is granted in deploy/
must be exactly those its kubernetes-asyncio calls under hami/ need.

The method -> (apiGroup, resource, verb) map is not hand-written: it is read from the
kubernetes-asyncio client itself (each generated `<method>_with_http_info` names its REST path
and HTTP method), so every API method the code may ever call is covered.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_deploy_lib import REPO, WEBHOOK, Obj, find, needs_kubectl, rendered

ADMISSION_GROUP = "admissionregistration.k8s.io"


@dataclass(frozen=True, slots=True)
class Endpoint:
    group: str
    resource: str  # plural, with "/subresource" where there is one
    collection: bool  # path ends at the collection (list, deletecollection, create)
    http_method: str


Perm = tuple[str, str, str]  # (apiGroup, resource, verb)

_CALL_API = re.compile(r"def (\w+)_with_http_info\(.*?call_api\(\s*'([^']+)',\s*'(\w+)'", re.S)


def parse_path(path: str) -> tuple[str, str, bool] | None:
    """'/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale' -> ('apps', 'deployments/scale', False)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest or rest[0] == "watch":  # deprecated /watch/ paths: the same permission as ?watch=true
        return None
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[1] == "{namespace}":
        rest = rest[2:]
    resource = rest[0]
    if len(rest) == 1:
        return group, resource, True
    sub = f"/{rest[2]}" if len(rest) >= 3 else ""
    return group, resource + sub, False


@functools.cache
def api_methods() -> dict[str, frozenset[Endpoint]]:
    """Every kubernetes-asyncio API method name -> the endpoint(s) it calls."""
    client_api = pytest.importorskip("kubernetes_asyncio.client.api")
    index: dict[str, set[Endpoint]] = {}
    for module in Path(client_api.__file__).parent.glob("*_api.py"):
        for name, path, method in _CALL_API.findall(module.read_text(encoding="utf-8")):
            parsed = parse_path(path)
            if parsed is not None:
                index.setdefault(name, set()).add(Endpoint(parsed[0], parsed[1], parsed[2], method.upper()))
    return {k: frozenset(v) for k, v in index.items()}


def verb(endpoint: Endpoint, watch: bool) -> str:
    if endpoint.http_method == "GET":
        if watch:
            return "watch"
        return "list" if endpoint.collection else "get"
    if endpoint.http_method == "DELETE":
        return "deletecollection" if endpoint.collection else "delete"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}[endpoint.http_method]


def _is_true(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def api_usages(source: str) -> set[tuple[str, bool]]:
    """(method name, is_watch) for every reference to a kubernetes-asyncio API method.

    A call with watch=True is a watch; a method passed to `<w>.stream(...)` (kubernetes_asyncio's
    Watch) is a watch; any other call or reference is a plain call of that method. One step of
    indirection is followed: where the module streams a function it received (`w.stream(self._fn)`),
    every `list_*` method it hands around by reference (`Loop(v1.list_node)`) is listed AND watched.
    """
    methods = api_methods()
    found: set[tuple[str, bool]] = set()
    handled: set[int] = set()
    streams_indirect = False
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "stream" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Attribute) and first.attr in methods:
                found.add((first.attr, True))
                handled.add(id(first))
            else:
                streams_indirect = True
        if isinstance(func, ast.Attribute) and func.attr in methods:
            watch = any(kw.arg == "watch" and _is_true(kw.value) for kw in node.keywords)
            found.add((func.attr, watch))
            handled.add(id(func))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in methods and id(node) not in handled:
            found.add((node.attr, False))  # passed around (partial, callback): at least a plain call
            if streams_indirect and node.attr.startswith("list_"):
                found.add((node.attr, True))
    return found


def required_permissions(usages: set[tuple[str, bool]]) -> set[Perm]:
    perms: set[Perm] = set()
    for name, watch in usages:
        # A name shared by several API groups (rare, e.g. events) needs all of them granted.
        for endpoint in api_methods()[name]:
            perms.add((endpoint.group, endpoint.resource, verb(endpoint, watch)))
    return perms


def granted_permissions(objs: tuple[Obj, ...], account: str, namespace: str) -> set[Perm]:
    """Everything the roles bound to one ServiceAccount grant, expanded to single permissions."""
    roles = {(o["kind"], o["metadata"]["name"]): o for o in find(objs, "ClusterRole") + find(objs, "Role")}
    perms: set[Perm] = set()
    for binding in find(objs, "ClusterRoleBinding") + find(objs, "RoleBinding"):
        if not any(
            s["kind"] == "ServiceAccount" and s["name"] == account and s.get("namespace") == namespace
            for s in binding.get("subjects", [])
        ):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for v in rule["verbs"]:
                        perms.add((group, resource, v))
    return perms


def drift(required: set[Perm], granted: set[Perm]) -> tuple[set[Perm], set[Perm]]:
    """(needed but not granted, granted but never used)."""
    return required - granted, granted - required


def code_usages(root: Path) -> set[tuple[str, bool]]:
    usages: set[tuple[str, bool]] = set()
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "kubernetes_asyncio" in text or "watch.Watch" in text:
            usages |= api_usages(text)
    return usages


# --- the mapping itself, on known methods and a synthetic code sample ----------------------


@pytest.mark.parametrize(
    ("method", "watch", "perm"),
    [
        ("list_node", False, ("", "nodes", "list")),
        ("list_node", True, ("", "nodes", "watch")),
        ("read_node", False, ("", "nodes", "get")),
        ("list_pod_for_all_namespaces", False, ("", "pods", "list")),
        ("list_namespaced_pod", True, ("", "pods", "watch")),
        ("patch_namespaced_pod", False, ("", "pods", "patch")),
        ("patch_namespaced_pod_status", False, ("", "pods/status", "patch")),
        ("create_namespaced_pod_eviction", False, ("", "pods/eviction", "create")),
        ("patch_mutating_webhook_configuration", False, (ADMISSION_GROUP, "mutatingwebhookconfigurations", "patch")),
        ("read_validating_webhook_configuration", False, (ADMISSION_GROUP, "validatingwebhookconfigurations", "get")),
        ("delete_collection_namespaced_pod", False, ("", "pods", "deletecollection")),
        ("replace_namespaced_deployment", False, ("apps", "deployments", "update")),
    ],
)
def test_method_maps_to_its_permission(method: str, watch: bool, perm: Perm) -> None:
    assert required_permissions({(method, watch)}) == {perm}


SAMPLE = """
from kubernetes_asyncio import client, watch

async def run(v1: client.CoreV1Api, adm: client.AdmissionregistrationV1Api) -> None:
    nodes = await v1.list_node(label_selector="nvidia.com/gpu.present=true")
    w = watch.Watch()
    async for event in w.stream(v1.list_node, resource_version=nodes.metadata.resource_version):
        pass
    pods = await v1.list_pod_for_all_namespaces(watch=False)
    await v1.list_pod_for_all_namespaces(watch=True, resource_version="1")
    await v1.patch_namespaced_pod("p", "ns", body=[])
    callback = adm.patch_mutating_webhook_configuration
"""


def test_usages_are_found_in_code_with_their_watch_flag() -> None:
    assert api_usages(SAMPLE) == {
        ("list_node", False),
        ("list_node", True),
        ("list_pod_for_all_namespaces", False),
        ("list_pod_for_all_namespaces", True),
        ("patch_namespaced_pod", False),
        ("patch_mutating_webhook_configuration", False),
    }
    assert api_usages("x = client.list()\ny = d.read()\n") == set(), "non-API names are not API calls"


def test_list_functions_handed_to_a_watch_helper_are_watched() -> None:
    helper = """
class Loop:
    def __init__(self, fn): self._fn = fn
    async def run(self, w):
        await self._fn()
        async for _ in w.stream(self._fn): pass

def start(v1):
    return [Loop(v1.list_node), Loop(v1.list_namespaced_pod)], v1.patch_namespaced_pod
"""
    assert api_usages(helper) == {
        ("list_node", False),
        ("list_node", True),
        ("list_namespaced_pod", False),
        ("list_namespaced_pod", True),
        ("patch_namespaced_pod", False),
    }
    assert ("list_node", True) not in api_usages(helper.replace("w.stream(self._fn)", "self._fn()"))


@needs_kubectl
def test_drift_is_reported_both_ways_against_the_rendered_base() -> None:
    granted = granted_permissions(rendered("base"), WEBHOOK, "hami-system")
    informer_code = """
async def f(v1, w):
    await v1.list_node(); await v1.list_pod_for_all_namespaces()
    async for _ in w.stream(v1.list_node): pass
    async for _ in w.stream(v1.list_pod_for_all_namespaces): pass
    await v1.patch_namespaced_pod("p", "ns", body={})
"""
    assert drift(required_permissions(api_usages(informer_code)), granted) == (set(), set())
    without_queue = informer_code.replace('await v1.patch_namespaced_pod("p", "ns", body={})', "pass")
    assert drift(required_permissions(api_usages(without_queue)), granted) == (set(), {("", "pods", "patch")})
    with_read = informer_code + "    await v1.read_node('n')\n"
    assert drift(required_permissions(api_usages(with_read)), granted) == ({("", "nodes", "get")}, set())


# --- the real code against the real manifests ----------------------------------------------


@needs_kubectl
def test_webhook_rbac_matches_the_api_calls_under_hami() -> None:
    usages = code_usages(REPO / "hami")
    if not usages:
        pytest.skip("hami/ makes no Kubernetes API calls yet (hami/state/kube.py not written)")
    required = required_permissions(usages)
    core = {p for p in required if p[0] != ADMISSION_GROUP}
    for name in ("base", "cert-manager", "ha"):
        granted = granted_permissions(rendered(name), WEBHOOK, "hami-system")
        missing, unused = drift(core, granted)
        assert not missing, f"{name}: the code calls the API for {sorted(missing)} but RBAC does not grant it"
        assert not unused, f"{name}: RBAC grants {sorted(unused)} that no code under hami/ uses"
    # Patching its own webhook configurations (caBundle at start-up) belongs to the self-signed
    # overlay only; cert-manager's injector does it otherwise.
    own_config = required - core
    granted_ss = granted_permissions(rendered("self-signed"), WEBHOOK, "hami-system")
    assert drift(required, granted_ss) == (set(), set()), "self-signed overlay RBAC drifted from hami/"
    assert own_config <= granted_ss
