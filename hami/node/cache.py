"""At most one backend read per interval, however often the agent is scraped.

Prometheus, the collector and a human with curl may all ask at once; NVML is read once and
everyone shares that read (and its failure). Requests that arrive during a read wait for it
instead of starting another, and a client that gives up does not cancel it for the others.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from hami.node.backend import Backend, BackendError
from hami.node.schema import NodeStatus


@dataclass(slots=True)
class ReadStats:
    """Counters for /metrics and /healthz; they count backend reads, not scrapes."""

    reads: int = 0
    read_errors: int = 0  # whole reads that failed
    call_errors: int = 0  # single NVML calls that failed inside reads that succeeded
    last_ok_at: float = 0.0  # unix time of the last successful read, 0 when none


class CachedReader:
    __slots__ = ("_at", "_clock", "_inflight", "_interval_s", "_result", "backend", "stats")

    def __init__(self, backend: Backend, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self.stats = ReadStats()
        self._interval_s = interval_s
        self._clock = clock
        self._result: NodeStatus | BackendError | None = None
        self._at = 0.0
        self._inflight: asyncio.Future[NodeStatus | BackendError] | None = None

    def invalidate(self) -> None:
        """Forget the cached result (a fault was switched: the next request reads again)."""
        self._result = None

    async def status(self) -> NodeStatus:
        """The cached status, or a fresh one when the cache is older than the interval. Raises BackendError."""
        result = self._result
        if result is None or self._clock() - self._at >= self._interval_s:
            if self._inflight is None:
                self._inflight = asyncio.ensure_future(self._read())
            result = await asyncio.shield(self._inflight)
        if isinstance(result, BackendError):
            raise result.with_traceback(None)  # the same instance is raised to every waiter
        return result

    async def _read(self) -> NodeStatus | BackendError:
        # Failures are returned, not raised, so they are cached like successes and a failing
        # backend is not hammered by every scrape.
        result: NodeStatus | BackendError
        try:
            result = await self.backend.read()
        except BackendError as exc:
            result = exc
        except Exception as exc:  # a bug in a backend must not leave waiters hanging forever
            result = BackendError(f"{type(exc).__name__}: {exc}")
        self.stats.reads += 1
        if isinstance(result, BackendError):
            self.stats.read_errors += 1
        else:
            self.stats.call_errors += len(result.errors)
            self.stats.last_ok_at = result.observed_at
        self._result, self._at, self._inflight = result, self._clock(), None
        return result
