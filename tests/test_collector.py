"""The collector with in-process status sources: breakers, degradation modes, the request path's view."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import REGISTRY, generate_latest

from hami.node.backend import BackendError
from hami.node.schema import GpuStatus, NodeStatus
from hami.state import metrics
from hami.state.collector import Collector, degrade, start_state
from hami.state.inventory import StaticInventory, simulated_inventory
from hami.state.model import DeviceUsage, Freshness, Snapshot
from hami.state.node_metrics import BREAKER_CLOSED, BREAKER_OPEN, NODE_GAUGES, NodeGauges
from hami.state.promql import PromError
from hami.state.settings import AGGRESSIVE, CONSERVATIVE, AgentSettings, StateSettings

REPO = Path(__file__).resolve().parent.parent


def status(node: str, used: int = 1000, total: int = 16000, util: float = 10.0) -> NodeStatus:
    gpu = GpuStatus(
        uuid=f"GPU-{node}-0",
        index=0,
        model="Tesla T4",
        memory_total_mib=total,
        memory_used_mib=used,
        memory_free_mib=total - used,
        utilisation_gpu=util,
    )
    return NodeStatus(node=node, observed_at=1.0, backend="test", gpus=(gpu,))


class Source:
    """A node whose answer the test switches: ok, failing, or hanging."""

    def __init__(self, name: str, used: int = 1000) -> None:
        self.node_name = name
        self.used = used
        self.mode = "ok"
        self.calls = 0
        self.entered = asyncio.Event()
        self.seen_breaker_state: list[str] = []
        self.breaker_of: Collector | None = None

    async def read(self) -> NodeStatus:
        self.calls += 1
        if self.breaker_of is not None:
            self.seen_breaker_state.append(self.breaker_of.breaker(self.node_name).current_state)
        self.entered.set()
        if self.mode == "fail":
            raise BackendError("injected")
        if self.mode == "hang":
            await asyncio.Event().wait()
        return status(self.node_name, used=self.used)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def settings(**kw: object) -> StateSettings:
    agents = AgentSettings(timeout_s=0.2, fail_max=3, reset_timeout_s=0.3)
    return StateSettings(**{"agents": agents, "interval_s": 0.05, **kw})  # type: ignore[arg-type]


def collector(*sources: Source, **kw: object) -> Collector:
    clock = kw.pop("clock", None)
    c = Collector(
        settings(**kw), StaticInventory({s.node_name: s for s in sources}), **({"clock": clock} if clock else {})
    )
    for s in sources:
        s.breaker_of = c
    return c


async def test_opening_incident_card_free_by_promises_is_full_by_nvml() -> None:
    """gpu-b card 1 of the example inventory: nothing promised, 90% used by a process no pod owns."""
    c = Collector(StateSettings(), simulated_inventory(str(REPO / "config/sim/cluster.yaml")))
    snap = await c.refresh()
    node = snap.node("gpu-b")
    assert node is not None and node.freshness is Freshness.FRESH
    card = next(g for g in node.gpus if g.index == 1)
    assert card.memory_promised_mib == 0
    assert card.effective_free_mib == card.memory_total_mib - card.memory_used_mib
    assert card.effective_free_mib <= card.memory_total_mib // 10


async def test_breaker_opens_after_fail_max_and_half_opens_after_reset_timeout() -> None:
    bad = Source("bad")
    c = collector(bad, Source("good"))
    bad.mode = "fail"
    for _ in range(3):
        await c.refresh()
    assert c.breaker("bad").current_state == "open" and bad.calls == 3
    assert gauges_of(c)["hami_webhook_node_breaker_state"] == {"bad": BREAKER_OPEN, "good": BREAKER_CLOSED}
    snap = await c.refresh()  # open: the agent is not even asked
    assert bad.calls == 3
    bad_node = snap.node("bad")
    assert bad_node is not None and "breaker_open" in bad_node.reason
    await asyncio.sleep(0.35)
    bad.mode = "ok"
    snap = await c.refresh()  # one trial call, in the half-open state, that succeeds
    assert bad.calls == 4 and bad.seen_breaker_state[-1] == "half-open"
    assert c.breaker("bad").current_state == "closed"
    assert snap.node("bad").freshness is Freshness.FRESH  # type: ignore[union-attr]


async def test_hanging_agent_does_not_hold_back_snapshots() -> None:
    hung, good = Source("hung"), Source("good")
    hung.mode = "hang"
    c = collector(hung, good)
    await c.start()
    try:
        await hung.entered.wait()
        # The hang never ends, yet snapshots keep coming and the request path sees the others.
        async with asyncio.timeout(10):
            while c.snapshot.version < 3:  # noqa: ASYNC110 - polls the plain attribute the request path reads
                await asyncio.sleep(0.01)
        snap: Snapshot = c.snapshot
        assert snap.node("good").freshness is Freshness.FRESH  # type: ignore[union-attr]
        assert snap.node("hung").freshness is Freshness.UNKNOWN  # type: ignore[union-attr]
        assert snap.node("hung").reason.startswith("timeout")  # type: ignore[union-attr]
    finally:
        await c.close()


async def test_conservative_mode_excludes_a_node_that_stopped_answering() -> None:
    src = Source("n1")
    c = collector(src, degradation=CONSERVATIVE)
    assert (await c.refresh()).node("n1").gpus  # type: ignore[union-attr]
    src.mode = "fail"
    node = (await c.refresh()).node("n1")
    assert node is not None and node.freshness is Freshness.UNKNOWN and node.gpus == ()
    assert node.reason == "backend"


async def test_aggressive_mode_keeps_last_state_stale_then_unknown_after_max_stale() -> None:
    clock = Clock()
    src = Source("n1", used=5000)
    c = collector(src, degradation=AGGRESSIVE, max_stale_s=30.0, clock=clock)
    await c.refresh()
    src.mode = "fail"
    clock.now += 10
    node = (await c.refresh()).node("n1")
    assert node is not None and node.freshness is Freshness.STALE and node.gpus[0].memory_used_mib == 5000
    clock.now += 25  # 35 s since the last answer
    node = (await c.refresh()).node("n1")
    assert node is not None and node.freshness is Freshness.UNKNOWN and node.gpus == ()


def test_degrade_without_any_known_state_is_unknown_in_both_modes() -> None:
    for mode in (CONSERVATIVE, AGGRESSIVE):
        node = degrade("n", None, 0.0, "connect", mode, 30.0, 100.0)
        assert node.freshness is Freshness.UNKNOWN and node.reason == "connect"


async def test_transitions_are_counted_once_not_every_refresh() -> None:
    src = Source("flappy-once")
    c = collector(src)
    await c.refresh()
    counter = metrics.DEGRADATION_TRANSITIONS.labels("node", "unknown")
    before = counter._value.get()
    src.mode = "fail"
    for _ in range(4):
        await c.refresh()
    assert counter._value.get() == before + 1


class DownProm:
    async def query(self) -> dict[str, float]:
        raise PromError("connection refused")


class UpProm:
    async def query(self) -> dict[str, float]:
        return {"GPU-n1-0": 42.0}


async def test_prometheus_decides_utilisation_and_its_absence_is_unknown_not_zero() -> None:
    src = Source("n1")
    c = Collector(settings(), StaticInventory({"n1": src}), utilisation=UpProm())  # type: ignore[arg-type]
    snap = await c.refresh()
    assert snap.utilisation_known and snap.node("n1").gpus[0].utilisation == 42.0  # type: ignore[union-attr]
    c.utilisation_source = DownProm()  # type: ignore[assignment]
    snap = await c.refresh()
    assert not snap.utilisation_known and snap.node("n1").gpus[0].utilisation is None  # type: ignore[union-attr]


class Allocations:
    stale = False

    def __init__(self) -> None:
        self.bound: list[str] = ["ns/pod-a"]

    def allocations(self) -> dict[str, DeviceUsage]:
        return {"GPU-n1-0": DeviceUsage(memory_mib=9000, cores=30, pods=2)}

    def take_bound_reservations(self) -> list[str]:
        out, self.bound = self.bound, []
        return out


class RecordingLedger:
    def __init__(self) -> None:
        self.released: list[str] = []

    async def release(self, key: str) -> None:
        self.released.append(key)


async def test_allocations_fill_promised_memory_and_bound_reservations_are_released_after_publish() -> None:
    ledger = RecordingLedger()
    c = Collector(
        settings(),
        StaticInventory({"n1": Source("n1", used=2000)}),
        allocations=Allocations(),
        ledger=ledger,  # type: ignore[arg-type]
    )
    seen: list[int] = []
    c.on_snapshot.append(lambda s: seen.append(s.version))
    c.on_snapshot.insert(0, lambda s: 1 / 0)  # a broken hook does not stop the others
    snap = await c.refresh()
    gpu = snap.node("n1").gpus[0]  # type: ignore[union-attr]
    assert gpu.memory_promised_mib == 9000 and gpu.pods == 2 and gpu.effective_free_mib == 16000 - 9000
    assert ledger.released == ["ns/pod-a"] and seen == [1] and c.ready


async def test_embedded_defaults_serve_the_simulated_fleet_in_process() -> None:
    layer = await start_state(StateSettings())  # no agents, Redis, Prometheus or Kubernetes needed
    try:
        await layer.collector.wait_ready()
        snap = layer.collector.snapshot
        assert {n.name for n in snap.nodes} == {"gpu-a", "gpu-b", "gpu-c", "gpu-d"}
        assert all(n.freshness is Freshness.FRESH for n in snap.nodes)
        assert (await layer.ledger.reserve("ns/p", [], 1)).ok
    finally:
        await layer.close()


def gauges_of(c: Collector) -> dict[str, dict[str, float]]:
    """The per-node gauges a scrape would show for this collector alone."""
    gauges = NodeGauges()
    gauges.watch(c)
    return {family.name: {s.labels["node"]: s.value for s in family.samples} for family in gauges.collect()}


async def test_per_node_gauges_are_read_from_the_snapshot_at_scrape_time() -> None:
    c = collector(Source("a"), Source("b"))
    assert c in NODE_GAUGES._sources and NODE_GAUGES in REGISTRY._collector_to_names  # served on /metrics
    snap = await c.refresh()
    gauges = gauges_of(c)
    for node in snap.nodes:
        assert gauges["hami_webhook_gpu_memory_used_mib"][node.name] == sum(g.memory_used_mib for g in node.gpus)
        assert gauges["hami_webhook_gpu_memory_promised_mib"][node.name] == 0
    assert gauges["hami_webhook_node_breaker_state"] == {"a": BREAKER_CLOSED, "b": BREAKER_CLOSED}
    text = generate_latest().decode()
    assert 'hami_webhook_gpu_memory_used_mib{node="a"}' in text
