"""The in-process ledger and the pure reservation arithmetic (no Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping

from hami.state.ledger import Aggregate, InProcessLedger, Reservation, first_overflow, needs
from hami.state.model import DeviceUsage, ReservationItem


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def item(
    uuid: str = "GPU-a", mem: int = 1000, cap: int = 4000, cores: int = 0, cap_cores: int = 100
) -> ReservationItem:
    return ReservationItem(
        node="n1", uuid=uuid, memory_mib=mem, cores=cores, capacity_mib=cap, capacity_cores=cap_cores
    )


def test_containers_sharing_a_device_add_up_and_keep_the_tightest_capacity() -> None:
    n = needs([item(mem=100, cap=500), item(mem=200, cap=400), item("GPU-b", mem=5)])
    assert n["GPU-a"].memory_mib == 300 and n["GPU-a"].capacity_mib == 400
    assert n["GPU-b"].memory_mib == 5


def test_overflow_names_the_device_and_ignores_cores_when_none_asked() -> None:
    used = {"GPU-a": DeviceUsage(memory_mib=3500, cores=100)}
    assert first_overflow([item(mem=400)], used) is None  # 3900 <= 4000, cores 0 means no SM limit
    refused = first_overflow([item("GPU-b", mem=1), item(mem=600)], used)
    assert refused is not None and refused[0] == "GPU-a"
    assert first_overflow([item(mem=1, cores=1)], used) is not None


async def test_reserve_refuses_past_capacity_and_overlay_shows_pending() -> None:
    ledger = InProcessLedger(clock=Clock())
    assert (await ledger.reserve("ns/p1", [item(mem=3000)], ttl_s=10)).ok
    refused = await ledger.reserve("ns/p2", [item(mem=1500)], ttl_s=10)
    assert not refused.ok and refused.refused_uuid == "GPU-a"
    assert ledger.overlay()["GPU-a"] == DeviceUsage(memory_mib=3000, cores=0, pods=1)
    assert ledger.namespace_usage("ns").memory_mib == 3000 and ledger.namespace_usage("other").memory_mib == 0


async def test_same_key_replaces_its_own_reservation() -> None:
    ledger = InProcessLedger(clock=Clock())
    assert (await ledger.reserve("ns/p", [item(mem=3000)], ttl_s=10)).ok
    assert (await ledger.reserve("ns/p", [item(mem=3500)], ttl_s=10)).ok  # not 6500: the old one is replaced
    assert ledger.overlay()["GPU-a"].memory_mib == 3500


async def test_release_and_expiry_free_the_memory() -> None:
    clock = Clock()
    ledger = InProcessLedger(clock=clock)
    await ledger.reserve("ns/a", [item(mem=4000)], ttl_s=5)
    await ledger.release("ns/a")
    assert "GPU-a" not in ledger.overlay()
    await ledger.reserve("ns/b", [item(mem=4000)], ttl_s=5)
    clock.now += 5.1
    assert "GPU-a" not in ledger.overlay()  # expired without a release
    assert (await ledger.reserve("ns/c", [item(mem=4000)], ttl_s=5)).ok


async def test_concurrent_burst_never_promises_more_than_capacity() -> None:
    ledger = InProcessLedger()
    results = await asyncio.gather(*(ledger.reserve(f"ns/p{i}", [item(mem=10, cap=1000)], 30) for i in range(300)))
    assert sum(r.ok for r in results) == 100
    assert ledger.overlay()["GPU-a"].memory_mib == 1000


def _random_changes(
    seed: int, uuids: list[str], steps: int, keys: int, namespaces: int = 1, typed: bool = False
) -> Iterator[tuple[int, Aggregate, dict[str, Reservation]]]:
    """An Aggregate under random adds, replacements, removals and (with `typed`) expiries, yielded
    after each step with the reservations that should be live at time `step`."""
    import random

    rng = random.Random(seed)
    agg = Aggregate()
    live: dict[str, Reservation] = {}
    for step in range(steps):
        key = f"ns{rng.randrange(namespaces)}/p{rng.randrange(keys)}"
        if rng.random() < 0.25:
            agg.remove(key)
            live.pop(key, None)
        else:
            items = tuple(
                ReservationItem(
                    "n",
                    rng.choice(uuids),
                    rng.randrange(1, 9) * 256,
                    rng.choice((0, 10, 30)),
                    10**6,
                    100,
                    rng.choice(("", "training", "inference")) if typed else "",
                )
                for _ in range(rng.randrange(1, 3))
            )
            expires = step + rng.choice((3.0, 1000.0)) if typed else 10**9  # some expire
            agg.add(Reservation(key, items, expires))
            live[key] = Reservation(key, items, expires)
        live = {k: r for k, r in live.items() if r.expires_at > step}
        yield step, agg, live


def test_used_on_matches_a_recount_of_the_live_reservations() -> None:
    """The reserve path's per-device view equals summing every live reservation but the key's own."""
    import random

    probes = random.Random(7)
    uuids = [f"GPU-{i}" for i in range(6)]
    for step, agg, live in _random_changes(7, uuids, steps=300, keys=40):
        probe = f"ns0/p{probes.randrange(40)}"
        got = agg.used_on(uuids, probe, now=float(step))
        for uuid in uuids:
            shares = [it for k, r in live.items() if k != probe for it in r.items if it.uuid == uuid]
            pods = len({k for k, r in live.items() if k != probe for it in r.items if it.uuid == uuid})
            if not pods:
                assert uuid not in got or got[uuid].pods == 0
                continue
            assert got[uuid].memory_mib == sum(it.memory_mib for it in shares)
            assert got[uuid].cores == sum(it.cores for it in shares)
            assert got[uuid].pods == pods


def test_overlay_view_matches_a_recount_and_earlier_views_keep_their_figures() -> None:
    """The overlay is copied from per-device records kept with each change; it must equal summing
    the live reservations (workload types included), and a view handed out before a change must not
    see it (the index compares the next view with the one it synced)."""
    uuids = [f"GPU-{i}" for i in range(5)]
    held: list[tuple[Mapping[str, DeviceUsage], dict[str, DeviceUsage]]] = []
    for step, agg, live in _random_changes(11, uuids, steps=400, keys=30, namespaces=3, typed=True):
        view = agg.view(float(step))
        expected: dict[str, DeviceUsage] = {}
        for uuid in uuids:
            mine = [(k, it) for k, r in live.items() for it in r.items if it.uuid == uuid]
            if mine:
                expected[uuid] = DeviceUsage(
                    sum(it.memory_mib for _, it in mine),
                    sum(it.cores for _, it in mine),
                    len({k for k, _ in mine}),
                    frozenset(it.workload_type for _, it in mine if it.workload_type),
                )
        assert dict(view) == expected, step
        if step % 50 == 0:
            held.append((view, dict(view)))
    for view, figures in held:
        assert dict(view) == figures
