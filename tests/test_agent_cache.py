"""The read cache: at most one backend read per interval, shared by concurrent requests."""

from __future__ import annotations

import asyncio

import pytest

from hami.node.backend import BackendError
from hami.node.cache import CachedReader
from hami.node.schema import NodeStatus


class CountingBackend:
    """A backend whose reads are counted and can be held open or made to fail."""

    node_name = "n1"

    def __init__(self) -> None:
        self.reads = 0
        self.gate: asyncio.Event | None = None
        self.fail = False
        self.errors: tuple[str, ...] = ()

    async def read(self) -> NodeStatus:
        self.reads += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise BackendError("boom")
        return NodeStatus(node="n1", observed_at=float(self.reads), backend="test", gpus=(), errors=self.errors)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_reads_once_per_interval_however_often_asked() -> None:
    backend, clock = CountingBackend(), Clock()
    reader = CachedReader(backend, interval_s=1.0, clock=clock)
    for _ in range(5):
        assert (await reader.status()).observed_at == 1
    clock.now += 0.99
    await reader.status()
    assert backend.reads == 1
    clock.now += 0.01
    assert (await reader.status()).observed_at == 2
    assert reader.stats.reads == backend.reads == 2


async def test_concurrent_requests_share_one_read() -> None:
    backend = CountingBackend()
    backend.gate = asyncio.Event()
    reader = CachedReader(backend, interval_s=0.0)  # even with no caching at all
    waiters = [asyncio.ensure_future(reader.status()) for _ in range(10)]
    await asyncio.sleep(0)
    backend.gate.set()
    results = await asyncio.gather(*waiters)
    assert backend.reads == 1 and {r.observed_at for r in results} == {1.0}


async def test_a_client_giving_up_does_not_cancel_the_read_for_others() -> None:
    backend = CountingBackend()
    backend.gate = asyncio.Event()
    reader = CachedReader(backend, interval_s=10.0)
    impatient = asyncio.ensure_future(reader.status())
    patient = asyncio.ensure_future(reader.status())
    await asyncio.sleep(0)
    impatient.cancel()
    backend.gate.set()
    assert (await patient).observed_at == 1
    with pytest.raises(asyncio.CancelledError):
        await impatient


async def test_failures_are_cached_and_counted() -> None:
    backend, clock = CountingBackend(), Clock()
    backend.fail = True
    reader = CachedReader(backend, interval_s=1.0, clock=clock)
    for _ in range(3):
        with pytest.raises(BackendError, match="boom"):
            await reader.status()
    assert backend.reads == 1 and reader.stats.read_errors == 1
    backend.fail = False
    clock.now += 1
    await reader.status()
    assert reader.stats.read_errors == 1 and reader.stats.last_ok_at == 2.0


async def test_call_errors_inside_good_reads_are_counted_per_read() -> None:
    backend, clock = CountingBackend(), Clock()
    backend.errors = ("gpu0.power: Not Supported", "gpu1.power: Not Supported")
    reader = CachedReader(backend, interval_s=1.0, clock=clock)
    await reader.status()
    await reader.status()
    assert reader.stats.call_errors == 2


async def test_invalidate_forces_the_next_read() -> None:
    backend = CountingBackend()
    reader = CachedReader(backend, interval_s=3600.0)
    await reader.status()
    reader.invalidate()
    await reader.status()
    assert backend.reads == 2


async def test_a_crashing_backend_becomes_a_backend_error() -> None:
    class Crashing(CountingBackend):
        async def read(self) -> NodeStatus:
            raise RuntimeError("bug")

    with pytest.raises(BackendError, match="RuntimeError: bug"):
        await CachedReader(Crashing(), interval_s=1.0).status()
