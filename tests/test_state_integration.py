"""The collector against real agent.py processes and a real Prometheus scraping them every second."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import aiohttp
import pytest

from hami.state.collector import Collector
from hami.state.inventory import build_inventory
from hami.state.model import Freshness, Snapshot
from hami.state.promql import PromUtilisation
from hami.state.settings import AgentSettings, InventorySettings, PrometheusSettings, StateSettings
from tests.servers import REPO, AgentProcess, PrometheusServer

pytest_plugins = ["tests.servers"]
pytestmark = pytest.mark.integration

SIM = REPO / "config/sim/cluster.yaml"


async def fault(agent: AgentProcess, body: dict[str, object], node: str = "") -> None:
    path = f"/nodes/{node}/faults" if node else "/faults"
    async with aiohttp.ClientSession() as session, session.post(agent.url + path, json=body) as response:
        assert response.status == 200, await response.text()


async def until(collector: Collector, check: Callable[[Snapshot], bool], timeout_s: float = 20.0) -> Snapshot:
    async with asyncio.timeout(timeout_s):
        while True:
            snap = await collector.refresh()
            if check(snap):
                return snap
            await asyncio.sleep(0.2)


async def test_utilisation_from_real_prometheus_lands_in_the_snapshot(
    start_agent: Callable[..., AgentProcess], start_prometheus: Callable[..., PrometheusServer]
) -> None:
    agents = {name: start_agent(SIM, name) for name in ("gpu-b", "gpu-d")}
    prom = start_prometheus([a.target for a in agents.values()], 1.0)
    settings = StateSettings(
        agents=AgentSettings(timeout_s=0.5, fail_max=2, reset_timeout_s=0.5),
        inventory=InventorySettings(source="static", agents={n: a.url for n, a in agents.items()}),
        prometheus=PrometheusSettings(url=prom.url),
    )
    inventory, _ = await build_inventory(settings)
    collector = Collector(settings, inventory, utilisation=PromUtilisation(settings.prometheus))
    try:
        snap = await until(collector, lambda s: all(g.utilisation is not None for n in s.nodes for g in n.gpus))
        assert snap.utilisation_known
        hot = snap.node("gpu-d")
        assert hot is not None and hot.freshness is Freshness.FRESH
        assert abs(hot.gpus[0].utilisation - 85) <= 5  # type: ignore[operator]  # the sim's 85 % with jitter

        # NVML errors on one agent: that node is excluded, the other stays fresh.
        await fault(agents["gpu-d"], {"nvml_error": True})
        snap = await collector.refresh()
        assert snap.node("gpu-d").freshness is Freshness.UNKNOWN  # type: ignore[union-attr]
        assert snap.node("gpu-d").reason.startswith("http_503")  # type: ignore[union-attr]
        assert snap.node("gpu-b").freshness is Freshness.FRESH  # type: ignore[union-attr]
        await fault(agents["gpu-d"], {"clear": True, "hang": True})
        snap = await collector.refresh()  # a hanging agent costs one timeout, and opens the breaker
        assert snap.node("gpu-d").reason.startswith("timeout")  # type: ignore[union-attr]
        assert collector.breaker("gpu-d").current_state == "open"
        await fault(agents["gpu-d"], {"clear": True})
        await until(collector, lambda s: s.node("gpu-d").freshness is Freshness.FRESH, 10)  # type: ignore[union-attr]

        prom.kill()  # Prometheus gone: utilisation unknown, not zero, and the nodes stay fresh
        snap = await collector.refresh()
        assert not snap.utilisation_known
        assert all(g.utilisation is None for n in snap.nodes for g in n.gpus)
        assert all(n.freshness is Freshness.FRESH for n in snap.nodes)
    finally:
        await inventory.close()


async def test_fleet_agent_nodes_are_discovered_and_read(start_agent: Callable[..., AgentProcess]) -> None:
    fleet = start_agent(SIM)
    settings = StateSettings(inventory=InventorySettings(source="static", fleet_url=fleet.url))
    inventory, _ = await build_inventory(settings)
    try:
        assert set(inventory.sources()) == {"gpu-a", "gpu-b", "gpu-c", "gpu-d"}
        snap = await Collector(replace(settings), inventory).refresh()
        assert all(n.freshness is Freshness.FRESH and n.gpus for n in snap.nodes)
        await fault(fleet, {"nvml_error": True}, node="gpu-c")
        snap = await Collector(settings, inventory).refresh()
        assert [n.name for n in snap.nodes if n.freshness is Freshness.UNKNOWN] == ["gpu-c"]
    finally:
        await inventory.close()
