"""Helpers shared by the deploy tests: render the kustomizations once, find objects in them.

No tests here; the name only keeps it inside the deploy test files' namespace.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
KUBECTL = shutil.which("kubectl")
NAMESPACE = "hami-system"
WEBHOOK = "hami-webhook"

# name -> (kustomization dirs to include as resources, components to add), relative to deploy/.
# "base" is deploy/ itself, exactly what `kubectl kustomize deploy/` shows.
RENDERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "base": ((".",), ()),
    "self-signed": (("overlays/self-signed",), ()),
    "cert-manager": (("overlays/cert-manager",), ()),
    "ha": (("overlays/ha",), ()),
    "ha+monitoring": (("overlays/ha",), ("monitoring",)),
}
INSTALLABLE = ("self-signed", "cert-manager", "ha", "ha+monitoring")

Obj = dict[str, Any]

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")


def kustomize(directory: Path) -> str:
    assert KUBECTL is not None
    done = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory} failed:\n{done.stderr}")
    return done.stdout


@functools.cache
def rendered(name: str) -> tuple[Obj, ...]:
    """Objects of one rendering; compositions go through a throw-away kustomization."""
    resources, components = RENDERS[name]
    if not components and len(resources) == 1:
        text = kustomize(DEPLOY / resources[0])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            # kustomize refuses absolute paths to other kustomizations, relative ones are fine.
            rel = os.path.relpath(DEPLOY, tmp)
            doc = {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [f"{rel}/{r}" for r in resources],
                "components": [f"{rel}/{c}" for c in components],
            }
            (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump(doc))
            text = kustomize(Path(tmp))
    return tuple(d for d in yaml.safe_load_all(text) if d)


def find(objs: tuple[Obj, ...], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected exactly one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_template_spec(obj: Obj) -> Obj | None:
    """The pod spec of a workload object (Deployment, DaemonSet, Job, ...), None for other kinds."""
    kind = obj["kind"]
    if kind == "Pod":
        return obj["spec"]
    if kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
        return obj["spec"]["template"]["spec"]
    if kind == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return None


def workloads(objs: tuple[Obj, ...]) -> Iterator[tuple[Obj, Obj]]:
    for obj in objs:
        spec = pod_template_spec(obj)
        if spec is not None:
            yield obj, spec


def all_containers(spec: Obj) -> list[Obj]:
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def flag_value(argv: list[str], flag: str) -> str:
    """The value after `flag` in an argv list (`--x v` or `--x=v`)."""
    for i, arg in enumerate(argv):
        if arg == flag:
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {argv}")


def webhook_config_file(objs: tuple[Obj, ...]) -> Obj:
    """The webhook.yaml carried by the hami-webhook-config ConfigMap, parsed."""
    cm = one(objs, "ConfigMap", "hami-webhook-config")
    return yaml.safe_load(cm["data"]["webhook.yaml"]) or {}


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based label selector (`a=b,c=d`) against a label set."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True
