"""The whole webhook over real HTTPS: the manifest corpus, and placement on simulated GPU nodes."""

from __future__ import annotations

import asyncio
import base64
import copy
from collections import defaultdict
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import pytest
import yaml

from hami import mutation
from tests.webhook_fixture import Webhook, gpu_container, pod, review_of, running_webhook

CORPUS = Path(__file__).parent / "corpus"
EXPECTED = yaml.safe_load((CORPUS / "expected.yaml").read_text())


def _rules(answer: dict[str, Any]) -> dict[str, set[str]]:
    """rule ids by mode, from the auditAnnotations the webhook sends the API server."""
    found: dict[str, set[str]] = defaultdict(set)
    text = (answer.get("auditAnnotations") or {}).get("violations", "")
    for item in filter(None, text.split(",")):
        rule, mode = item.split("=")
        found[mode].add(rule)
    return found


def _cases_by_settings() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = defaultdict(list)
    for name, case in EXPECTED["cases"].items():
        groups[case.get("settings", "")].append(name)
    return groups


@pytest.mark.parametrize("settings_key", sorted(_cases_by_settings()))
@pytest.mark.parametrize("endpoint", ["validate", "mutate"])
async def test_corpus_through_https(tmp_path: Path, settings_key: str, endpoint: str) -> None:
    # The corpus assumes an unknown inventory (largest card = the 80 GiB fallback): no GPU nodes.
    # On /mutate, GPU pods that pass validation would then find no node: let them through.
    overrides: dict[str, Any] = {"state": {"inventory": {"source": "static"}}, "mutation": {"on_no_fit": "allow"}}
    if settings_key:
        overrides["validation"] = EXPECTED["settings"][settings_key]
    async with running_webhook(tmp_path, overrides) as hook:
        failures = []
        for name in _cases_by_settings()[settings_key]:
            case = EXPECTED["cases"][name]
            obj = yaml.safe_load((CORPUS / name).read_text())
            review = review_of(
                obj,
                namespace=case["namespace"],
                user=case.get("user", "alice"),
                groups=tuple(case.get("groups", ("system:authenticated",))),
            )
            answer = (await hook.review(endpoint, review))["response"]
            rules = _rules(answer)
            got = (answer["allowed"], rules["enforce"], rules["warn"], rules["audit"])
            want = (case["allowed"], set(case["rules"]), set(case["warns"]), set(case.get("audits", [])))
            if got != want:
                failures.append((name, got, want))
            if not answer["allowed"]:
                assert answer["status"]["code"] == 403
                assert "Fix" in answer["status"]["message"] or "修复" in answer["status"]["message"]
            assert bool(answer.get("warnings")) == bool(case["warns"]), name
            if endpoint == "validate":
                assert "patch" not in answer
        assert failures == []


# -- placement ------------------------------------------------------------------------------------

SIM = Path(__file__).resolve().parent.parent / "config" / "sim" / "cluster.yaml"


def _patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return orjson.loads(base64.b64decode(answer["patch"])) if "patch" in answer else []


def _gpu_pod(name: str, annotations: dict[str, str] | None = None, **limits: Any) -> dict[str, Any]:
    return pod(name, containers=[gpu_container(**limits)], annotations=annotations)


async def _mutate(hook: Webhook, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return (await hook.review("mutate", review_of(obj, namespace="team-a", **kw)))["response"]


@pytest.fixture
async def sim_webhook(tmp_path: Path) -> Any:
    async with running_webhook(tmp_path, {"state": {"interval_s": 0.2}}) as hook:
        for _ in range(100):
            if hook.server.runtime.readiness()[0]:
                break
            await asyncio.sleep(0.05)
        yield hook


async def test_opening_incident_card_full_per_nvml_is_never_offered(sim_webhook: Webhook) -> None:
    """gpu-b card 1 is free by promises but 13.5 GiB of its 15 GiB are used by a process no pod owns."""
    snapshot = sim_webhook.server.runtime.snapshot
    full_card = snapshot.node("gpu-b").gpus[1]
    assert full_card.memory_promised_mib == 0 and full_card.effective_free_mib < 2048
    placed = 0
    for i in range(6):  # binpack would love the busiest T4 if it only looked at promises
        obj = _gpu_pod(f"t4-{i}", {"nvidia.com/use-gputype": "T4"}, **{"nvidia.com/gpumem": 2048})
        answer = await _mutate(sim_webhook, obj)
        patched = jsonpatch.apply_patch(obj, _patch_of(answer))
        if answer["allowed"] and "patch" in answer:
            placed += 1
            devices = patched["metadata"]["annotations"].get(mutation.DEVICES, "")
            assert full_card.uuid not in devices
    assert placed >= 1  # the other T4 takes what fits, then placement says no


async def test_patch_is_valid_and_idempotent_and_reserves_once(sim_webhook: Webhook) -> None:
    runtime = sim_webhook.server.runtime
    obj = _gpu_pod("trainer", **{"nvidia.com/gpu": 1, "hami.io/vgpu-memory": "8Gi", "nvidia.com/gpucores": 30})
    answer = await _mutate(sim_webhook, obj)
    assert answer["allowed"] and answer["patchType"] == "JSONPatch"
    patched = jsonpatch.apply_patch(obj, _patch_of(answer))
    annotations = patched["metadata"]["annotations"]
    assert annotations[mutation.INJECTED] == "true"
    node = annotations[mutation.NODE]
    assert patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"][0]["values"] == [node]
    reserved = sum(u.memory_mib for u in runtime.ledger.overlay().values())
    assert reserved == 8192
    again = await _mutate(sim_webhook, patched)  # reinvocation: already injected
    assert again["allowed"] and "patch" not in again
    assert sum(u.memory_mib for u in runtime.ledger.overlay().values()) == 8192


async def test_dry_run_reserves_nothing(sim_webhook: Webhook) -> None:
    answer = await _mutate(sim_webhook, _gpu_pod("dry", **{"nvidia.com/gpumem": 4096}), dry_run=True)
    assert answer["allowed"] and "patch" in answer
    assert sim_webhook.server.runtime.ledger.overlay() == {}


async def test_updates_and_controllers_are_never_mutated(sim_webhook: Webhook) -> None:
    obj = _gpu_pod("p", **{"nvidia.com/gpumem": 4096})
    update = (await sim_webhook.review("mutate", review_of(obj, operation="UPDATE", old=obj)))["response"]
    assert update["allowed"] and "patch" not in update
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {"template": {"metadata": {}, "spec": obj["spec"]}},
    }
    answer = (await sim_webhook.review("mutate", review_of(deployment)))["response"]
    assert answer["allowed"] and "patch" not in answer


async def test_node_name_preset(sim_webhook: Webhook) -> None:
    fits = _gpu_pod("on-c", **{"nvidia.com/gpumem": 4096})
    fits["spec"]["nodeName"] = "gpu-c"
    answer = await _mutate(sim_webhook, fits)
    assert answer["allowed"]
    assert jsonpatch.apply_patch(fits, _patch_of(answer))["metadata"]["annotations"][mutation.NODE] == "gpu-c"
    too_big = _gpu_pod("on-b", **{"nvidia.com/gpumem": 16384})  # more than a T4 holds
    too_big["spec"]["nodeName"] = "gpu-b"
    answer = await _mutate(sim_webhook, too_big)
    assert not answer["allowed"]
    assert "spec.nodeName=gpu-b" in answer["status"]["message"]


async def test_hands_off_scheduler(sim_webhook: Webhook) -> None:
    obj = _gpu_pod("v", **{"nvidia.com/gpumem": 4096})
    obj["spec"]["schedulerName"] = "volcano"
    answer = await _mutate(sim_webhook, obj)
    assert answer["allowed"] and "patch" not in answer


ONLY_A10 = {"nvidia.com/use-gputype": "A10", "nvidia.com/nouse-gputype": "A100"}  # types match by substring


@pytest.mark.parametrize("mode", ["deny", "allow", "queue"])
async def test_on_no_fit(tmp_path: Path, mode: str) -> None:
    async with running_webhook(tmp_path, {"mutation": {"on_no_fit": mode}}) as hook:
        await asyncio.sleep(0.3)
        # 20 GiB on the A10: 8 GiB of its 22.5 GiB are already used per NVML.
        obj = _gpu_pod("huge", ONLY_A10, **{"nvidia.com/gpumem": 20480})
        answer = await _mutate(hook, obj)
        if mode == "deny":
            assert not answer["allowed"]
            message = answer["status"]["message"]
            assert "no node fits" in message and "gpu-d" in message and "Fix:" in message
        else:
            assert answer["allowed"]
            patched = jsonpatch.apply_patch(obj, _patch_of(answer))
            assert "no node fits" in patched["metadata"]["annotations"][mutation.DECISION]
            if mode == "queue":
                assert patched["spec"]["schedulingGates"] == [{"name": "hami.io/gpu-capacity"}]
            else:
                assert "schedulingGates" not in patched["spec"]


async def test_high_priority_pod_is_left_to_preemption(tmp_path: Path) -> None:
    async with running_webhook(tmp_path, {"mutation": {"allow_priority_at_or_above": 1000}}) as hook:
        await asyncio.sleep(0.3)
        obj = _gpu_pod("vip", ONLY_A10, **{"nvidia.com/gpumem": 20480})
        obj["spec"]["priority"] = 2000
        answer = await _mutate(hook, obj)
        assert answer["allowed"]
        assert (
            "preemption" in jsonpatch.apply_patch(obj, _patch_of(answer))["metadata"]["annotations"][mutation.DECISION]
        )


SLICES_SIM = {
    "nodes": {
        f"slice-{n}": {
            "gpus": [
                {"model": "NVIDIA L4", "memory_total_mib": 10240, "count": 5, "utilisation_gpu": 0, "temperature_c": 40}
            ]
        }
        for n in range(2)
    }
}


async def test_burst_of_200_for_100_slices_places_exactly_100(tmp_path: Path) -> None:
    sim = tmp_path / "slices.yaml"
    sim.write_text(yaml.safe_dump(SLICES_SIM))
    overrides = {"state": {"inventory": {"simulated_file": str(sim)}, "interval_s": 0.2}}
    async with running_webhook(tmp_path, overrides) as hook:
        await asyncio.sleep(0.3)

        async def one(i: int) -> dict[str, Any]:
            return await _mutate(hook, _gpu_pod(f"s-{i}", **{"nvidia.com/gpumem": 1024}))

        answers = await asyncio.gather(*(one(i) for i in range(200)))
    placed = [a for a in answers if a["allowed"]]
    assert len(placed) == 100
    per_device: dict[str, int] = defaultdict(int)
    for i, answer in enumerate(answers):
        if answer["allowed"]:
            patched = jsonpatch.apply_patch(_gpu_pod(f"s-{i}"), _patch_of(answer))
            for device in patched["metadata"]["annotations"][mutation.DEVICES].strip(";").split(":"):
                if device:
                    uuid, _, memory, _ = device.split(",")
                    per_device[uuid] += int(memory)
    assert len(per_device) == 10
    assert all(total <= 10240 for total in per_device.values()), per_device


async def test_decision_log_line_explains(sim_webhook: Webhook, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    await _mutate(sim_webhook, _gpu_pod("logged", **{"nvidia.com/gpumem": 2048}))
    lines = [line for line in capsys.readouterr().out.splitlines() if '"admission"' in line or "admission" in line]
    assert lines
    text = lines[-1]
    for word in ("decision", "policy", "considered", "filtered", "node"):
        assert word in text


def test_corpus_is_large_enough() -> None:
    assert len(EXPECTED["cases"]) >= 60
    assert copy.deepcopy(EXPECTED) == EXPECTED
