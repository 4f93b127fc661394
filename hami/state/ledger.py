"""The reservation ledger: memory promised by admissions whose pods are not bound yet.

Between two snapshots a burst of admissions would all see the same free memory; the ledger makes
each decision reserve its devices, atomically checking that the sum of live reservations plus this
one stays within what the deciding replica saw as promisable (`ReservationItem.capacity_mib`,
i.e. total - max(promised, used) without reservations). A refused reserve names the device, and
the caller places again with the refreshed `overlay()`.

`InProcessLedger` serves one replica. `RedisLedger` shares reservations between replicas through
one Lua script (check and write all items or none, with a TTL, on Redis' own clock); while Redis
is down or slower than `timeout_s` it falls back to an in-process ledger that also counts the
last known reservations of the other replicas, and replays its own when Redis returns.

Keys carry the namespace (`ns/pod-name-or-admission-uid`) so quotas can sum pending memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

import orjson
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from hami.state import metrics
from hami.state.model import DeviceUsage, NamespaceUsage, ReservationItem, quota_cores
from hami.state.redis_batch import ScriptBatcher
from hami.state.settings import LedgerSettings
from hami.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

EMPTY_OVERLAY: Mapping[str, DeviceUsage] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ReserveResult:
    ok: bool
    refused_uuid: str = ""  # the device that would overflow (empty when ok)
    reason: str = ""
    backend: str = "memory"  # memory | redis | fallback
    # A refusal whose script may still have run (a timeout): if the caller does not reserve the key
    # again, it must release it, or the room stays promised to a pod that was denied.
    maybe_written: bool = False


RESERVED = ReserveResult(True)  # frozen: one shared instance for every successful in-process reserve


@dataclass(frozen=True, slots=True)
class Reservation:
    key: str
    items: tuple[ReservationItem, ...]
    expires_at: float  # local clock, seconds


class Ledger(Protocol):
    async def reserve(
        self, key: str, items: Sequence[ReservationItem], ttl_s: float | None = None
    ) -> ReserveResult: ...

    async def release(self, key: str) -> None: ...

    def overlay(self) -> Mapping[str, DeviceUsage]: ...

    def holds(self, key: str) -> bool:
        """Whether `overlay()` counts this key's reservation already."""
        ...

    def namespace_usage(self, namespace: str) -> NamespaceUsage: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


# ---- pure core -------------------------------------------------------------------------------


class _Need(NamedTuple):
    memory_mib: int
    cores: int
    capacity_mib: int
    capacity_cores: int


def needs(items: Iterable[ReservationItem]) -> dict[str, _Need]:
    """Per device: what a reservation asks (containers sharing a device add up) and the tightest capacity."""
    out: dict[str, _Need] = {}
    for it in items:
        prev = out.get(it.uuid)
        if prev is None:
            out[it.uuid] = _Need(it.memory_mib, it.cores, it.capacity_mib, it.capacity_cores)
        else:
            out[it.uuid] = _Need(
                prev.memory_mib + it.memory_mib,
                prev.cores + it.cores,
                min(prev.capacity_mib, it.capacity_mib),
                min(prev.capacity_cores, it.capacity_cores),
            )
    return out


def merge_overlays(*overlays: Mapping[str, DeviceUsage]) -> dict[str, DeviceUsage]:
    out: dict[str, DeviceUsage] = {}
    for ov in overlays:
        for uuid, u in ov.items():
            p = out.get(uuid)
            out[uuid] = (
                u
                if p is None
                else DeviceUsage(
                    p.memory_mib + u.memory_mib, p.cores + u.cores, p.pods + u.pods, p.workload_types | u.workload_types
                )
            )
    return out


_NOTHING_USED = DeviceUsage()


def first_overflow(
    items: Sequence[ReservationItem], used: Mapping[str, DeviceUsage], per_device: Mapping[str, _Need] | None = None
) -> tuple[str, str] | None:
    """(uuid, why) of the first device the items would overflow given `used`, else None.

    Cores only count for items that ask for cores: 0 means no SM limit (HAMi's convention).
    `per_device` is `needs(items)` when the caller has it already.
    """
    for uuid, need in (needs(items) if per_device is None else per_device).items():
        u = used.get(uuid, _NOTHING_USED)
        if u.memory_mib + need.memory_mib > need.capacity_mib:
            return uuid, f"memory {u.memory_mib}+{need.memory_mib} MiB > {need.capacity_mib} MiB"
        if need.cores > 0 and u.cores + need.cores > need.capacity_cores:
            return uuid, f"cores {u.cores}+{need.cores}% > {need.capacity_cores}%"
    return None


def namespace_of(key: str) -> str:
    return key.split("/", 1)[0] if "/" in key else ""


class _Shares(NamedTuple):
    """What one reservation adds to the sums, derived once when it is added (and taken back as is)."""

    per_device: dict[str, _Need]
    typed: tuple[tuple[str, str], ...]  # (uuid, workload type) of the items that name one
    namespace: str
    quota: tuple[int, int, int]  # memory MiB, cores, devices counted against the namespace's quota


def _shares(r: Reservation, per_device: dict[str, _Need] | None = None) -> _Shares:
    memory = cores = 0
    for it in r.items:
        memory += it.memory_mib
        cores += quota_cores(it.cores)
    return _Shares(
        needs(r.items) if per_device is None else per_device,
        tuple((it.uuid, it.workload_type) for it in r.items if it.workload_type),
        namespace_of(r.key),
        (memory, cores, len(r.items)),
    )


class Aggregate:
    """Live reservations and their sums per device and per namespace, kept incrementally.

    A burst of admissions must not pay for every pending reservation: adding or removing one
    touches only its own devices (their usage records included), expiry pops a heap, and the
    overlay mapping is copied from those records only after a change. Each reservation's shares
    are derived once, when it is added: every admission's reservation is added once and expires
    (or is released) once.
    """

    def __init__(self, reservations: Iterable[Reservation] = ()) -> None:
        self.reservations: dict[str, Reservation] = {}
        self._shares: dict[str, _Shares] = {}
        self._types: dict[str, Counter[str]] = {}
        # Each device's sums, a record replaced for the devices a change touches: view() copies it.
        self._usage: dict[str, DeviceUsage] = {}
        self._ns: dict[str, list[int]] = {}  # namespace -> [memory MiB, cores, devices]
        self._heap: list[tuple[float, str]] = []
        self._view: Mapping[str, DeviceUsage] | None = EMPTY_OVERLAY
        for r in reservations:
            self.add(r)

    def add(self, r: Reservation, per_device: dict[str, _Need] | None = None) -> None:
        """`per_device` is `needs(r.items)` when the caller has it already."""
        self.remove(r.key)
        shares = _shares(r, per_device)
        self.reservations[r.key] = r
        self._shares[r.key] = shares
        self._apply(shares, +1)
        heapq.heappush(self._heap, (r.expires_at, r.key))

    def remove(self, key: str) -> Reservation | None:
        r = self.reservations.pop(key, None)
        if r is not None:
            self._apply(self._shares.pop(key), -1)
        return r

    def _apply(self, shares: _Shares, sign: int) -> None:
        types_of = self._types
        for uuid, workload_type in shares.typed:
            types = types_of.setdefault(uuid, Counter())
            types[workload_type] += sign
            if types[workload_type] <= 0:
                del types[workload_type]
        usage = self._usage
        for uuid, need in shares.per_device.items():  # the typed devices are among these
            old = usage.get(uuid, _NOTHING_USED)
            pods = old.pods + sign
            if pods == 0:
                del usage[uuid]
            else:
                usage[uuid] = DeviceUsage(
                    old.memory_mib + sign * need.memory_mib,
                    old.cores + sign * need.cores,
                    pods,
                    frozenset(types_of.get(uuid, ())),
                )
        total = self._ns.get(shares.namespace)
        if total is None:
            total = self._ns[shares.namespace] = [0, 0, 0]
        memory, core_pct, devices = shares.quota
        total[0] += sign * memory
        total[1] += sign * core_pct
        total[2] += sign * devices
        self._view = None

    def purge(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            _, key = heapq.heappop(self._heap)
            r = self.reservations.get(key)
            if r is not None and r.expires_at <= now:  # not a key re-reserved since with a later expiry
                self.remove(key)

    def view(self, now: float) -> Mapping[str, DeviceUsage]:
        self.purge(now)
        if self._view is None:
            # A copy: whoever holds a view keeps what it was (the index compares the next one with
            # it). Copying reuses the devices' usage records, so an unchanged device is the same
            # object in both: rebuilding them all measured ~12 ms per sync at 3,000 reservations.
            self._view = MappingProxyType(dict(self._usage))
        return self._view

    def used_on(self, uuids: Iterable[str], without_key: str, now: float) -> dict[str, DeviceUsage]:
        """What is reserved on these devices only, as if `without_key` were not reserved.

        The reserve path's view: O(devices of one pod). Building the whole overlay instead costs
        O(every reserved device) after each change, so every reservation would pay for all others.
        """
        self.purge(now)
        own_shares = self._shares.get(without_key)
        mine = own_shares.per_device if own_shares is not None else {}
        out: dict[str, DeviceUsage] = {}
        for uuid in uuids:
            used = self._usage.get(uuid)
            if used is None:
                continue
            own = mine.get(uuid)
            if own is not None:
                used = DeviceUsage(
                    used.memory_mib - own.memory_mib, used.cores - own.cores, used.pods - 1, used.workload_types
                )
            out[uuid] = used
        return out

    def namespace_usage(self, namespace: str, now: float) -> NamespaceUsage:
        self.purge(now)
        total = self._ns.get(namespace)
        return NamespaceUsage(*total) if total is not None else NamespaceUsage()


# ---- in-process ledger -----------------------------------------------------------------------


class InProcessLedger:
    """One replica's reservations in memory. Every method runs without awaiting, hence atomically."""

    def __init__(self, settings: LedgerSettings | None = None, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings or LedgerSettings()
        self._clock = clock
        self._agg = Aggregate()

    def reserve_now(
        self,
        key: str,
        items: Sequence[ReservationItem],
        ttl_s: float | None = None,
        base: Mapping[str, DeviceUsage] = EMPTY_OVERLAY,
    ) -> ReserveResult:
        """The synchronous reserve; `base` is usage known from elsewhere (other replicas) to count too."""
        now = self._clock()
        per_device = needs(items)
        used = self._agg.used_on(per_device, key, now)
        refused = first_overflow(items, merge_overlays(base, used) if base else used, per_device)
        if refused is not None:
            return ReserveResult(False, refused[0], refused[1])
        ttl = self.settings.ttl_s if ttl_s is None else ttl_s
        self._agg.add(Reservation(key, tuple(items), now + ttl), per_device)
        return RESERVED

    async def reserve(self, key: str, items: Sequence[ReservationItem], ttl_s: float | None = None) -> ReserveResult:
        result = self.reserve_now(key, items, ttl_s)
        metrics.RESERVATION_RESULTS("ok" if result.ok else "refused").inc()
        return result

    def release_now(self, key: str) -> bool:
        return self._agg.remove(key) is not None

    async def release(self, key: str) -> None:
        self.release_now(key)

    def reservations(self) -> list[Reservation]:
        self._agg.purge(self._clock())
        return list(self._agg.reservations.values())

    def overlay(self) -> Mapping[str, DeviceUsage]:
        return self._agg.view(self._clock())

    def holds(self, key: str) -> bool:
        return key in self._agg.reservations

    def namespace_usage(self, namespace: str) -> NamespaceUsage:
        return self._agg.namespace_usage(namespace, self._clock())

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


# ---- Redis ledger ----------------------------------------------------------------------------

# KEYS[1]: the hash of all reservations (field: key, value: JSON {exp, items}); KEYS[2..]: one hash
# per device (field: key, value: "mem|cores|exp_ms"). ARGV: key, ttl_ms, items JSON, dev prefix,
# then per device: mem, cores, capacity_mib, capacity_cores. Time is Redis' own, so replicas with
# skewed clocks agree on what expired.
RESERVE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = ARGV[1]
local exp = now + tonumber(ARGV[2])
local n = #KEYS - 1
for i = 1, n do
  local dkey = KEYS[i + 1]
  local base = 4 + (i - 1) * 4
  local mem, cores = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
  local capm, capc = tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4])
  local sm, sc = 0, 0
  local all = redis.call('HGETALL', dkey)
  for j = 1, #all, 2 do
    local f, v = all[j], all[j + 1]
    local m, c, e = string.match(v, '^(%-?%d+)|(%-?%d+)|(%d+)$')
    if tonumber(e) <= now then
      redis.call('HDEL', dkey, f)
      redis.call('HDEL', KEYS[1], f)
    elseif f ~= key then
      sm = sm + tonumber(m)
      sc = sc + tonumber(c)
    end
  end
  if sm + mem > capm then
    return {0, i, 'memory ' .. sm .. '+' .. mem .. ' MiB > ' .. capm .. ' MiB'}
  end
  if cores > 0 and sc + cores > capc then
    return {0, i, 'cores ' .. sc .. '+' .. cores .. '% > ' .. capc .. '%'}
  end
end
local old = redis.call('HGET', KEYS[1], key)
if old then
  for _, it in ipairs(cjson.decode(old)['items']) do
    redis.call('HDEL', ARGV[4] .. it[1], key)
  end
end
local ttl = tonumber(ARGV[2])
for i = 1, n do
  local dkey = KEYS[i + 1]
  local base = 4 + (i - 1) * 4
  redis.call('HSET', dkey, key, ARGV[base + 1] .. '|' .. ARGV[base + 2] .. '|' .. exp)
  if redis.call('PTTL', dkey) < ttl then
    redis.call('PEXPIRE', dkey, ttl)
  end
end
redis.call('HSET', KEYS[1], key, '{"exp":' .. exp .. ',"items":' .. ARGV[3] .. '}')
return {1, 0, ''}
"""

RELEASE_LUA = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old then
  return 0
end
for _, it in ipairs(cjson.decode(old)['items']) do
  redis.call('HDEL', ARGV[2] .. it[1], ARGV[1])
end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
"""

_REDIS_DOWN = (RedisError, OSError, TimeoutError)
_TIMEOUTS = (TimeoutError, RedisTimeoutError)  # asyncio's bound, or redis-py's socket timeout
CLOSE_TIMEOUT_S = 2.0  # the longest close() waits for the background task and the connections
# Redis is taken for gone, not just busy, after this many consecutive reservation timeouts with no
# success for DOWN_AFTER_S: a burst that times out together (one slow batch, one long pause of this
# replica's own event loop) is not an outage, and a flip to the fallback costs a replay later.
TIMEOUTS_BEFORE_DOWN = 5
DOWN_AFTER_S = 1.0


def _item_json(it: ReservationItem) -> list[Any]:
    return [it.uuid, it.memory_mib, it.cores, it.workload_type, it.node, it.capacity_mib, it.capacity_cores]


def _item_from_json(doc: Sequence[Any]) -> ReservationItem:
    return ReservationItem(
        uuid=str(doc[0]),
        memory_mib=int(doc[1]),
        cores=int(doc[2]),
        workload_type=str(doc[3]),
        node=str(doc[4]),
        capacity_mib=int(doc[5]),
        capacity_cores=int(doc[6]),
    )


def parse_records(raw: Mapping[bytes, bytes], redis_now_ms: int, local_now: float) -> list[Reservation]:
    """Reservations of the shared hash, their Redis expiry moved onto the local clock."""
    out = []
    for key, value in raw.items():
        doc = orjson.loads(value)
        left_s = (int(doc["exp"]) - redis_now_ms) / 1000
        if left_s > 0:
            out.append(Reservation(key.decode(), tuple(_item_from_json(i) for i in doc["items"]), local_now + left_s))
    return out


def with_own(records: Iterable[Reservation], own: Mapping[str, Reservation]) -> list[Reservation]:
    """Redis' answer to a refresh, with this replica's own live reservations winning.

    A reservation this replica made while the read was in flight is missing from the answer, and
    an earlier version of a key it re-reserved is stale. Dropping it would let placement offer its
    room again, and Redis refuse the next pick there: under load, every refusal forced another
    refresh, which dropped the next ones, and most admissions ended in a refusal storm."""
    return [*(r for r in records if r.key not in own), *own.values()]


class RedisLedger:
    """Reservations shared by all replicas through Redis, with an in-process fallback."""

    def __init__(self, redis_url: str, settings: LedgerSettings | None = None, clock: Callable[[], float] = time.time):
        self.settings = settings or LedgerSettings()
        self._clock = clock
        timeout = self.settings.timeout_s
        # A blocking pool: a burst waits for a connection (bounded by timeout_s) instead of failing.
        pool = aioredis.BlockingConnectionPool.from_url(
            redis_url,
            max_connections=self.settings.max_connections,
            timeout=None,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
        )
        self._redis = aioredis.Redis(connection_pool=pool)
        self._reserve_script = self._redis.register_script(RESERVE_LUA)
        self._release_script = self._redis.register_script(RELEASE_LUA)
        self._reserve_batch = ScriptBatcher(self._redis, self._reserve_script)
        self._all_key = f"{self.settings.prefix}:reservations"
        self._dev_prefix = f"{self.settings.prefix}:dev:"
        self._fallback = InProcessLedger(self.settings, clock)
        self._remote = Aggregate()  # last view of Redis' reservations (plus this replica's since)
        self._pending_release: set[str] = set()  # released while Redis was down
        # This replica's live reservations in Redis: replayed after a Redis restart lost them.
        self._own: dict[str, Reservation] = {}
        self.up = True  # optimistic: the first failure flips it and logs once
        self._timeouts = 0  # consecutive reservation timeouts
        self._last_ok = time.monotonic()  # the last reservation Redis answered
        self._task: asyncio.Task[None] | None = None

    # -- request path ----------------------------------------------------------------------------

    async def reserve(self, key: str, items: Sequence[ReservationItem], ttl_s: float | None = None) -> ReserveResult:
        ttl = self.settings.ttl_s if ttl_s is None else ttl_s
        if self.up:
            try:
                async with asyncio.timeout(self.settings.timeout_s):
                    result = await self._reserve_remote(key, items, ttl)
            except _TIMEOUTS as exc:
                # Slow is not down: the script may have run, and falling back now would let two
                # replicas promise the same room. Refuse (the caller re-places and retries with the
                # same key, which replaces itself); only a run of timeouts means Redis is gone.
                self._timeouts += 1
                if self._timeouts < TIMEOUTS_BEFORE_DOWN or not self._silent_long_enough():
                    metrics.RESERVATION_RESULTS("timeout").inc()
                    return ReserveResult(False, "", "redis reservation timed out", "redis", maybe_written=True)
                self._mark(False, exc)
            except _REDIS_DOWN as exc:
                self._mark(False, exc)
            else:
                self._timeouts = 0
                self._answered()
                metrics.RESERVATION_RESULTS("ok" if result.ok else "refused").inc()
                if not result.ok and result.refused_uuid:
                    # Another replica took the room: the caller places again, on an overlay that knows it.
                    with contextlib.suppress(*_REDIS_DOWN):
                        await self.refresh(self.settings.timeout_s)
                return result
        # Other replicas' last known reservations count too: the fallback must not double-book them.
        others = self._remote.used_on({it.uuid for it in items}, key, self._clock())
        result = self._fallback.reserve_now(key, items, ttl, base=others)
        metrics.RESERVATION_RESULTS("fallback_ok" if result.ok else "fallback_refused").inc()
        return ReserveResult(result.ok, result.refused_uuid, result.reason, "fallback")

    async def release(self, key: str) -> None:
        self._fallback.release_now(key)
        self._remote.remove(key)
        self._own.pop(key, None)
        if self.up:
            try:
                async with asyncio.timeout(self.settings.timeout_s):
                    await self._release_script(keys=[self._all_key], args=[key, self._dev_prefix])
                self._answered()
                return
            except _TIMEOUTS:
                pass  # kept for the background task to release (see _background)
            except _REDIS_DOWN as exc:
                self._mark(False, exc)
        self._pending_release.add(key)

    def _answered(self) -> None:
        self._last_ok = time.monotonic()

    def _silent_long_enough(self) -> bool:
        """Whether Redis has answered nothing for DOWN_AFTER_S: only then is a timeout an outage.
        A stall of this replica's own event loop (GC, a long sweep) also shows up as timeouts."""
        return time.monotonic() - self._last_ok >= DOWN_AFTER_S

    async def _release_pending(self) -> None:
        for key in list(self._pending_release):
            await self._release_script(keys=[self._all_key], args=[key, self._dev_prefix])
            self._pending_release.discard(key)

    def overlay(self) -> Mapping[str, DeviceUsage]:
        remote = self._remote.view(self._clock())
        local = self._fallback.overlay()
        return merge_overlays(remote, local) if local else remote  # merging only while the fallback holds some

    def holds(self, key: str) -> bool:
        # A refresh can bring a key from Redis before the reserve that wrote it has returned.
        return key in self._remote.reservations or self._fallback.holds(key)

    def namespace_usage(self, namespace: str) -> NamespaceUsage:
        now = self._clock()
        return self._remote.namespace_usage(namespace, now) + self._fallback.namespace_usage(namespace)

    # -- Redis ------------------------------------------------------------------------------------

    async def _reserve_remote(self, key: str, items: Sequence[ReservationItem], ttl_s: float) -> ReserveResult:
        per_device = needs(items)
        uuids = list(per_device)
        args: list[Any] = [
            key,
            int(ttl_s * 1000),
            orjson.dumps([_item_json(i) for i in items]).decode(),
            self._dev_prefix,
        ]
        for uuid in uuids:
            n = per_device[uuid]
            args += [n.memory_mib, n.cores, n.capacity_mib, n.capacity_cores]
        keys = [self._all_key] + [self._dev_prefix + u for u in uuids]
        ok, index, reason = await self._reserve_batch(keys, args)
        if not ok:
            return ReserveResult(False, uuids[int(index) - 1], reason.decode(), "redis")
        # Seen at once by this replica's placement; the periodic refresh brings the others'.
        self._own[key] = reservation = Reservation(key, tuple(items), self._clock() + ttl_s)
        self._remote.add(reservation)
        return ReserveResult(True, backend="redis")

    async def refresh(self, timeout_s: float | None = None) -> None:
        """Replace the local view of Redis' reservations (raises when Redis is down).

        The background refresh allows itself 0.5 s at least; the request path passes its own bound.
        """
        limit = max(self.settings.timeout_s, 0.5) if timeout_s is None else timeout_s
        async with asyncio.timeout(limit), self._redis.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.hgetall(self._all_key)
            (secs, micros), raw = await pipe.execute()
        now = self._clock()
        self._own = {k: r for k, r in self._own.items() if r.expires_at > now}
        self._remote = Aggregate(with_own(parse_records(raw, secs * 1000 + micros // 1000, now), self._own))

    async def _recover(self) -> None:
        """Redis is back: apply releases made meanwhile, replay this replica's reservations.

        Both its own earlier ones (a restarted Redis without persistence forgot them; the same key
        replaces itself, so replaying what Redis still holds is harmless) and the fallback's.
        """
        await self._release_pending()
        now = self._clock()
        self._own = {k: r for k, r in self._own.items() if r.expires_at > now}
        for r in [*self._own.values(), *self._fallback.reservations()]:
            result = await self._reserve_remote(r.key, r.items, r.expires_at - now)
            if result.ok:
                self._fallback.release_now(r.key)
            else:  # kept locally until it expires: still counted by this replica's overlay
                log.warning("ledger.replay_refused", key=r.key, device=result.refused_uuid, reason=result.reason)

    def _mark(self, up: bool, exc: BaseException | None = None) -> None:
        if up == self.up:
            return
        self.up = up
        metrics.REDIS_UP.set(1 if up else 0)
        metrics.DEGRADATION_TRANSITIONS.labels("redis_ledger", "up" if up else "down").inc()
        if up:
            log.info("ledger.redis_up")
        else:
            log.warning("ledger.redis_down_fallback_in_process", error=repr(exc))

    async def _background(self) -> None:
        while True:
            try:
                if not self.up:
                    # Pooled connections to the dead server would each fail once more: drop them all.
                    await self._redis.connection_pool.disconnect()
                    await self._redis.ping()
                    await self._recover()
                    self._mark(True)
                if self._pending_release:  # releases that timed out while Redis was up
                    await self._release_pending()
                await self.refresh()
                self._answered()
                await asyncio.sleep(self.settings.refresh_s)
            except _REDIS_DOWN as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # redis-py can turn our cancellation into a connection error mid-read: do not
                    # swallow it, or close() would wait for this loop forever.
                    raise asyncio.CancelledError from exc
                if not isinstance(exc, _TIMEOUTS) or self._silent_long_enough():
                    self._mark(False, exc)
                await asyncio.sleep(self.settings.retry_s)

    async def start(self) -> None:
        try:
            await self.refresh()
            metrics.REDIS_UP.set(1)
        except _REDIS_DOWN as exc:
            self._mark(False, exc)
        self._task = asyncio.create_task(self._background(), name="ledger-refresh")

    async def close(self) -> None:
        await cancel_and_wait(self._task, CLOSE_TIMEOUT_S)
        await self._reserve_batch.close()
        with contextlib.suppress(*_REDIS_DOWN):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._redis.aclose()
