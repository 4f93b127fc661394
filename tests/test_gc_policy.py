"""The long-lived state is frozen out of the cyclic GC after each sweep, and handed back each period."""

from __future__ import annotations

import gc
import weakref

from hami.gc_policy import LongLivedGc


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_freezes_after_each_sweep_and_hands_everything_back_once_a_period() -> None:
    clock = Clock()
    policy = LongLivedGc(60.0, clock)
    try:
        state = [{"node": i} for i in range(1000)]  # what a sweep leaves alive
        policy.settled()
        assert gc.get_freeze_count() >= len(state)  # out of every later collection
        clock.now = 59.0
        policy.settled()
        assert gc.get_freeze_count() > 0
        clock.now = 60.0  # the period is over: the next full collection sees (and frees) everything
        policy.settled()
        assert gc.get_freeze_count() == 0 and (policy.freezes, policy.unfreezes) == (2, 1)

        class Cycle:
            other: object = None

        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        alive = weakref.ref(a)
        clock.now = 61.0
        policy.settled()  # frozen while alive ...
        del a, b
        gc.collect()
        assert alive() is not None  # ... so not collected meanwhile
        clock.now = 121.0
        policy.settled()
        gc.collect()
        assert alive() is None  # handed back: the cycle is freed
    finally:
        gc.unfreeze()


def test_zero_never_freezes() -> None:
    policy = LongLivedGc(0.0, Clock())
    policy.settled()
    assert gc.get_freeze_count() == 0 and policy.freezes == 0
