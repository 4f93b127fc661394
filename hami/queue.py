"""The scheduling-gate queue's other half: ungate queued pods once capacity appears.

With `mutation.on_no_fit: queue` a GPU pod that fits nowhere is admitted with the scheduling gate
`mutation.scheduling_gate` and `hami.io/queued: "true"` (mutation.queue_patch), so kube-scheduler
leaves it Pending. The pod watch keeps such pods (KubeInventory.queued_pods); after each snapshot,
in the background and never on the request path, the GateKeeper places them again, oldest first,
and for each that now fits it reserves the devices in the ledger and patches the pod: removes the
gate, pins the node through required node affinity, and writes the decision annotations.

Env cannot change on a live pod, so an ungated pod gets its devices through the annotations only
(HAMi's device plugin reads `hami.io/vgpu-devices-allocated`); while gated, Kubernetes allows
removing gates, narrowing required node affinity and any annotation change -- nothing else.

Two replicas may plan the same pod. Each reserves under its own key (`ns/name#token`), so the
second reservation is refused when the first took the room, and never overwrites the winner's;
the patch's `test` op on the gate entry makes the loser's patch fail with 422 when the winner
already removed it, and the loser then releases its own reservation.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hami import mutation
from hami.config import Config
from hami.observability import PLACEMENT_RESULTS, get_logger
from hami.placement.decision import Decision
from hami.placement.engine import place
from hami.placement.index import PlacementIndex
from hami.placement.settings import PlacementSettings
from hami.requests import DEFAULT_NAMES, GpuRequest, RequestError, ResourceNames, gpu_request
from hami.state.ledger import Ledger, merge_overlays, needs
from hami.state.model import DeviceUsage, Node, ReservationItem, Snapshot
from hami.tasks import cancel_and_wait
from hami.workloads import WorkloadError, pod_templates

log = get_logger("hami.queue")


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """Bounds on one background pass (each queued pod costs one `place()` call)."""

    max_plans_per_pass: int = 500  # queued pods placed per snapshot, oldest first; the rest wait for the next
    max_ungates_per_pass: int = 50  # pods ungated per snapshot, so a freed node is not flooded in one go


@dataclass(frozen=True, slots=True)
class QueuedPod:
    namespace: str
    name: str
    created: str  # metadata.creationTimestamp: RFC 3339 in UTC, so string order is time order
    pod: Mapping[str, Any]  # the pod as the watch last saw it (the patch is built against it)
    request: GpuRequest
    gate_index: int  # position of our gate in spec.schedulingGates

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Ungate:
    pod: QueuedPod
    decision: Decision
    items: tuple[ReservationItem, ...]  # what to reserve before the gate goes


# ---- pure ---------------------------------------------------------------------------------------


def gate_position(spec: Mapping[str, Any], gate: str) -> int | None:
    gates = spec.get("schedulingGates")
    if not isinstance(gates, list):
        return None
    for i, entry in enumerate(gates):
        if isinstance(entry, Mapping) and entry.get("name") == gate:
            return i
    return None


def queued_pod(pod: Mapping[str, Any], gate: str, names: ResourceNames = DEFAULT_NAMES) -> QueuedPod | None:
    """The pod as a queue entry, or None when it is not (or no longer) ours to ungate."""
    meta = pod.get("metadata")
    spec = pod.get("spec")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    annotations = meta.get("annotations")
    if not isinstance(annotations, Mapping) or annotations.get(mutation.QUEUED) != "true":
        return None
    position = gate_position(spec, gate)
    name, namespace = meta.get("name"), meta.get("namespace")
    if position is None or not isinstance(name, str) or not name or not isinstance(namespace, str):
        return None
    try:
        request = gpu_request(pod_templates({**pod, "kind": "Pod"}, namespace)[0], names)
    except (RequestError, WorkloadError):
        return None  # admission read it once; a pod changed since into something unreadable waits for a human
    if request is None:
        return None
    created = meta.get("creationTimestamp")
    return QueuedPod(namespace, name, created if isinstance(created, str) else "", pod, request, position)


def reservation_items(decision: Decision, request: GpuRequest, node: Node | None) -> tuple[ReservationItem, ...]:
    """The ledger items of a decision; capacities are what this replica saw promisable (as decide.py)."""
    items = []
    for device in decision.devices:
        gpu = node.gpu(device.uuid) if node is not None else None
        items.append(
            ReservationItem(
                node=decision.node or "",
                uuid=device.uuid,
                memory_mib=device.memory_mib,
                cores=device.cores,
                capacity_mib=gpu.effective_free_mib if gpu else device.memory_mib,
                capacity_cores=max(0, 100 - gpu.cores_promised) if gpu else 100,
                workload_type=request.workload_type or "",
            )
        )
    return tuple(items)


def usage_of(items: Sequence[ReservationItem]) -> dict[str, DeviceUsage]:
    """The overlay one reservation adds (the ledger's own per-device rule: one pod per device)."""
    types: dict[str, set[str]] = {}
    for it in items:
        if it.workload_type:
            types.setdefault(it.uuid, set()).add(it.workload_type)
    return {u: DeviceUsage(n.memory_mib, n.cores, 1, frozenset(types.get(u, ()))) for u, n in needs(items).items()}


def plan_ungates(
    queued: Sequence[QueuedPod],
    index: PlacementIndex,
    overlay: Mapping[str, DeviceUsage],
    settings: PlacementSettings,
    limit: int | None = None,
) -> list[Ungate]:
    """Which queued pods fit now, oldest first; each planned pod's devices count against the next.

    Not strict FIFO: a younger pod that fits is ungated past an older one that does not (backfill),
    since holding the whole queue behind one large pod would leave the freed room idle.
    """
    ordered = sorted(queued, key=lambda q: (q.created, q.key))
    plans: list[Ungate] = []
    used: Mapping[str, DeviceUsage] = overlay
    for q in ordered:
        if limit is not None and len(plans) >= limit:
            break
        decision = place(q.request, index, used, settings)
        if not decision.fits:
            continue
        items = reservation_items(decision, q.request, index.node(decision.node or ""))
        plans.append(Ungate(q, decision, items))
        used = merge_overlays(used, usage_of(items))
    return plans


def ungate_patch(ungate: Ungate, reservation_key: str, gate: str, topology_key: str) -> mutation.Patch:
    """Remove the gate (guarded by a `test` op: a concurrent removal fails the whole patch with
    422), pin the node by narrowing required node affinity (allowed while gated), annotate."""
    pod, decision = ungate.pod.pod, ungate.decision
    spec = pod.get("spec") or {}
    at = f"/spec/schedulingGates/{ungate.pod.gate_index}"
    ops: mutation.Patch = [{"op": "test", "path": at, "value": {"name": gate}}, {"op": "remove", "path": at}]
    ops += mutation.required_affinity_ops(spec, {"key": topology_key, "operator": "In", "values": [decision.node]})
    by_container: dict[int, list[Any]] = {}
    for device in decision.devices:
        by_container.setdefault(device.container_index, []).append(device)
    ops += mutation.annotation_ops(
        pod.get("metadata") or {},
        {
            mutation.INJECTED: "true",
            mutation.NODE: decision.node or "",
            mutation.DEVICES: mutation.devices_annotation([by_container[i] for i in sorted(by_container)]),
            mutation.DECISION: f"ungated: {decision.explain()}",
            mutation.RESERVATION: reservation_key,
        },
    )
    return ops


# ---- I/O: the background pass ---------------------------------------------------------------------


class DecisionState(Protocol):
    """What a pass reads of the runtime (hami.runtime.Runtime has these)."""

    config: Config
    placement_index: PlacementIndex
    ledger: Ledger


class QueueSource(Protocol):
    """The pod watch's queued pods and the one write (hami.state.kube.KubeInventory has these)."""

    def queued_pods(self) -> Iterable[Mapping[str, Any]]: ...

    async def patch_pod(self, namespace: str, name: str, patch: Any) -> None: ...


class GateKeeper:
    """Runs `plan_ungates` after each snapshot and applies the plans: reserve, then patch."""

    def __init__(self, state: DecisionState, source: QueueSource, settings: QueueSettings | None = None) -> None:
        self.state = state
        self.source = source
        self.settings = settings or QueueSettings()
        self.token = uuid.uuid4().hex[:8]  # this replica's reservation keys differ from the others'
        self._ungated: dict[str, str] = {}  # pod key -> reservation key, until the watch sees the gate gone
        self._cache: dict[str, tuple[str, QueuedPod | None]] = {}  # pod key -> (resourceVersion, entry)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.passes = 0  # background passes finished (tests and drills read it)

    def on_snapshot(self, snapshot: Snapshot) -> None:
        """Collector hook (synchronous): only wakes the pass, which runs in its own task."""
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="queue-gatekeeper")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()  # snapshots published during a pass fold into one more pass
            try:
                await self.run_once()
            except Exception:  # the queue must outlive any single bad pass
                log.exception("queue.pass_failed")
            self.passes += 1

    def queued(self) -> list[QueuedPod]:
        """The watch's queued pods as entries (parsed once per resourceVersion), minus those in flight."""
        cfg = self.state.config
        gate, names = cfg.mutation.scheduling_gate, cfg.validation.resources
        fresh: dict[str, tuple[str, QueuedPod | None]] = {}
        for pod in self.source.queued_pods():
            meta = pod.get("metadata") or {}
            key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            version = str(meta.get("resourceVersion", ""))
            cached = self._cache.get(key)
            fresh[key] = cached if cached is not None and version and cached[0] == version else (version, None)
            if fresh[key][1] is None:
                fresh[key] = (version, queued_pod(pod, gate, names))
        self._cache = fresh
        # A pod the watch no longer shows as queued (its gate is gone, or it was deleted) is done.
        self._ungated = {k: v for k, v in self._ungated.items() if fresh.get(k, ("", None))[1] is not None}
        return [q for _, q in fresh.values() if q is not None and q.key not in self._ungated]

    async def run_once(self) -> list[str]:
        """One pass; the keys of the pods ungated."""
        cfg = self.state.config
        s = self.settings
        queued = sorted(self.queued(), key=lambda q: (q.created, q.key))[: s.max_plans_per_pass]
        if not queued:
            return []
        index = self.state.placement_index
        # The index's settings, not config.placement: the runtime derives degradation from the state section.
        plans = plan_ungates(queued, index, self.state.ledger.overlay(), index.settings, s.max_ungates_per_pass)
        done = []
        for plan in plans:
            if await self._apply(plan, cfg):
                done.append(plan.pod.key)
        return done

    async def _apply(self, plan: Ungate, cfg: Config) -> bool:
        q, ledger = plan.pod, self.state.ledger
        key = f"{q.key}#{self.token}"
        result = await ledger.reserve(key, plan.items)
        if not result.ok:  # another replica (or an admission) took the room since the overlay was read
            PLACEMENT_RESULTS(plan.decision.policy, "ungate_reserve_conflict").inc()
            log.info("queue.reserve_refused", pod=q.key, reason=result.reason)
            return False
        patch = ungate_patch(plan, key, cfg.mutation.scheduling_gate, cfg.mutation.topology_key)
        try:
            await self.source.patch_pod(q.namespace, q.name, patch)
        except Exception as exc:  # 422: the gate moved (another replica won); 404: deleted; else: API trouble
            await ledger.release(key)
            status = getattr(exc, "status", None)
            PLACEMENT_RESULTS(plan.decision.policy, "ungate_patch_failed").inc()
            log.info("queue.patch_failed", pod=q.key, status=status, error=None if status else repr(exc))
            return False
        self._ungated[q.key] = key
        PLACEMENT_RESULTS(plan.decision.policy, "ungated").inc()
        log.info("queue.ungated", pod=q.key, node=plan.decision.node, devices=[d.uuid for d in plan.decision.devices])
        return True


def start_gatekeeper(state: DecisionState, source: Any, snapshot_hooks: list[Any]) -> GateKeeper | None:
    """A running GateKeeper when the inventory watches pods (Kubernetes), else None.

    It runs whatever `on_no_fit` is now: pods queued before a config change still need ungating,
    and with nothing queued a pass costs one empty scan.
    """
    if not (hasattr(source, "queued_pods") and hasattr(source, "patch_pod")):
        return None
    keeper = GateKeeper(state, source)
    snapshot_hooks.append(keeper.on_snapshot)
    keeper.start()
    return keeper
