"""Kubernetes inventory: GPU nodes, their agents' addresses, and what bound pods were given.

Three list+watch loops (kubernetes-asyncio), each resuming from the last resourceVersion with
bookmarks on; a 410 Gone relists; any other failure marks the data stale and reconnects with
exponential backoff. Nothing here ever raises into the process: a broken watch only means
older data (`stale`), which the collector logs and counts.

The only API calls made (the RBAC test checks these): `list_node`, `list_namespaced_pod`,
`list_pod_for_all_namespaces` (each listed and watched) and `patch_namespaced_pod` (`patch_pod`,
for the scheduling-gate queue).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import structlog
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from hami.node.schema import NodeStatus
from hami.state import metrics
from hami.state.agents import AgentError, HttpAgent, StatusSource
from hami.state.inventory import NO_LABELS, http_session
from hami.state.model import DeviceUsage, NamespaceUsage, quota_usage
from hami.state.settings import KubeSettings, StateSettings

log = structlog.get_logger(__name__)

VGPU_NODE = "hami.io/vgpu-node"
DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
WORKLOAD_TYPE = "hami.io/workload-type"
RESERVATION = "hami.io/reservation"
QUEUED = "hami.io/queued"
_DONE_PHASES = frozenset({"Succeeded", "Failed"})


# ---- pure: pods' annotations -> allocations -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceShare:
    uuid: str
    kind: str
    memory_mib: int
    cores: int


def parse_devices(value: str) -> tuple[DeviceShare, ...]:
    """HAMi's `UUID,NVIDIA,memMiB,cores:` per device, `;` per container. Bad entries are skipped."""
    out = []
    for container in value.split(";"):
        for device in container.split(":"):
            fields = device.strip().split(",")
            if len(fields) < 4 or not fields[0]:
                continue
            try:
                out.append(DeviceShare(fields[0], fields[1], int(fields[2]), int(fields[3])))
            except ValueError:
                continue
    return tuple(out)


@dataclass(frozen=True, slots=True)
class PodAllocation:
    key: str  # namespace/name
    bound: bool  # spec.nodeName set and the pod not finished
    devices: tuple[DeviceShare, ...]
    workload_type: str
    reservation: str  # the ledger key to release once the pod is bound


def pod_allocation(pod: Mapping[str, Any]) -> PodAllocation | None:
    """What a pod holds, from the annotations the mutation wrote; None for pods without GPUs from us."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    devices = parse_devices(str(annotations.get(DEVICES_ALLOCATED, "")))
    reservation = str(annotations.get(RESERVATION, ""))
    if not devices and not reservation:
        return None
    phase = (pod.get("status") or {}).get("phase", "")
    bound = bool((pod.get("spec") or {}).get("nodeName")) and phase not in _DONE_PHASES
    return PodAllocation(
        key=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        bound=bound,
        devices=devices,
        workload_type=str(annotations.get(WORKLOAD_TYPE, "")),
        reservation=reservation,
    )


def usage_by_namespace(pods: Iterable[PodAllocation]) -> dict[str, NamespaceUsage]:
    """What bound pods count against their namespace's quota (same rule as the ledger's)."""
    totals: dict[str, NamespaceUsage] = {}
    for p in pods:
        if not p.bound:
            continue
        namespace = p.key.split("/", 1)[0]
        for d in p.devices:
            totals[namespace] = totals.get(namespace, NamespaceUsage()) + quota_usage(d.memory_mib, d.cores)
    return totals


def allocations_of(pods: Iterable[PodAllocation]) -> dict[str, DeviceUsage]:
    """Memory, cores, pod count and workload types per device UUID of the bound pods."""
    mem: dict[str, int] = {}
    cores: dict[str, int] = {}
    count: dict[str, set[str]] = {}
    types: dict[str, set[str]] = {}
    for p in pods:
        if not p.bound:
            continue
        for d in p.devices:
            mem[d.uuid] = mem.get(d.uuid, 0) + d.memory_mib
            cores[d.uuid] = cores.get(d.uuid, 0) + d.cores
            count.setdefault(d.uuid, set()).add(p.key)
            if p.workload_type:
                types.setdefault(d.uuid, set()).add(p.workload_type)
    return {u: DeviceUsage(mem[u], cores[u], len(count[u]), frozenset(types.get(u, ()))) for u in mem}


def agent_address(pod: Mapping[str, Any], port: int) -> tuple[str, str] | None:
    """(node name, agent base URL) of a running agent pod with an IP, else None."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    node, ip = spec.get("nodeName"), status.get("podIP")
    if not node or not ip or status.get("phase") != "Running":
        return None
    host = f"[{ip}]" if ":" in ip else ip
    return str(node), f"http://{host}:{port}"


def is_queued(pod: Mapping[str, Any]) -> bool:
    """Held by the queue mode (hami/queue.py): annotated queued and still carrying a scheduling gate."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    gates = (pod.get("spec") or {}).get("schedulingGates")
    return annotations.get(QUEUED) == "true" and isinstance(gates, list) and bool(gates)


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


# ---- list + watch ------------------------------------------------------------------------------


class WatchLoop:
    """List, then watch from the list's resourceVersion; relist on 410; back off on failures."""

    def __init__(
        self,
        kind: str,
        list_fn: Callable[..., Awaitable[Any]],
        kwargs: Mapping[str, Any],
        settings: KubeSettings,
        on_list: Callable[[list[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None],
        on_stale: Callable[[str, bool], None],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.kind = kind
        self._list_fn = list_fn
        self._kwargs = dict(kwargs)
        self._settings = settings
        self._on_list = on_list
        self._on_event = on_event
        self._on_stale = on_stale
        self._sleep = sleep
        self.resource_version: str | None = None
        self.lists = 0  # how many times it listed (tests and drills read it)

    async def _list(self) -> None:
        # Raw JSON (no model objects); without preloading, the client does not check the status itself.
        response = await self._list_fn(**self._kwargs, _preload_content=False)
        try:
            if response.status != 200:
                raise ApiException(status=response.status, reason=(await response.text())[:200])
            doc = await response.json()
        finally:
            response.release()
        self._on_list(list(doc.get("items") or []))
        self.resource_version = str((doc.get("metadata") or {}).get("resourceVersion") or "")
        self.lists += 1

    async def _watch(self) -> None:
        watch = Watch(return_type="object")  # raw dicts: no model validation, less CPU per event
        try:
            stream = watch.stream(
                self._list_fn,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._settings.watch_timeout_s,
                **self._kwargs,
            )
            async for event in stream:
                kind = str(event["type"])
                if kind != "BOOKMARK":
                    self._on_event(kind, event["raw_object"])
                # Watch keeps the last resourceVersion it saw, bookmarks included.
                self.resource_version = watch.resource_version or self.resource_version
        finally:
            await watch.close()
            # Watch builds its own ApiClient (only to decode events) and never closes it.
            await watch._api_client.close()

    async def run(self) -> None:
        backoff = self._settings.backoff_initial_s
        while True:
            try:
                if not self.resource_version:
                    await self._list()
                    self._on_stale(self.kind, False)
                await self._watch()  # returns when the server ends the watch: resume from where it was
                backoff = self._settings.backoff_initial_s
            except ApiException as exc:
                if exc.status == 410:  # the resourceVersion is too old: only a relist can catch up
                    log.info("kube.watch_gone_relist", kind=self.kind)
                    self.resource_version = None
                    continue
                await self._failed(exc, backoff)
                backoff = min(backoff * 2, self._settings.backoff_max_s)
            except Exception as exc:  # a broken watch never ends the process
                await self._failed(exc, backoff)
                backoff = min(backoff * 2, self._settings.backoff_max_s)

    async def _failed(self, exc: BaseException, backoff: float) -> None:
        self._on_stale(self.kind, True)
        log.warning("kube.watch_broken", kind=self.kind, error=repr(exc), retry_in_s=backoff)
        await self._sleep(backoff)


class _NoAgent:
    """A node whose agent pod is not running (yet): it reads as a failure with that reason."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name

    async def read(self) -> NodeStatus:
        raise AgentError("no_agent", f"no running agent pod on {self.node_name}")


class KubeInventory:
    """Inventory and allocation source fed by three watches; also the collector's poke source."""

    def __init__(self, settings: StateSettings, api_client: client.ApiClient | None = None) -> None:
        self.settings = settings
        self.kube = settings.kube
        self._api_client = api_client
        self._own_client = api_client is None
        self._session = http_session(settings)
        self._nodes: dict[str, Mapping[str, str]] = {}
        self._agents: dict[str, str] = {}  # agent pod key -> node name
        self._agent_urls: dict[str, str] = {}  # node name -> base URL
        self._sources: dict[str, StatusSource] = {}
        self._pods: dict[str, PodAllocation] = {}
        self._queued: dict[str, dict[str, Any]] = {}  # queue mode: gated pods, kept whole for hami/queue.py
        self._allocations: Mapping[str, DeviceUsage] = MappingProxyType({})
        self._usage: Mapping[str, NamespaceUsage] = MappingProxyType({})
        self._released: set[str] = set()  # reservation keys already handed to the ledger
        self._to_release: list[str] = []
        self._stale: dict[str, bool] = {}
        self.on_change: list[Callable[[], None]] = []  # e.g. collector.poke
        self.loops: list[WatchLoop] = []
        self._tasks: list[asyncio.Task[None]] = []

    # -- what the collector reads -------------------------------------------------------------------

    @property
    def stale(self) -> bool:
        return any(self._stale.values())

    def sources(self) -> Mapping[str, StatusSource]:
        return {name: self._sources.get(name) or _NoAgent(name) for name in self._nodes}

    def labels(self, node: str) -> Mapping[str, str]:
        return self._nodes.get(node, NO_LABELS)

    def allocations(self) -> Mapping[str, DeviceUsage]:
        return self._allocations

    def namespace_usage(self, namespace: str) -> NamespaceUsage:
        return self._usage.get(namespace, NamespaceUsage())

    def queued_pods(self) -> list[dict[str, Any]]:
        """Pods held by the queue mode's scheduling gate, as the watch last saw them (hami/queue.py)."""
        return list(self._queued.values())

    def take_bound_reservations(self) -> list[str]:
        out, self._to_release = self._to_release, []
        return out

    # -- watch handlers (pure state updates) --------------------------------------------------------

    def _nodes_listed(self, items: list[dict[str, Any]]) -> None:
        self._nodes = {}
        for obj in items:
            self._node_event("ADDED", obj)

    def _node_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        if kind == "DELETED":
            self._nodes.pop(name, None)
        else:
            self._nodes[name] = MappingProxyType(dict((obj.get("metadata") or {}).get("labels") or {}))
        self._changed()

    def _agents_listed(self, items: list[dict[str, Any]]) -> None:
        self._agents, self._agent_urls = {}, {}
        for obj in items:
            self._agent_event("ADDED", obj)

    def _agent_event(self, kind: str, obj: dict[str, Any]) -> None:
        key = _name(obj)
        old_node = self._agents.pop(key, None)
        if old_node is not None:
            self._agent_urls.pop(old_node, None)
        found = None if kind == "DELETED" else agent_address(obj, self.kube.agent_port)
        if found is not None:
            self._agents[key] = found[0]
            self._agent_urls[found[0]] = found[1]
        self._sources = {
            node: HttpAgent(node, f"{url}/status", self._session) for node, url in self._agent_urls.items()
        }
        self._changed()

    def _pods_listed(self, items: list[dict[str, Any]]) -> None:
        self._pods = {}
        self._queued = {}
        for obj in items:
            self._pod_event("ADDED", obj, recompute=False)
        self._recompute()

    def _pod_event(self, kind: str, obj: dict[str, Any], recompute: bool = True) -> None:
        key = _name(obj)
        # -- queue mode: track gated pods (hami/queue.py ungates them); they hold no allocation yet
        if kind != "DELETED" and is_queued(obj):
            self._queued[key] = obj
        else:
            self._queued.pop(key, None)
        alloc = None if kind == "DELETED" else pod_allocation(obj)
        if alloc is None and key not in self._pods:
            return  # a pod without our GPUs: most of a cluster's pod events end here
        if alloc is None:
            gone = self._pods.pop(key, None)
            if gone is not None and gone.reservation:
                self._release(gone.reservation)  # deleted before or after binding: nothing left to hold
        else:
            self._pods[key] = alloc
            if alloc.bound and alloc.reservation:
                self._release(alloc.reservation)
        if recompute:
            self._recompute()

    def _release(self, reservation: str) -> None:
        if reservation not in self._released:
            self._released.add(reservation)
            self._to_release.append(reservation)

    def _recompute(self) -> None:
        self._allocations = MappingProxyType(allocations_of(self._pods.values()))
        self._usage = MappingProxyType(usage_by_namespace(self._pods.values()))
        live = {p.reservation for p in self._pods.values()}
        self._released &= live  # forget released keys of pods that are gone (bounded memory)
        self._changed()

    def _set_stale(self, kind: str, stale: bool) -> None:
        if self._stale.get(kind) != stale:
            metrics.DEGRADATION_TRANSITIONS.labels(f"kube_{kind}", "stale" if stale else "fresh").inc()
        self._stale[kind] = stale

    def _changed(self) -> None:
        for hook in self.on_change:
            hook()

    # -- lifecycle --------------------------------------------------------------------------------

    async def _client(self) -> client.ApiClient:
        if self._api_client is None:
            if self.kube.kubeconfig:
                await config.load_kube_config(config_file=self.kube.kubeconfig)
            else:
                config.load_incluster_config()
            self._api_client = client.ApiClient()
        return self._api_client

    async def start(self) -> None:
        v1 = client.CoreV1Api(await self._client())
        k = self.kube
        self.loops = [
            WatchLoop(
                "nodes",
                v1.list_node,
                {"label_selector": k.node_selector},
                k,
                self._nodes_listed,
                self._node_event,
                self._set_stale,
            ),
            WatchLoop(
                "agents",
                v1.list_namespaced_pod,
                {"namespace": k.agent_namespace, "label_selector": k.agent_selector},
                k,
                self._agents_listed,
                self._agent_event,
                self._set_stale,
            ),
            WatchLoop(
                "pods", v1.list_pod_for_all_namespaces, {}, k, self._pods_listed, self._pod_event, self._set_stale
            ),
        ]
        for loop in self.loops:
            self._stale[loop.kind] = True  # until its first list
        self._tasks = [asyncio.create_task(loop.run(), name=f"kube-watch-{loop.kind}") for loop in self.loops]

    async def patch_pod(self, namespace: str, name: str, patch: Any) -> None:
        """Patch one pod (the scheduling-gate queue removes its gate with this). A list is an RFC 6902
        JSON patch, sent as such so its `test` ops guard it; a mapping is a strategic merge patch."""
        v1 = client.CoreV1Api(await self._client())
        kind = "application/json-patch+json" if isinstance(patch, list) else "application/strategic-merge-patch+json"
        await v1.patch_namespaced_pod(name, namespace, patch, _content_type=kind)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._session.close()
        if self._own_client and self._api_client is not None:
            await self._api_client.close()
