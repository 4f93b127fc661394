"""Which nodes exist and where their state is read: static config, the embedded simulation, or Kubernetes.

An inventory answers `sources()` (node name -> status source) at the moment of a refresh; the
Kubernetes inventory changes its answer as its watches see nodes and agent pods come and go, and
also knows what bound pods were given (`allocations()`), which static inventories cannot know.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

import aiohttp

from hami.state.agents import HttpAgent, StatusSource, fleet_status_url, status_url
from hami.state.model import DeviceUsage, NamespaceUsage
from hami.state.settings import StateSettings

NO_LABELS: Mapping[str, str] = MappingProxyType({})


class Inventory(Protocol):
    def sources(self) -> Mapping[str, StatusSource]: ...

    def labels(self, node: str) -> Mapping[str, str]: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class AllocationSource(Protocol):
    """What bound pods hold per device (from their annotations), and reservations to release."""

    stale: bool  # True while the watch that feeds it is broken

    def allocations(self) -> Mapping[str, DeviceUsage]: ...

    def namespace_usage(self, namespace: str) -> NamespaceUsage: ...

    def take_bound_reservations(self) -> list[str]: ...


class StaticInventory:
    """A fixed set of status sources (HTTP agents, or backends read in-process)."""

    def __init__(self, sources: Mapping[str, StatusSource], session: aiohttp.ClientSession | None = None) -> None:
        self._sources = MappingProxyType(dict(sources))
        self._session = session

    def sources(self) -> Mapping[str, StatusSource]:
        return self._sources

    def labels(self, node: str) -> Mapping[str, str]:
        return NO_LABELS

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def http_session(settings: StateSettings) -> aiohttp.ClientSession:
    # The collector bounds each read with its own timeout; this one only stops leaks.
    timeout = aiohttp.ClientTimeout(total=max(2.0, settings.agents.timeout_s * 4))
    return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=settings.agents.concurrency))


def simulated_inventory(path: str, seed: int = 0, fleet_size: int = 0) -> StaticInventory:
    """The embedded default: the simulated fleet read in-process, no agent processes needed.

    `fleet_size` > 0 generates that many nodes from the file's nodes (lazily, as agent.py's fleet
    mode does), so benchmarks can run a 10,000-node cluster in one process."""
    from hami.node.simulated import generate_fleet, load_fleet  # the node package is only needed here

    # A relative path is the working directory's, else the checkout's (`serve` run from elsewhere).
    found = Path(path)
    if not found.is_absolute() and not found.exists():
        found = Path(__file__).resolve().parents[2] / path
    if fleet_size > 0:
        return StaticInventory(generate_fleet(found, fleet_size, seed))
    return StaticInventory(load_fleet(found, seed))


def static_inventory(settings: StateSettings) -> StaticInventory:
    inv = settings.inventory
    session = http_session(settings)
    sources: dict[str, StatusSource] = {
        name: HttpAgent(name, status_url(url), session) for name, url in inv.agents.items()
    }
    for name in inv.fleet_nodes:
        sources[name] = HttpAgent(name, fleet_status_url(inv.fleet_url, name), session)
    return StaticInventory(sources, session)


async def fleet_node_names(fleet_url: str, session: aiohttp.ClientSession) -> tuple[str, ...]:
    """The nodes a fleet agent serves (`GET /nodes`), for a static inventory that lists none."""
    async with session.get(f"{fleet_url.rstrip('/')}/nodes") as response:
        response.raise_for_status()
        return tuple(str(n) for n in (await response.json())["nodes"])


InventoryFactory = Callable[[StateSettings], Inventory]


async def build_inventory(settings: StateSettings) -> tuple[Inventory, AllocationSource | None]:
    """The inventory the settings name, and the allocation source when it has one (Kubernetes)."""
    source = settings.inventory.source
    if source == "simulated":
        inv = settings.inventory
        return simulated_inventory(inv.simulated_file, inv.simulated_seed, inv.simulated_fleet_size), None
    if source == "static":
        inv = settings.inventory
        if inv.fleet_url and not inv.fleet_nodes:
            async with aiohttp.ClientSession() as session:
                names = await fleet_node_names(inv.fleet_url, session)
            settings = replace(settings, inventory=replace(inv, fleet_nodes=names))
        return static_inventory(settings), None
    if source == "kubernetes":
        from hami.state.kube import KubeInventory

        kube = KubeInventory(settings)
        return kube, kube
    raise ValueError(f"state.inventory.source must be simulated, static or kubernetes, got {source!r}")
