"""Decision -> JSON patch: every patch applies to its pod and yields a valid Pod.

Checked twice: with jsonpatch, and with `kubectl patch --local --type json`, which uses the same
JSON-patch code as kube-apiserver.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from hami import mutation
from hami.placement.decision import Decision, DeviceChoice, NodeVerdict
from tests.webhook_fixture import gpu_container, pod

KUBECTL = shutil.which("kubectl")


def decision(node: str = "gpu-a", devices: tuple[DeviceChoice, ...] | None = None) -> Decision:
    devices = devices or (DeviceChoice("cuda", 0, "GPU-aaa", 0, "A100", 8192, 30),)
    return Decision(node, devices, "binpack", 12.5, 3, runners_up=(NodeVerdict("gpu-b", True, 9.0, "lower score"),))


def _pods() -> list[dict[str, Any]]:
    bare = pod(containers=[gpu_container(**{"nvidia.com/gpumem": 8192})])
    with_env = copy.deepcopy(bare)
    with_env["spec"]["containers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "KEEP", "value": "1"},
    ]
    with_annotations = copy.deepcopy(bare)
    with_annotations["metadata"]["annotations"] = {"team": "a", "hami.io/decision": "old"}
    with_selector_terms = copy.deepcopy(bare)
    with_selector_terms["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-a"]}]},
                ]
            }
        }
    }
    with_pod_affinity_only = copy.deepcopy(bare)
    with_pod_affinity_only["spec"]["affinity"] = {"podAntiAffinity": {}}
    with_preferred = copy.deepcopy(bare)
    with_preferred["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 5, "preference": {"matchExpressions": [{"key": "ssd", "operator": "Exists"}]}}
            ]
        }
    }
    return [bare, with_env, with_annotations, with_selector_terms, with_pod_affinity_only, with_preferred]


def _kubectl_apply(obj: dict[str, Any], patch: list[dict[str, Any]], tmp: Path) -> dict[str, Any]:
    source = tmp / "pod.yaml"
    source.write_text(yaml.safe_dump(obj))
    result = subprocess.run(
        [KUBECTL, "patch", "--local", "--type", "json", "-f", str(source), "-p", json.dumps(patch), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _required_terms(patched: dict[str, Any]) -> list[dict[str, Any]]:
    return patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]


@pytest.mark.parametrize("index", range(6))
def test_pin_patch_applies_and_keeps_user_constraints(index: int, tmp_path: Path) -> None:
    original = _pods()[index]
    patch = mutation.pin_patch(original, decision(), "default/app")
    patched = jsonpatch.apply_patch(original, patch)
    terms = _required_terms(patched)
    # The hostname requirement is ANDed into every term; the user's own expressions stay.
    for term in terms:
        assert {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-a"]} in term["matchExpressions"]
    before = (original["spec"].get("affinity") or {}).get("nodeAffinity", {})
    if "requiredDuringSchedulingIgnoredDuringExecution" in before:
        assert len(terms) == 2
        assert {"key": "zone", "operator": "In", "values": ["z1"]} in terms[0]["matchExpressions"]
        assert terms[1]["matchFields"]
    if "preferredDuringSchedulingIgnoredDuringExecution" in before:
        assert patched["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    env = {e["name"]: e["value"] for e in patched["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaa"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8192m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    names = [e["name"] for e in patched["spec"]["containers"][0]["env"]]
    assert len(names) == len(set(names)), "no duplicated env entries"
    annotations = patched["metadata"]["annotations"]
    assert annotations[mutation.INJECTED] == "true"
    assert annotations[mutation.NODE] == "gpu-a"
    assert annotations[mutation.DEVICES] == "GPU-aaa,NVIDIA,8192,30:;"
    assert annotations[mutation.RESERVATION] == "default/app"
    assert "policy=binpack" in annotations[mutation.DECISION]
    if index == 2:
        assert annotations["team"] == "a"
    if KUBECTL:
        assert _kubectl_apply(original, patch, tmp_path) == patched


def test_multi_container_devices_and_hami_annotation_format() -> None:
    original = pod(
        containers=[
            gpu_container("a", **{"nvidia.com/gpumem": 1000}),
            {"name": "side", "image": "envoy"},
            gpu_container("b", **{"nvidia.com/gpu": 2, "nvidia.com/gpumem": 2000}),
        ]
    )
    devices = (
        DeviceChoice("a", 0, "GPU-1", 0, "T4", 1000, 0),
        DeviceChoice("b", 2, "GPU-2", 1, "T4", 2000, 0),
        DeviceChoice("b", 2, "GPU-3", 2, "T4", 2000, 0),
    )
    patched = jsonpatch.apply_patch(original, mutation.pin_patch(original, decision(devices=devices), "k"))
    assert "env" not in patched["spec"]["containers"][1]
    env_b = {e["name"]: e["value"] for e in patched["spec"]["containers"][2]["env"]}
    assert env_b["NVIDIA_VISIBLE_DEVICES"] == "GPU-2,GPU-3"
    assert env_b["CUDA_DEVICE_MEMORY_LIMIT_1"] == "2000m"
    assert "CUDA_DEVICE_SM_LIMIT" not in env_b  # no cores asked: no SM limit
    assert (
        patched["metadata"]["annotations"][mutation.DEVICES]
        == "GPU-1,NVIDIA,1000,0:;GPU-2,NVIDIA,2000,0:GPU-3,NVIDIA,2000,0:;"
    )


@pytest.mark.parametrize("index", range(6))
def test_shortlist_patch_requires_top_k_and_prefers_by_rank(index: int, tmp_path: Path) -> None:
    original = _pods()[index]
    patch = mutation.shortlist_patch(original, ["n1", "n2", "n3"], "why", "kubernetes.io/hostname")
    patched = jsonpatch.apply_patch(original, patch)
    for term in _required_terms(patched):
        assert {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1", "n2", "n3"]} in term[
            "matchExpressions"
        ]
    preferred = patched["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    ours = [p for p in preferred if p["preference"]["matchExpressions"][0]["key"] == "kubernetes.io/hostname"]
    assert [p["preference"]["matchExpressions"][0]["values"][0] for p in ours] == ["n1", "n2", "n3"]
    assert ours[0]["weight"] > ours[1]["weight"] > ours[2]["weight"] >= 1
    assert "env" not in patched["spec"]["containers"][0] or index == 1
    if KUBECTL:
        assert _kubectl_apply(original, patch, tmp_path) == patched


def test_queue_patch_adds_gate_once(tmp_path: Path) -> None:
    original = pod(containers=[gpu_container(**{"nvidia.com/gpumem": 1000})])
    patched = jsonpatch.apply_patch(original, mutation.queue_patch(original, "hami.io/gpu-capacity", "queued"))
    assert patched["spec"]["schedulingGates"] == [{"name": "hami.io/gpu-capacity"}]
    again = mutation.queue_patch(patched, "hami.io/gpu-capacity", "queued")
    assert jsonpatch.apply_patch(patched, again)["spec"]["schedulingGates"] == [{"name": "hami.io/gpu-capacity"}]
    if KUBECTL:
        assert _kubectl_apply(original, mutation.queue_patch(original, "g", "r"), tmp_path)["spec"]["schedulingGates"]


def test_already_injected_and_escaping() -> None:
    assert mutation.already_injected({"annotations": {"hami.io/injected": "true"}})
    assert not mutation.already_injected({"annotations": {"hami.io/injected": "false"}})
    assert not mutation.already_injected({})
    assert mutation.escape("a/b~c") == "a~1b~0c"
