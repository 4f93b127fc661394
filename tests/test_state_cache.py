"""The two-level cache: L1 alone, L1 in front of a real Redis L2, and Redis going away."""

from __future__ import annotations

import asyncio

import pytest

from hami.state import metrics
from hami.state.cache import TwoLevelCache, l1_ttl, redis_endpoint
from hami.state.settings import CacheSettings
from tests.servers import RedisServer

pytest_plugins = ["tests.servers"]


def test_l1_ttl_is_capped_by_the_l2_expiry() -> None:
    assert l1_ttl(2.0, l2_expires_at=100.5, now=100.0) == 0.5
    assert l1_ttl(2.0, l2_expires_at=110.0, now=100.0) == 2.0
    assert l1_ttl(2.0, l2_expires_at=99.0, now=100.0) == 0.0


def test_redis_url_maps_onto_aiocache_arguments() -> None:
    assert redis_endpoint("redis://:pw@10.0.0.1:6380/2") == {
        "endpoint": "10.0.0.1",
        "port": 6380,
        "db": 2,
        "password": "pw",
    }


async def test_l1_only_expires_by_its_ttl() -> None:
    cache = TwoLevelCache(CacheSettings(l1_ttl_s=0.2))
    await cache.set("k", {"a": 1})
    assert await cache.get("k") == {"a": 1}
    await asyncio.sleep(0.3)
    assert await cache.get("k") is None
    await cache.close()


@pytest.mark.integration
async def test_l1_entry_never_outlives_the_l2_entry_it_came_from(redis_server: RedisServer) -> None:
    writer = TwoLevelCache(CacheSettings(l1_ttl_s=5.0, l2_ttl_s=0.4), redis_server.url)
    reader = TwoLevelCache(CacheSettings(l1_ttl_s=5.0, l2_ttl_s=5.0), redis_server.url)
    hits_l2 = metrics.CACHE_HITS.labels("l2")
    hits_l1 = metrics.CACHE_HITS.labels("l1")
    try:
        await writer.set("status:n1", {"v": 1})
        before = hits_l2._value.get(), hits_l1._value.get()
        assert await reader.get("status:n1") == {"v": 1}  # from L2: another replica's answer
        assert await reader.get("status:n1") == {"v": 1}  # now from the reader's own L1
        assert (hits_l2._value.get(), hits_l1._value.get()) == (before[0] + 1, before[1] + 1)
        await asyncio.sleep(0.5)
        # The reader's L1 TTL is 5 s, but the L2 entry it copied expired: so did the copy.
        assert await reader.get("status:n1") is None
    finally:
        await writer.close()
        await reader.close()


@pytest.mark.integration
async def test_redis_down_degrades_to_l1_without_errors(redis_server: RedisServer) -> None:
    cache = TwoLevelCache(CacheSettings(l1_ttl_s=5.0, l2_ttl_s=5.0, timeout_s=0.2), redis_server.url)
    try:
        await cache.set("a", 1)
        assert cache.redis_up is True
        redis_server.kill()
        await cache.set("b", 2)  # no exception: L1 still takes it
        assert cache.redis_up is False and metrics.REDIS_UP._value.get() == 0
        assert await cache.get("b") == 2 and await cache.get("missing") is None
        await asyncio.to_thread(redis_server.start)
        await cache.set("c", 3)
        assert cache.redis_up is True
    finally:
        await cache.close()


async def test_batched_reads_and_writes_share_node_answers_between_replicas(redis_server: RedisServer) -> None:
    """One MSET publishes a refresh; another replica's MGET finds it; L1 never outlives L2."""
    from hami.node.schema import GpuStatus, NodeStatus

    status = NodeStatus("gpu-a", 1.0, "simulated", (GpuStatus("GPU-1", 0, "L4", 23034, 100, 22934),))
    writer = TwoLevelCache(CacheSettings(l1_ttl_s=5.0, l2_ttl_s=0.5), redis_server.url)
    reader = TwoLevelCache(CacheSettings(l1_ttl_s=5.0, l2_ttl_s=5.0), redis_server.url)
    try:
        await writer.set_many({"status:gpu-a": status, "status:gpu-b": status})
        assert (await writer.get_many(["status:gpu-a"]))["status:gpu-a"] is status  # L1 keeps the object
        found = await reader.get_many(["status:gpu-a", "status:gpu-b", "status:gpu-c"])
        assert set(found) == {"status:gpu-a", "status:gpu-b"}
        assert found["status:gpu-a"]["gpus"][0]["uuid"] == "GPU-1"  # from Redis: the JSON document
        await asyncio.sleep(0.7)  # past the writer's 0.5 s L2 TTL: the reader's L1 copy went with it
        assert await reader.get_many(["status:gpu-a"]) == {}
    finally:
        await writer.close()
        await reader.close()
