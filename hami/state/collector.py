"""The background collector: keeps `collector.snapshot` fresh so the request path never waits.

Every `interval_s` (and when poked by a watch event) it reads every node's status, at most
`agents.concurrency` at a time, each read bounded by `agents.timeout_s` and guarded by that node's
circuit breaker, asks Prometheus for utilisation in parallel, and publishes a new immutable
Snapshot. The request path reads `collector.snapshot`: a plain attribute, no await, no lock.

What an unreachable node becomes is the degradation mode's choice (`degrade`, pure):
conservative excludes it (UNKNOWN, no GPUs), aggressive keeps its last state marked STALE for at
most `max_stale_s`. Each change of a node's freshness, of Prometheus' and of the pod watch's state
is logged once and counted, not at every refresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import structlog
from pybreaker import CircuitBreaker, CircuitBreakerError, CircuitBreakerListener

from hami.node.schema import NodeStatus, StatusError, parse_status
from hami.state import metrics
from hami.state.agents import StatusSource, error_reason, node_from_status
from hami.state.cache import TwoLevelCache
from hami.state.inventory import AllocationSource, Inventory
from hami.state.ledger import Ledger
from hami.state.model import EMPTY_SNAPSHOT, DeviceUsage, Freshness, Node, Snapshot
from hami.state.node_metrics import NODE_GAUGES
from hami.state.promql import PromError, PromUtilisation
from hami.state.settings import AGGRESSIVE, StateSettings
from hami.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

NO_ALLOCATIONS: Mapping[str, DeviceUsage] = MappingProxyType({})


YIELD_EVERY = 64  # nodes handled between two yields to the event loop during a refresh


@dataclass(frozen=True, slots=True)
class LastGood:
    status: NodeStatus
    received_at: float  # local clock: the age that max_stale_s bounds


def degrade(
    name: str, last: Node | None, last_seen: float, reason: str, mode: str, max_stale_s: float, now: float
) -> Node:
    """What a node that did not answer becomes in the snapshot.

    UNKNOWN nodes carry no GPUs, so no placement can use them by mistake; the reason says why.
    """
    if mode == AGGRESSIVE and last is not None and now - last_seen <= max_stale_s:
        return replace(last, freshness=Freshness.STALE, reason=reason)
    if last is not None and mode == AGGRESSIVE:
        reason = f"{reason}; last state older than {max_stale_s:g}s"
    return Node(
        name=name,
        gpus=(),
        labels=last.labels if last is not None else MappingProxyType({}),
        freshness=Freshness.UNKNOWN,
        observed_at=last.observed_at if last is not None else 0.0,
        reason=reason,
    )


class _BreakerLog(CircuitBreakerListener):
    """Breaker changes go to the log; their gauge is read at scrape time (node_metrics.py)."""

    def state_change(self, cb: CircuitBreaker, old_state: object, new_state: object) -> None:
        state = getattr(new_state, "name", str(new_state))
        log.info("collector.breaker", node=str(cb.name), state=state, was=getattr(old_state, "name", None))


class Collector:
    def __init__(
        self,
        settings: StateSettings,
        inventory: Inventory,
        *,
        allocations: AllocationSource | None = None,
        utilisation: PromUtilisation | None = None,
        cache: TwoLevelCache | None = None,
        ledger: Ledger | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.inventory = inventory
        self.allocation_source = allocations
        self.utilisation_source = utilisation
        self.cache = cache
        self.ledger = ledger
        self.snapshot: Snapshot = EMPTY_SNAPSHOT  # the request path reads this, nothing else
        self.on_snapshot: list[Callable[[Snapshot], None]] = []
        self.breakers: dict[str, CircuitBreaker] = {}
        self._clock = clock
        self._listener = _BreakerLog()
        self._last: dict[str, LastGood] = {}
        self._states: dict[tuple[str, str], str] = {}  # (what, name) -> last logged state
        self._sem = asyncio.Semaphore(settings.agents.concurrency)
        self._wake = asyncio.Event()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        NODE_GAUGES.watch(self)  # per-node gauges, read from this collector at scrape time

    @property
    def ready(self) -> bool:
        """True once the first snapshot is published (the lead's /readyz)."""
        return self.snapshot.version > 0

    def poke(self) -> None:
        """Refresh now rather than at the next tick (a watch saw a change)."""
        self._wake.set()

    def breaker(self, node: str) -> CircuitBreaker:
        found = self.breakers.get(node)
        if found is None:
            a = self.settings.agents
            found = self.breakers[node] = CircuitBreaker(
                fail_max=a.fail_max,
                reset_timeout=a.reset_timeout_s,
                exclude=[asyncio.CancelledError],  # stopping the collector is no agent failure
                listeners=[self._listener],
                name=node,
            )
        return found

    # -- one refresh -----------------------------------------------------------------------------

    async def refresh(self) -> Snapshot:
        sources = dict(self.inventory.sources())
        util_task = asyncio.create_task(self._utilisation())
        cached = await self._cached(list(sources))
        answers = await asyncio.gather(
            *(self._answer(cached[name]) if name in cached else self._read(name, src) for name, src in sources.items())
        )
        if self.cache is not None:  # publish what this replica read, for the others: one round trip
            fresh = {f"status:{n}": s for n, (s, _) in zip(sources, answers, strict=True) if s and n not in cached}
            await self.cache.set_many(fresh)
        utilisation, utilisation_known = await util_task
        allocations = self._allocations()
        now = self._clock()
        nodes = []
        for i, (name, (status, reason)) in enumerate(zip(sources, answers, strict=True)):
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                # Thousands of nodes are a long stretch of CPU: let admissions in between.
                await asyncio.sleep(0)
            if status is not None:
                self._last[name] = LastGood(status, now)
            last = self._last.get(name)
            known = (
                None
                if last is None
                else node_from_status(
                    last.status,
                    allocations=allocations,
                    utilisation=utilisation,
                    labels=self.inventory.labels(name),
                    name=name,
                )
            )
            if status is not None and known is not None:
                node = known
            else:
                s = self.settings
                node = degrade(
                    name, known, last.received_at if last else 0.0, reason, s.degradation, s.max_stale_s, now
                )
            self._transition("node", name, node.freshness.value, reason=node.reason)
            nodes.append(node)
        for gone in set(self._last) - set(sources):  # a node left the inventory: forget it
            del self._last[gone]
        return await self._publish(
            Snapshot(
                nodes=tuple(nodes), taken_at=now, utilisation_known=utilisation_known, version=self.snapshot.version + 1
            )
        )

    async def _cached(self, names: list[str]) -> dict[str, NodeStatus]:
        """Node answers another replica (or this one) published within the cache's TTLs."""
        if self.cache is None:
            return {}
        found = await self.cache.get_many([f"status:{n}" for n in names])
        out: dict[str, NodeStatus] = {}
        for key, value in found.items():
            if isinstance(value, NodeStatus):  # L1 keeps the object as it was read
                out[key[len("status:") :]] = value
            else:
                with contextlib.suppress(StatusError):
                    out[key[len("status:") :]] = parse_status(value)
        return out

    @staticmethod
    async def _answer(status: NodeStatus) -> tuple[NodeStatus | None, str]:
        return status, ""

    async def _read(self, name: str, source: StatusSource) -> tuple[NodeStatus | None, str]:
        """(status, "") or (None, reason). Never raises, except cancellation."""
        breaker = self.breaker(name)
        try:
            async with self._sem:
                with breaker.calling():
                    async with asyncio.timeout(self.settings.agents.timeout_s):
                        status = await source.read()
        except CircuitBreakerError as exc:
            # The call that trips the breaker raises CircuitBreakerError too; its cause is the real failure.
            reason = error_reason(exc.__context__) if exc.__context__ is not None else "breaker_open"
            if reason != "breaker_open":
                reason = f"{reason}; breaker opened"
        except Exception as exc:
            reason = error_reason(exc)
        else:
            return status, ""
        metrics.NODE_QUERY_ERRORS.labels(name, reason.split(";")[0]).inc()
        return None, reason

    async def _utilisation(self) -> tuple[Mapping[str, float] | None, bool]:
        """(per-UUID utilisation or None when no Prometheus is configured, whether it is known)."""
        if self.utilisation_source is None:
            return None, True
        try:
            found = await self.utilisation_source.query()
        except PromError as exc:
            metrics.PROMETHEUS_UP.set(0)
            self._transition("prometheus", "", "down", reason=str(exc))
            return {}, False
        metrics.PROMETHEUS_UP.set(1)
        self._transition("prometheus", "", "up")
        return found, True

    def _allocations(self) -> Mapping[str, DeviceUsage]:
        source = self.allocation_source
        if source is None:
            return NO_ALLOCATIONS
        self._transition("kube", "", "stale" if source.stale else "fresh")
        return source.allocations()

    async def _publish(self, snapshot: Snapshot) -> Snapshot:
        self.snapshot = snapshot
        self._ready.set()
        for hook in list(self.on_snapshot):
            try:
                hook(snapshot)
            except Exception:  # a broken hook must not stop the snapshots
                log.exception("collector.hook_failed", hook=getattr(hook, "__name__", repr(hook)))
        # Pods seen bound are counted by this snapshot's allocations: only now may their reservations go.
        if self.allocation_source is not None and self.ledger is not None:
            for key in self.allocation_source.take_bound_reservations():
                await self.ledger.release(key)
        return snapshot

    def _transition(self, what: str, name: str, state: str, reason: str = "") -> None:
        previous = self._states.get((what, name))
        if previous == state:
            return
        self._states[(what, name)] = state
        if previous is None and state in ("fresh", "up"):
            return  # the normal start is no transition
        metrics.DEGRADATION_TRANSITIONS.labels(what, state).inc()
        level = log.info if state in ("fresh", "up") else log.warning
        level("collector.transition", what=what, name=name or None, to=state, was=previous, reason=reason or None)

    # -- lifecycle -------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # the collector must outlive any single bad refresh
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise asyncio.CancelledError from None  # a library turned our cancel into an error
                log.exception("collector.refresh_failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.interval_s):
                    await self._wake.wait()

    async def start(self) -> None:
        """Start refreshing in the background; returns at once (`ready` turns True after the first)."""
        metrics.SNAPSHOT_AGE.set_function(
            lambda: max(0.0, self._clock() - self.snapshot.taken_at) if self.ready else 0.0
        )
        self._task = asyncio.create_task(self._run(), name="state-collector")

    async def wait_ready(self, timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            await self._ready.wait()

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None


# -- wiring ---------------------------------------------------------------------------------------


@dataclass
class StateLayer:
    """Everything the server holds of the live state, started and stopped together."""

    collector: Collector
    ledger: Ledger
    cache: TwoLevelCache | None

    async def close(self) -> None:
        await self.collector.close()
        await self.ledger.close()
        await self.collector.inventory.close()
        if self.cache is not None:
            await self.cache.close()


async def start_state(settings: StateSettings) -> StateLayer:
    """Build and start the layer the settings describe (the embedded defaults need nothing installed).

    Returns at once; `layer.collector.ready` turns True with the first snapshot.
    """
    from hami.state.inventory import build_inventory
    from hami.state.ledger import InProcessLedger, RedisLedger

    inventory, allocations = await build_inventory(settings)
    ledger: Ledger = (
        RedisLedger(settings.redis_url, settings.ledger) if settings.redis_url else InProcessLedger(settings.ledger)
    )
    # The cache only pays off when replicas share it; alone, L1 would just delay fresh answers.
    cache = TwoLevelCache(settings.cache, settings.redis_url) if settings.redis_url else None
    utilisation = PromUtilisation(settings.prometheus) if settings.prometheus.url else None
    collector = Collector(
        settings, inventory, allocations=allocations, utilisation=utilisation, cache=cache, ledger=ledger
    )
    on_change = getattr(inventory, "on_change", None)
    if isinstance(on_change, list):
        on_change.append(collector.poke)  # watch events refresh the snapshot now, not at the next tick
    await inventory.start()
    await ledger.start()
    await collector.start()
    return StateLayer(collector, ledger, cache)
