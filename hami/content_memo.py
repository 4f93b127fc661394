"""Results of pure readers, remembered by the content they read.

The pods of one Deployment, Job or ReplicaSet carry the same containers, so the webhook reads the
same `resources` block again and again; validation and placement each take some 25 µs per GPU
container to read it. Keyed by `repr` of what was read (exact for JSON and YAML values: it tells
1 from 1.0 and NaN from null, which a JSON encoding would not), a repeat costs a lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

R = TypeVar("R")

DEFAULT_LIMIT = 4096  # distinct container shapes remembered; a cluster has far fewer
_MISSING = object()  # a stored result may be None (a container asking for no GPU)


class ContentMemo(Generic[R]):
    """A bounded memo: forgets everything once `limit` keys are held (shapes repeat, so the hot
    ones come straight back, and there is no per-hit bookkeeping as an LRU would have)."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._limit = limit
        self._results: dict[Hashable, R] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, compute: Callable[[], R]) -> R:
        found = self._results.get(key, _MISSING)
        if found is not _MISSING:
            self.hits += 1
            return found  # type: ignore[return-value]
        self.misses += 1
        result = compute()
        if len(self._results) >= self._limit:
            self._results.clear()
        self._results[key] = result
        return result
