"""Two-level cache of agent answers: in-process L1 in front of a Redis L2 shared by all replicas.

One replica's collector writes what its agents answered; the others read L2 before asking the
agents themselves, so N replicas do not multiply the load on every agent by N.

The L2 value carries its own expiry (unix seconds). L1 stores that expiry too and caps its TTL
by it, so an L1 entry never outlives the L2 entry it came from: a replica cannot keep serving
an answer the others already consider expired.

Redis is optional (no URL: L1 only) and never fatal: an error or a slow round trip counts as a
miss, flips `hami_webhook_redis_up` to 0, and the next call tries again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import orjson
import structlog
from aiocache import RedisCache, SimpleMemoryCache
from aiocache.serializers import BaseSerializer

from hami.state import metrics
from hami.state.settings import CacheSettings

log = structlog.get_logger(__name__)


# Keys per MGET/MSET: 10,000 node answers in one call were a ~20 MB reply to buffer and parse at
# once (RSS 333 MB at 10,000 nodes) and held Redis and this event loop for its whole length.
L2_CHUNK = 500


def redis_endpoint(url: str) -> dict[str, Any]:
    """aiocache's RedisCache keyword arguments from a redis:// URL."""
    parts = urlsplit(url)
    db = parts.path.strip("/")
    return {
        "endpoint": parts.hostname or "127.0.0.1",
        "port": parts.port or 6379,
        "db": int(db) if db else 0,
        "password": parts.password,
    }


def l1_ttl(l1_ttl_s: float, l2_expires_at: float, now: float) -> float:
    """The L1 TTL of a value whose L2 copy expires at `l2_expires_at`: never past that instant."""
    return max(0.0, min(l1_ttl_s, l2_expires_at - now))


class OrjsonSerializer(BaseSerializer):
    """aiocache's JSON serializer uses the json module, which neither knows dataclasses nor is fast:
    node answers are NodeStatus dataclasses, which orjson encodes as they are."""

    DEFAULT_ENCODING = None  # bytes in, bytes out

    def dumps(self, value: Any) -> bytes:
        return orjson.dumps(value)

    def loads(self, value: bytes | None) -> Any:
        return None if value is None else orjson.loads(value)


class TwoLevelCache:
    def __init__(self, settings: CacheSettings, redis_url: str = "", clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._clock = clock
        self._l1 = SimpleMemoryCache(namespace="l1")
        self._l2: RedisCache | None = None
        if redis_url:
            self._l2 = RedisCache(
                namespace=settings.namespace,
                timeout=settings.timeout_s,
                serializer=OrjsonSerializer(),
                **redis_endpoint(redis_url),
            )
        self.redis_up: bool | None = None  # None until the first L2 round trip

    async def get(self, key: str) -> Any | None:
        now = self._clock()
        entry = await self._l1.get(key)
        # The expiry check guards the TTL: SimpleMemoryCache expires entries by loop timers.
        if entry is not None and entry[1] > now:
            metrics.CACHE_HITS.labels("l1").inc()
            return entry[0]
        metrics.CACHE_MISSES.labels("l1").inc()
        if self._l2 is None:
            return None
        doc = await self._l2_call(self._l2.get(key))
        if not isinstance(doc, dict) or float(doc.get("exp", 0)) <= now:
            metrics.CACHE_MISSES.labels("l2").inc()
            return None
        metrics.CACHE_HITS.labels("l2").inc()
        expires_at = float(doc["exp"])
        ttl = l1_ttl(self.settings.l1_ttl_s, expires_at, now)
        if ttl > 0:
            await self._l1.set(key, (doc["v"], min(expires_at, now + ttl)), ttl=ttl)
        return doc["v"]

    async def set(self, key: str, value: Any) -> None:
        """Store a JSON-able value in both levels (L2 first, so L1's expiry can follow it)."""
        now = self._clock()
        expires_at = now + self.settings.l2_ttl_s
        if self._l2 is not None:
            await self._l2_call(self._l2.set(key, {"exp": expires_at, "v": value}, ttl=float(self.settings.l2_ttl_s)))
        ttl = l1_ttl(self.settings.l1_ttl_s, expires_at, now)
        await self._l1.set(key, (value, min(expires_at, now + ttl)), ttl=ttl)

    async def get_many(self, keys: list[str]) -> dict[str, Any]:
        """The keys found in L1, then in L2 (one MGET for all the rest), as get() would find them.

        A refresh asks for every node at once: per-key round trips cost thousands of Redis calls
        per refresh on a large cluster, this costs one."""
        now = self._clock()
        found: dict[str, Any] = {}
        entries = await self._l1.multi_get(keys) if keys else []
        missing = []
        for key, entry in zip(keys, entries, strict=True):
            if entry is not None and entry[1] > now:
                found[key] = entry[0]
            else:
                missing.append(key)
        metrics.CACHE_HITS.labels("l1").inc(len(found))
        metrics.CACHE_MISSES.labels("l1").inc(len(missing))
        if self._l2 is None or not missing:
            return found
        docs: list[Any] = []
        for start in range(0, len(missing), L2_CHUNK):
            part = missing[start : start + L2_CHUNK]
            docs += await self._l2_call(self._l2.multi_get(part)) or [None] * len(part)
        back: list[tuple[str, Any]] = []
        ttl = self.settings.l1_ttl_s
        for key, doc in zip(missing, docs, strict=True):
            if not isinstance(doc, dict) or float(doc.get("exp", 0)) <= now:
                metrics.CACHE_MISSES.labels("l2").inc()
                continue
            metrics.CACHE_HITS.labels("l2").inc()
            expires_at = float(doc["exp"])
            ttl = min(ttl, l1_ttl(self.settings.l1_ttl_s, expires_at, now))
            found[key] = doc["v"]
            back.append((key, (doc["v"], min(expires_at, now + l1_ttl(self.settings.l1_ttl_s, expires_at, now)))))
        if back and ttl > 0:
            await self._l1.multi_set(back, ttl=ttl)  # the shortest: no L1 entry outlives its L2 entry
        return found

    async def set_many(self, values: dict[str, Any]) -> None:
        """Store many values in both levels: one MSET to Redis (L2 first, so L1's expiry can follow it)."""
        if not values:
            return
        now = self._clock()
        expires_at = now + self.settings.l2_ttl_s
        if self._l2 is not None:
            docs = [(key, {"exp": expires_at, "v": value}) for key, value in values.items()]
            l2_ttl = float(self.settings.l2_ttl_s)
            for start in range(0, len(docs), L2_CHUNK):
                await self._l2_call(self._l2.multi_set(docs[start : start + L2_CHUNK], ttl=l2_ttl))
        ttl = l1_ttl(self.settings.l1_ttl_s, expires_at, now)
        await self._l1.multi_set([(k, (v, min(expires_at, now + ttl))) for k, v in values.items()], ttl=ttl)

    async def _l2_call(self, call: Any) -> Any:
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                result = await call
        except Exception as exc:  # any Redis failure degrades to L1, never to an error
            self._mark(False, exc)
            return None
        self._mark(True)
        return result

    def _mark(self, up: bool, exc: BaseException | None = None) -> None:
        if up != self.redis_up:
            if self.redis_up is not None or not up:
                log.warning("cache.redis", up=up, error=repr(exc) if exc else None)
                metrics.DEGRADATION_TRANSITIONS.labels("redis_cache", "up" if up else "down").inc()
            self.redis_up = up
            metrics.REDIS_UP.set(1 if up else 0)

    async def close(self) -> None:
        await self._l1.close()
        if self._l2 is not None:
            await self._l2.close()
