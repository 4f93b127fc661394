"""Keep the cyclic garbage collector off the webhook's big, long-lived state.

Every collector sweep rebuilds the node snapshot and moves nodes in the placement index: tens of
thousands of objects per 1,000 nodes that live until the next sweep. CPython's oldest-generation
collection rescans all of them each time enough new ones have survived, which measured as pauses
of about 260 ms at 10,000 nodes (admissions wait behind them: a p99 of 650 ms). That state is
made of plain records with no reference cycles, so reference counting frees it when replaced and
the cyclic collector has nothing to find there.

So once a sweep has been applied, everything alive is frozen (`gc.freeze()`: moved to the
permanent generation, ignored by later collections). The cost is that a reference cycle alive at
that moment and dropped later is not collected while frozen; every `unfreeze_every_s` all of it
is handed back (`gc.unfreeze()`) and the next full collection frees such cycles, at the price of
one long pause per period.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable


class LongLivedGc:
    def __init__(self, unfreeze_every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.unfreeze_every_s = unfreeze_every_s
        self._clock = clock
        self._since = clock()
        self.freezes = 0
        self.unfreezes = 0

    def settled(self) -> None:
        """The long-lived state was just rebuilt: freeze it, or hand everything back once a period."""
        if self.unfreeze_every_s <= 0:
            return
        now = self._clock()
        if now - self._since >= self.unfreeze_every_s:
            self._since = now
            gc.unfreeze()  # the next full collection scans everything once and frees frozen cycles
            self.unfreezes += 1
            return
        gc.freeze()
        self.freezes += 1

    def close(self) -> None:
        if self.freezes:
            gc.unfreeze()
