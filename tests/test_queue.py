"""The queue mode's other half: queued (gated) pods are ungated when a snapshot shows room.

The planner is tested on small indexes; the GateKeeper against the fake API server of
test_state_kube, extended here to apply JSON patches (with jsonpatch) and to answer a failed
`test` op with 422, as kube-apiserver does.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from hami import config as config_mod
from hami.config import Config
from hami.placement.engine import PlacementSettings, build_index
from hami.placement.index import PlacementIndex
from hami.queue import GateKeeper, QueuedPod, plan_ungates, queued_pod, ungate_patch
from hami.runtime import Runtime
from hami.state.collector import Collector, StateLayer
from hami.state.kube import KubeInventory
from hami.state.ledger import InProcessLedger, Ledger
from hami.state.model import DeviceUsage, Gpu, Node, Snapshot
from tests.test_state_kube import ALL_PODS, SETTINGS, FakeApi, eventually

GATE = "hami.io/gpu-capacity"
GIB = 1024


def gated_pod(
    name: str, mib: int, created: str = "2024-05-01T10:00:00Z", gates: list[str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A pod as mutation.queue_patch leaves it: our gate and hami.io/queued."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "creationTimestamp": created,
            "annotations": {"hami.io/queued": "true", "hami.io/decision": "queued: no node fits"},
        },
        "spec": {
            "containers": [{"name": "cuda", "image": "cuda", "resources": {"limits": {"nvidia.com/gpumem": str(mib)}}}],
            "schedulingGates": [{"name": g} for g in (gates if gates is not None else [GATE])],
            **spec,
        },
        "status": {"phase": "Pending"},
    }


def entry(pod: Mapping[str, Any]) -> QueuedPod:
    found = queued_pod(pod, GATE)
    assert found is not None
    return found


def one_card(promised_mib: int, total_mib: int = 16 * GIB) -> Snapshot:
    gpu = Gpu("GPU-a", 0, "A100", total_mib, memory_promised_mib=promised_mib)
    return Snapshot((Node("gpu-1", (gpu,)),), version=1)


def index_of(snapshot: Snapshot) -> PlacementIndex:
    return build_index(snapshot, PlacementSettings())


# ---- the pure planner ----------------------------------------------------------------------------


def test_only_pods_held_by_our_gate_and_annotation_are_queue_entries() -> None:
    assert entry(gated_pod("q", 1024)).gate_index == 0
    assert entry(gated_pod("q", 1024, gates=["other", GATE])).gate_index == 1
    assert queued_pod(gated_pod("q", 1024, gates=["other"]), GATE) is None  # someone else's gate only
    assert queued_pod(gated_pod("q", 1024, gates=[]), GATE) is None  # already ungated
    unannotated = gated_pod("q", 1024)
    del unannotated["metadata"]["annotations"]["hami.io/queued"]
    assert queued_pod(unannotated, GATE) is None


def test_a_pod_that_fits_now_is_planned_and_one_that_still_does_not_stays() -> None:
    index = index_of(one_card(promised_mib=12 * GIB))  # 4 GiB free
    plans = plan_ungates(
        [entry(gated_pod("big", 8 * GIB)), entry(gated_pod("small", 2 * GIB))], index, {}, PlacementSettings()
    )
    assert [p.pod.name for p in plans] == ["small"]
    assert plans[0].decision.node == "gpu-1"
    assert [(i.uuid, i.memory_mib, i.capacity_mib) for i in plans[0].items] == [("GPU-a", 2 * GIB, 4 * GIB)]


def test_oldest_first_and_each_plan_consumes_the_room_the_next_one_sees() -> None:
    index = index_of(one_card(promised_mib=12 * GIB))  # 4 GiB free
    young = entry(gated_pod("young", 3 * GIB, created="2024-05-01T10:00:05Z"))
    old = entry(gated_pod("old", 3 * GIB, created="2024-05-01T10:00:01Z"))
    tiny = entry(gated_pod("tiny", 1 * GIB, created="2024-05-01T10:00:09Z"))
    plans = plan_ungates([young, tiny, old], index, {}, PlacementSettings())
    # old takes 3 of the 4 GiB; young (3) no longer fits within the same pass; tiny (1) backfills.
    assert [p.pod.name for p in plans] == ["old", "tiny"]


def test_the_ledger_overlay_counts_and_the_limit_bounds_a_pass() -> None:
    index = index_of(one_card(promised_mib=0))
    pods = [entry(gated_pod(f"p{i}", 4 * GIB, created=f"2024-05-01T10:00:0{i}Z")) for i in range(4)]
    reserved = {"GPU-a": DeviceUsage(memory_mib=10 * GIB, pods=1)}  # another admission's pending reservation
    assert [p.pod.name for p in plan_ungates(pods, index, reserved, PlacementSettings())] == ["p0"]
    assert [p.pod.name for p in plan_ungates(pods, index, {}, PlacementSettings(), limit=2)] == ["p0", "p1"]


def test_ungate_patch_removes_only_our_gate_pins_the_node_and_annotates() -> None:
    pod = gated_pod("q", 2 * GIB, gates=["other", GATE])
    plan = plan_ungates([entry(pod)], index_of(one_card(0)), {}, PlacementSettings())[0]
    after = jsonpatch.apply_patch(pod, ungate_patch(plan, "default/q#t", GATE, "kubernetes.io/hostname"))
    assert after["spec"]["schedulingGates"] == [{"name": "other"}]
    terms = after["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-1"]}]}
    ]
    notes = after["metadata"]["annotations"]
    assert notes["hami.io/vgpu-node"] == "gpu-1" and notes["hami.io/injected"] == "true"
    assert notes["hami.io/vgpu-devices-allocated"] == f"GPU-a,NVIDIA,{2 * GIB},0:;"
    assert notes["hami.io/reservation"] == "default/q#t"
    assert "env" not in after["spec"]["containers"][0]  # env of a live pod cannot change


def test_ungate_patch_narrows_existing_required_terms_and_fails_if_the_gate_moved() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [zone]}]}
        }
    }
    pod = gated_pod("q", GIB, affinity=affinity)
    plan = plan_ungates([entry(pod)], index_of(one_card(0)), {}, PlacementSettings())
    assert plan == []  # the node has no zone=a label: the pod's own terms still bind the planner
    labelled = Snapshot((Node("gpu-1", one_card(0).nodes[0].gpus, labels={"zone": "a"}),), version=1)
    plan = plan_ungates([entry(pod)], index_of(labelled), {}, PlacementSettings())
    patch = ungate_patch(plan[0], "default/q#t", GATE, "kubernetes.io/hostname")
    after = jsonpatch.apply_patch(pod, patch)
    term = after["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0] == zone  # kept, and ANDed with the hostname
    assert term["nodeSelectorTerms"][0]["matchExpressions"][1]["values"] == ["gpu-1"]
    moved = copy.deepcopy(pod)
    moved["spec"]["schedulingGates"] = [{"name": "other"}]
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(moved, patch)


# ---- the GateKeeper against a fake API server ----------------------------------------------------


@dataclass
class PatchingApi(FakeApi):
    """FakeApi plus PATCH of pods: JSON patch only, applied with jsonpatch; a failed op is a 422."""

    patches: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)

    async def handle_patch(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        if request.content_type != "application/json-patch+json":
            return web.json_response({"kind": "Status", "code": 415, "message": request.content_type}, status=415)
        ops = await request.json()
        self.patches.append((f"{ns}/{name}", ops))
        current = self.objects.get(ALL_PODS, {}).get(f"{ns}/{name}")
        if current is None:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        try:
            patched = jsonpatch.apply_patch(current, ops)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            return web.json_response(
                {"kind": "Status", "code": 422, "reason": "Invalid", "message": str(exc)}, status=422
            )
        self.put(ALL_PODS, "MODIFIED", patched)
        return web.json_response(self.objects[ALL_PODS][f"{ns}/{name}"])


@pytest.fixture
async def api() -> AsyncIterator[tuple[PatchingApi, client.ApiClient]]:
    fake = PatchingApi()
    app = web.Application()
    app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}", fake.handle_patch)
    app.router.add_get("/{tail:.*}", fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    api_client = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
    yield fake, api_client
    for queues in fake.watchers.values():
        for q in queues:
            q.put_nowait(None)
    await api_client.close()
    await runner.cleanup()


def queue_config() -> Config:
    return config_mod.load(None, environ={}, overrides={"mutation": {"on_no_fit": "queue"}})


@dataclass
class State:
    """The three things a pass reads of the runtime."""

    config: Config
    placement_index: PlacementIndex
    ledger: Ledger


@dataclass
class FrozenView:
    """A replica whose watch has not seen the latest change yet: a fixed list of queued pods."""

    pods: list[dict[str, Any]]
    inventory: KubeInventory

    def queued_pods(self) -> Iterable[Mapping[str, Any]]:
        return self.pods

    async def patch_pod(self, namespace: str, name: str, patch: Any) -> None:
        await self.inventory.patch_pod(namespace, name, patch)


async def test_runtime_ungates_a_queued_pod_once_a_snapshot_shows_room(api) -> None:
    fake, api_client = api
    fake.put(ALL_PODS, "ADDED", gated_pod("waiting", 4 * GIB))
    done = gated_pod("done-already", 4 * GIB, created="2024-05-01T09:00:00Z", gates=[])  # gate removed already
    fake.put(ALL_PODS, "ADDED", done)
    inventory = KubeInventory(SETTINGS, api_client)
    ledger = InProcessLedger()
    runtime = Runtime(queue_config())
    collector = Collector(runtime.config.state, inventory, ledger=ledger)  # not started: the test publishes
    await inventory.start()
    try:
        runtime.adopt(StateLayer(collector, ledger, None))
        keeper = runtime.gatekeeper
        assert keeper is not None
        await eventually(lambda: [p["metadata"]["name"] for p in inventory.queued_pods()] == ["waiting"])

        await collector._publish(one_card(promised_mib=14 * GIB))  # the collector's own hook path: 2 GiB free
        await eventually(lambda: keeper.passes >= 1)
        assert fake.patches == [] and ledger.reservations() == []

        await collector._publish(one_card(promised_mib=0))  # a pod finished: room now
        await eventually(lambda: keeper.passes >= 2)
        assert [key for key, _ in fake.patches] == ["default/waiting"]  # never the already-ungated pod
        pod = fake.objects[ALL_PODS]["default/waiting"]
        assert pod["spec"]["schedulingGates"] == []
        assert pod["metadata"]["annotations"]["hami.io/vgpu-node"] == "gpu-1"
        [reservation] = ledger.reservations()
        assert reservation.key == pod["metadata"]["annotations"]["hami.io/reservation"]
        assert reservation.key.startswith("default/waiting#") and reservation.items[0].memory_mib == 4 * GIB
        await eventually(lambda: not inventory.queued_pods())  # the watch saw the gate go

        await collector._publish(one_card(promised_mib=0))
        await eventually(lambda: keeper.passes >= 3)
        assert len(fake.patches) == 1  # nothing left to ungate
    finally:
        await runtime.stop()


async def test_two_replicas_cannot_both_ungate_the_same_pod(api) -> None:
    fake, api_client = api
    # Our gate first: without the `test` op the loser's `remove /spec/schedulingGates/0` would drop the other.
    fake.put(ALL_PODS, "ADDED", gated_pod("contested", 2 * GIB, gates=[GATE, "example.com/other"]))
    inventory = KubeInventory(SETTINGS, api_client)
    await inventory.start()
    try:
        await eventually(lambda: inventory.queued_pods())
        stale = copy.deepcopy(inventory.queued_pods())
        shared = InProcessLedger()  # stands for the Redis ledger both replicas share
        index = index_of(one_card(promised_mib=0))
        first = GateKeeper(State(queue_config(), index, shared), FrozenView(stale, inventory))
        second = GateKeeper(State(queue_config(), index, shared), FrozenView(stale, inventory))
        assert await first.run_once() == ["default/contested"]
        # The second still sees the gate (its watch lags): its own reservation fits, its patch's test op fails.
        assert await second.run_once() == []
        assert len(fake.patches) == 2
        [reservation] = shared.reservations()
        assert reservation.key == f"default/contested#{first.token}"  # the loser released only its own
        pod = fake.objects[ALL_PODS]["default/contested"]
        assert pod["metadata"]["annotations"]["hami.io/reservation"] == reservation.key
        assert pod["spec"]["schedulingGates"] == [{"name": "example.com/other"}]
    finally:
        await inventory.close()


async def test_a_refused_reservation_leaves_the_pod_gated(api) -> None:
    fake, api_client = api
    fake.put(ALL_PODS, "ADDED", gated_pod("late", 8 * GIB))
    inventory = KubeInventory(SETTINGS, api_client)
    await inventory.start()
    try:
        await eventually(lambda: inventory.queued_pods())
        index = index_of(one_card(promised_mib=4 * GIB))  # 12 GiB free
        ledger = InProcessLedger()
        # Another replica booked 8 GiB; this replica's overlay has not caught up (Redis refresh lag).
        other = plan_ungates([entry(gated_pod("other", 8 * GIB))], index, {}, PlacementSettings())[0]
        assert ledger.reserve_now("default/other", other.items).ok
        keeper = GateKeeper(State(queue_config(), index, _Blind(ledger)), inventory)  # type: ignore[arg-type]
        assert await keeper.run_once() == []
        assert fake.patches == [] and [r.key for r in ledger.reservations()] == ["default/other"]
        assert fake.objects[ALL_PODS]["default/late"]["spec"]["schedulingGates"] == [{"name": GATE}]
    finally:
        await inventory.close()


class _Blind:
    """A ledger whose overlay lags (Redis' refresh interval): reserve still checks the truth."""

    def __init__(self, ledger: InProcessLedger) -> None:
        self._ledger = ledger

    def overlay(self) -> Mapping[str, DeviceUsage]:
        return {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)
