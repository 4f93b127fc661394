"""The Kubernetes inventory against a fake API server on loopback that speaks list/watch.

No API server exists on this machine; the fake below stands for it and speaks the wire format
kubernetes-asyncio reads: a List with metadata.resourceVersion, then newline-delimited watch
events (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR 410) on `?watch=true`.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from hami.state.kube import KubeInventory, WatchLoop, parse_devices, pod_allocation
from hami.state.model import DeviceUsage
from hami.state.settings import KubeSettings, StateSettings

NODES, ALL_PODS, AGENT_PODS = "/api/v1/nodes", "/api/v1/pods", "/api/v1/namespaces/hami-system/pods"


@dataclass
class FakeApi:
    rv: int = 100
    objects: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    watchers: dict[str, list[asyncio.Queue[dict[str, Any] | None]]] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    fail: dict[str, int] = field(default_factory=dict)  # path -> how many next requests answer 500
    gone: set[str] = field(default_factory=set)  # paths whose next watch answers 410 Gone

    def put(self, path: str, kind: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        key = f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
        if kind == "DELETED":
            self.objects.get(path, {}).pop(key, None)
        else:
            self.objects.setdefault(path, {})[key] = obj
        for q in self.watchers.get(path, []):
            q.put_nowait({"type": kind, "object": obj})

    def bookmark(self, path: str) -> str:
        self.rv += 1
        for q in self.watchers.get(path, []):
            q.put_nowait({"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": str(self.rv)}}})
        return str(self.rv)

    def end_watches(self, path: str) -> None:
        """The server ends the watch normally (its timeout): clients resume from their resourceVersion."""
        for q in self.watchers.get(path, []):
            q.put_nowait(None)

    def watches(self, path: str) -> list[dict[str, str]]:
        return [q for p, q in self.requests if p == path and q.get("watch", "").lower() == "true"]

    def lists(self, path: str) -> list[dict[str, str]]:
        return [q for p, q in self.requests if p == path and q.get("watch", "").lower() != "true"]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path, query = request.path, dict(request.query)
        self.requests.append((path, query))
        if self.fail.get(path, 0) > 0:
            self.fail[path] -= 1
            return web.json_response({"kind": "Status", "code": 500, "message": "boom"}, status=500)
        if query.get("watch", "").lower() != "true":
            items = list(self.objects.get(path, {}).values())
            return web.json_response({"kind": "List", "metadata": {"resourceVersion": str(self.rv)}, "items": items})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if path in self.gone:
            self.gone.discard(path)
            status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
            await response.write(orjson.dumps({"type": "ERROR", "object": status}) + b"\n")
            return response
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.watchers.setdefault(path, []).append(queue)
        try:
            while (event := await queue.get()) is not None:
                await response.write(orjson.dumps(event) + b"\n")
        finally:
            self.watchers[path].remove(queue)
        return response


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def pod(name: str, ns: str = "default", node_name: str = "", annotations: dict[str, str] | None = None, **status: Any):
    return {
        "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
        "spec": {"nodeName": node_name, "containers": [{"name": "c"}]},
        "status": {"phase": "Running", **status},
    }


GPU_POD = {
    "hami.io/vgpu-node": "gpu-1",
    "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,8192,30:;GPU-a,NVIDIA,1024,0:GPU-b,NVIDIA,2048,10:;",
    "hami.io/workload-type": "inference",
    "hami.io/reservation": "default/p1",
}


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApi, client.ApiClient]]:
    fake = FakeApi()
    app = web.Application()
    app.router.add_get("/{tail:.*}", fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    api_client = client.ApiClient(configuration)
    yield fake, api_client
    for queues in fake.watchers.values():
        for q in queues:
            q.put_nowait(None)
    await api_client.close()
    await runner.cleanup()


SETTINGS = StateSettings(kube=KubeSettings(backoff_initial_s=0.02, backoff_max_s=0.1, watch_timeout_s=30))


async def eventually(check: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():  # noqa: ASYNC110 - the conditions are plain state of the code under test
            await asyncio.sleep(0.01)


def test_hami_device_annotation_is_parsed_per_device_and_container() -> None:
    shares = parse_devices(GPU_POD["hami.io/vgpu-devices-allocated"])
    assert [(d.uuid, d.memory_mib, d.cores) for d in shares] == [
        ("GPU-a", 8192, 30),
        ("GPU-a", 1024, 0),
        ("GPU-b", 2048, 10),
    ]
    assert parse_devices("garbage;;GPU-x,NVIDIA,notanumber,1:") == ()
    assert pod_allocation(pod("plain")) is None
    finished = pod_allocation(pod("done", node_name="gpu-1", annotations=GPU_POD, phase="Succeeded"))
    assert finished is not None and not finished.bound


async def test_list_then_watch_builds_sources_allocations_and_releases_bound_reservations(api) -> None:
    fake, api_client = api
    fake.put(NODES, "ADDED", node("gpu-1", zone="a"))
    fake.put(AGENT_PODS, "ADDED", pod("agent-x", ns="hami-system", node_name="gpu-1", podIP="10.1.2.3"))
    fake.put(ALL_PODS, "ADDED", pod("p1", annotations=GPU_POD))  # admitted, not bound yet
    inv = KubeInventory(SETTINGS, api_client)
    poked: list[int] = []
    inv.on_change.append(lambda: poked.append(1))
    await inv.start()
    try:
        await eventually(lambda: not inv.stale and "gpu-1" in inv.sources())
        source = inv.sources()["gpu-1"]
        assert getattr(source, "url", "") == "http://10.1.2.3:9400/status"
        assert inv.labels("gpu-1")["zone"] == "a"
        assert inv.allocations() == {} and inv.take_bound_reservations() == []  # unbound pods hold nothing yet
        await eventually(lambda: fake.watches(NODES))
        watch = fake.watches(NODES)[0]
        assert watch["resourceVersion"] == "103"  # the list's resourceVersion: nothing missed, nothing twice
        assert watch["allowWatchBookmarks"].lower() == "true" and watch["labelSelector"] == SETTINGS.kube.node_selector

        await eventually(lambda: fake.watchers.get(ALL_PODS))
        fake.put(ALL_PODS, "MODIFIED", pod("p1", node_name="gpu-1", annotations=GPU_POD))  # the scheduler bound it
        await eventually(lambda: inv.allocations())
        assert inv.allocations()["GPU-a"] == DeviceUsage(
            memory_mib=9216, cores=30, pods=1, workload_types=frozenset({"inference"})
        )
        assert inv.take_bound_reservations() == ["default/p1"]
        fake.put(ALL_PODS, "MODIFIED", pod("p1", node_name="gpu-1", annotations=GPU_POD))
        fake.put(ALL_PODS, "DELETED", pod("p1", node_name="gpu-1", annotations=GPU_POD))
        await eventually(lambda: not inv.allocations())
        assert inv.take_bound_reservations() == []  # released once, not at every event
        assert poked

        fake.put(AGENT_PODS, "DELETED", pod("agent-x", ns="hami-system", node_name="gpu-1", podIP="10.1.2.3"))
        await eventually(lambda: not hasattr(inv.sources()["gpu-1"], "url"))  # no agent: reads as no_agent
    finally:
        await inv.close()


async def test_bookmarks_move_the_resume_point_and_410_relists(api) -> None:
    fake, api_client = api
    fake.put(NODES, "ADDED", node("gpu-1"))
    inv = KubeInventory(SETTINGS, api_client)
    await inv.start()
    try:
        await eventually(lambda: fake.watchers.get(NODES))
        mark = fake.bookmark(NODES)
        await eventually(lambda: inv.loops[0].resource_version == mark)
        fake.end_watches(NODES)  # server-side timeout: resume from the bookmark, no relist
        await eventually(lambda: len(fake.watches(NODES)) == 2)
        assert fake.watches(NODES)[1]["resourceVersion"] == mark and len(fake.lists(NODES)) == 1

        fake.gone.add(NODES)
        fake.put(NODES, "ADDED", node("gpu-2"))  # missed while the watch is gone: the relist finds it
        await eventually(lambda: fake.watchers.get(NODES))
        fake.end_watches(NODES)
        await eventually(lambda: len(fake.lists(NODES)) == 2)
        await eventually(lambda: set(inv.sources()) == {"gpu-1", "gpu-2"})
        assert not inv.stale
    finally:
        await inv.close()


async def test_broken_watch_marks_stale_and_reconnects_with_exponential_backoff(api) -> None:
    fake, api_client = api
    delays: list[float] = []
    stale: list[bool] = []

    async def sleep(s: float) -> None:
        delays.append(s)
        await asyncio.sleep(0)

    fake.fail[NODES] = 5
    v1 = client.CoreV1Api(api_client)
    loop = WatchLoop(
        "nodes",
        v1.list_node,
        {"label_selector": "x=y"},
        SETTINGS.kube,
        lambda items: None,
        lambda kind, obj: None,
        lambda kind, s: stale.append(s),
        sleep=sleep,
    )
    task = asyncio.create_task(loop.run())
    try:
        await eventually(lambda: loop.lists == 1 and fake.watchers.get(NODES))
        assert delays == [0.02, 0.04, 0.08, 0.1, 0.1]  # doubled, capped at backoff_max_s
        assert stale[:5] == [True] * 5 and stale[-1] is False  # stale while broken, fresh after the relist
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
