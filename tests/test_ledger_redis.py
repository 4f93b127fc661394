"""The Redis ledger against a real redis-server: atomicity across OS processes, fallback, recovery."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from hami.state.ledger import RedisLedger
from hami.state.model import ReservationItem
from hami.state.settings import LedgerSettings
from tests.servers import REPO, RedisServer

pytest_plugins = ["tests.servers"]
pytestmark = pytest.mark.integration

SETTINGS = LedgerSettings(timeout_s=0.2, refresh_s=0.05, retry_s=0.1)


def item(uuid: str, mem: int, cap: int) -> ReservationItem:
    return ReservationItem(node="n1", uuid=uuid, memory_mib=mem, cores=0, capacity_mib=cap)


# Each worker process reserves `count` 1 MiB slices of one device at once (all coroutines in flight).
WORKER = """
import asyncio, json, sys
from hami.state.ledger import RedisLedger
from hami.state.model import ReservationItem
from hami.state.settings import LedgerSettings

async def main(url, tag, count, capacity):
    ledger = RedisLedger(url, LedgerSettings(timeout_s=5.0))
    item = ReservationItem(node="n1", uuid="GPU-shared", memory_mib=1, cores=0, capacity_mib=capacity)
    results = await asyncio.gather(*(ledger.reserve(f"ns/{tag}-{i}", [item], 60) for i in range(count)))
    print(json.dumps({"ok": sum(r.ok for r in results), "backends": sorted({r.backend for r in results})}))
    await ledger.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
"""


def test_two_processes_sharing_redis_never_promise_the_same_memory_twice(redis_server: RedisServer) -> None:
    argv = [sys.executable, "-c", WORKER, redis_server.url]
    procs = [subprocess.Popen([*argv, tag, "200", "200"], cwd=REPO, stdout=subprocess.PIPE, text=True) for tag in "ab"]
    outs = [json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in procs]
    assert all(o["backends"] == ["redis"] for o in outs), outs  # no fallback: the check really ran in Redis
    assert sum(o["ok"] for o in outs) == 200

    async def reserved_in_redis() -> int:
        client = aioredis.Redis.from_url(redis_server.url)
        values = await client.hvals(f"{SETTINGS.prefix}:dev:GPU-shared")
        await client.aclose()
        return sum(int(v.split(b"|")[0]) for v in values)

    assert asyncio.run(reserved_in_redis()) == 200


async def test_refusal_names_the_device_and_other_replicas_see_the_overlay(redis_server: RedisServer) -> None:
    a, b = RedisLedger(redis_server.url, SETTINGS), RedisLedger(redis_server.url, SETTINGS)
    await a.start()
    await b.start()
    try:
        assert (await a.reserve("ns/p1", [item("GPU-1", 3000, 4000)], 30)).ok
        refused = await b.reserve("ns/p2", [item("GPU-2", 10, 4000), item("GPU-1", 2000, 4000)], 30)
        assert not refused.ok and refused.refused_uuid == "GPU-1" and refused.backend == "redis"
        assert "GPU-2" not in a.overlay() or a.overlay()["GPU-2"].memory_mib == 0  # all or nothing
        assert b.overlay()["GPU-1"].memory_mib == 3000  # the refusal itself refreshed b's view for the retry
        # b's view holds a's key (read from Redis) but not its own refused one: the runtime counts an
        # in-flight pick only while the overlay lacks it.
        assert a.holds("ns/p1") and b.holds("ns/p1") and not b.holds("ns/p2")
        await a.release("ns/p1")
        assert not a.holds("ns/p1")
        assert (await b.reserve("ns/p2", [item("GPU-1", 2000, 4000)], 30)).ok
        assert b.holds("ns/p2")
    finally:
        await a.close()
        await b.close()


async def test_reservations_expire_in_redis(redis_server: RedisServer) -> None:
    ledger = RedisLedger(redis_server.url, SETTINGS)
    try:
        assert (await ledger.reserve("ns/short", [item("GPU-1", 4000, 4000)], 0.3)).ok
        assert not (await ledger.reserve("ns/other", [item("GPU-1", 1, 4000)], 5)).ok
        await asyncio.sleep(0.4)
        assert (await ledger.reserve("ns/other", [item("GPU-1", 1, 4000)], 5)).ok
    finally:
        await ledger.close()


async def test_redis_dies_and_returns_without_a_failed_reserve(redis_server: RedisServer) -> None:
    ledger = RedisLedger(redis_server.url, SETTINGS)
    await ledger.start()
    backends: list[str] = []
    try:
        for phase in range(3):  # up, down, up again
            if phase == 1:
                redis_server.kill()
            elif phase == 2:
                await asyncio.to_thread(redis_server.start)
                for _ in range(100):  # the background task notices and replays the fallback
                    if ledger.up:
                        break
                    await asyncio.sleep(0.05)
            for i in range(20):
                result = await ledger.reserve(f"ns/p{phase}-{i}", [item("GPU-1", 10, 100_000)], 60)
                assert result.ok, result
                backends.append(result.backend)
        assert backends[0] == "redis" and "fallback" in backends and backends[-1] == "redis"
        await ledger.refresh()
        # The fallback's reservations were replayed into Redis: nothing promised meanwhile is forgotten.
        assert ledger.overlay()["GPU-1"].memory_mib == 60 * 10
    finally:
        await ledger.close()


def test_own_reservations_win_over_a_refresh_that_missed_them() -> None:
    from hami.state.ledger import Reservation, with_own

    other = Reservation("ns/other", (item("GPU-1", 100, 4000),), 10.0)
    stale = Reservation("ns/mine", (item("GPU-1", 100, 4000),), 10.0)  # Redis' older version of my key
    mine = Reservation("ns/mine", (item("GPU-2", 700, 4000),), 12.0)
    fresh = Reservation("ns/fresh", (item("GPU-3", 300, 4000),), 12.0)  # made while the read was in flight
    merged = {r.key: r for r in with_own([other, stale], {"ns/mine": mine, "ns/fresh": fresh})}
    assert merged == {"ns/other": other, "ns/mine": mine, "ns/fresh": fresh}


async def test_a_burst_of_reservations_shares_round_trips_and_survives_a_script_flush(
    redis_server: RedisServer,
) -> None:
    ledger = RedisLedger(redis_server.url, SETTINGS)
    await ledger.start()
    try:
        client = aioredis.Redis.from_url(redis_server.url)
        await client.script_flush()  # as after a Redis restart: EVALSHA answers NOSCRIPT
        await client.aclose()
        results = await asyncio.gather(*(ledger.reserve(f"ns/b{i}", [item("GPU-1", 10, 305)], 30) for i in range(40)))
        assert [r.backend for r in results] == ["redis"] * 40
        assert sum(r.ok for r in results) == 30  # 305 MiB hold 30 slices of 10: Redis checked each one
        batcher = ledger._reserve_batch
        assert batcher.calls == 40 and batcher.batches < 10, (batcher.calls, batcher.batches)
    finally:
        await ledger.close()


async def test_a_burst_of_timeouts_is_not_an_outage_but_a_second_of_them_is(redis_server: RedisServer) -> None:
    ledger = RedisLedger(redis_server.url, SETTINGS)
    await ledger.start()
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        assert (await ledger.reserve("ns/warm", [item("GPU-1", 1, 1000)], 30)).ok
        await client.execute_command("CLIENT", "PAUSE", "3000", "ALL")  # Redis stops answering writes
        burst = await asyncio.gather(*(ledger.reserve(f"ns/t{i}", [item("GPU-1", 1, 1000)], 30) for i in range(8)))
        assert [(r.ok, r.backend) for r in burst] == [(False, "redis")] * 8  # refused, retried by the caller
        assert ledger.up
        backends = []
        for i in range(12):  # 0.2 s each: past DOWN_AFTER_S the replica gives up on Redis
            backends.append((await ledger.reserve(f"ns/s{i}", [item("GPU-1", 1, 1000)], 30)).backend)
            if backends[-1] == "fallback":
                break
        assert backends[-1] == "fallback" and not ledger.up
    finally:
        await client.execute_command("CLIENT", "UNPAUSE")
        await client.aclose()
        await ledger.close()


async def test_a_pod_denied_after_timed_out_reservations_leaves_no_room_promised(redis_server: RedisServer) -> None:
    """This replica's event loop stalls while its reservations are in flight (a long GC pause, a
    sweep of thousands of nodes): each attempt times out although Redis ran its script, and the pod
    is denied. The denial must release its key, or the room stays promised to nobody for the TTL."""
    from hami import config as config_mod
    from hami.admission import decode_review
    from hami.decide import Decider
    from hami.runtime import Runtime
    from tests.webhook_fixture import gpu_container, pod, review_of

    ledger = {"timeout_s": 0.1, "retry_s": 0.1, "refresh_s": 0.1, "ttl_s": 60}
    cfg = config_mod.load(None, environ={}, overrides={"state": {"redis_url": redis_server.url, "ledger": ledger}})
    runtime = Runtime(cfg)
    await runtime.start()
    client = aioredis.Redis.from_url(redis_server.url)
    reservations = f"{SETTINGS.prefix}:reservations"
    try:
        for _ in range(100):
            if runtime.readiness()[0]:
                break
            await asyncio.sleep(0.05)
        decider = Decider(runtime)

        def admission(name: str) -> Any:
            card = gpu_container(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1024})
            return decode_review(json.dumps(review_of(pod(name, containers=[card]))).encode())

        placed = await decider.decide(admission("warm"), "mutate")
        assert placed.result == "patched" and await client.hexists(reservations, "default/warm")
        batcher = runtime.ledger._reserve_batch  # type: ignore[attr-defined]
        send = batcher._execute

        async def stalled(calls: Any) -> Any:
            time.sleep(0.15)  # noqa: ASYNC251 - the loop is stuck past the caller's timeout; the script is sent after
            return await send(calls)

        batcher._execute = stalled
        denied = await decider.decide(admission("held"), "mutate")
        batcher._execute = send
        assert not denied.verdict.allowed and denied.verdict.code == 409, denied.verdict
        assert runtime.ledger.up  # type: ignore[attr-defined]
        await asyncio.sleep(0.3)  # every stalled script has run by now
        assert not await client.hexists(reservations, "default/held")
        assert await client.hexists(reservations, "default/warm")
    finally:
        await client.aclose()
        await runtime.stop()


async def test_a_release_that_times_out_is_retried_by_the_background_task(redis_server: RedisServer) -> None:
    ledger = RedisLedger(redis_server.url, LedgerSettings(timeout_s=0.1, refresh_s=0.05, retry_s=0.05))
    await ledger.start()
    client = aioredis.Redis.from_url(redis_server.url)
    reservations = f"{SETTINGS.prefix}:reservations"
    try:
        assert (await ledger.reserve("ns/gone", [item("GPU-1", 100, 1000)], 60)).ok
        await client.execute_command("CLIENT", "PAUSE", "400", "WRITE")
        await ledger.release("ns/gone")  # times out: Redis is only slow, the replica stays on it
        assert ledger.up
        for _ in range(40):
            await asyncio.sleep(0.05)
            if not await client.hexists(reservations, "ns/gone") and "GPU-1" not in ledger.overlay():
                break
        assert not await client.hexists(reservations, "ns/gone") and ledger.up
        assert "GPU-1" not in ledger.overlay()  # a refresh meanwhile showed it again; gone for good now
    finally:
        await client.execute_command("CLIENT", "UNPAUSE")
        await client.aclose()
        await ledger.close()
