"""The ledger's reservations baked into the placement index: apply_delta, sync_overlay, update_node,
and the runtime's sync; decisions must equal an exhaustive evaluation with the overlay applied."""

from __future__ import annotations

import dataclasses
import random

import pytest

from hami.config import Config
from hami.placement.engine import PlacementSettings, build_index, place
from hami.placement.evaluate import device_context, evaluate_node
from hami.placement.index import PlacementIndex, plus
from hami.placement.search import ask_of, quick_verdict
from hami.requests import ContainerGpuRequest, GpuRequest
from hami.runtime import Runtime
from hami.state.ledger import InProcessLedger
from hami.state.model import DeviceUsage, Gpu, Node, ReservationItem, Snapshot
from hami.state.settings import LedgerSettings

GIB = 1024
MODELS = ("NVIDIA A100", "Tesla T4", "NVIDIA A10")


def gpu(node: str, i: int, total: int = 16 * GIB, **kw: object) -> Gpu:
    return Gpu(uuid=f"{node}-gpu{i}", index=i, model=str(kw.pop("model", "NVIDIA A100")), memory_total_mib=total, **kw)  # type: ignore[arg-type]


def ask(mib: int | None = 4 * GIB, count: int = 1, cores: int = 0, **kw: object) -> GpuRequest:
    c = ContainerGpuRequest("c", "containers", 0, count, memory_mib=mib, cores=cores)
    return GpuRequest(containers=(c,), **kw)  # type: ignore[arg-type]


def fleet(size: int) -> list[Node]:
    """`size` distinct nodes (used memory differs per node) of two 16 GiB cards."""
    return [
        Node(f"n{i:05d}", (gpu(f"n{i}", 0, memory_promised_mib=i % 512, pods=1), gpu(f"n{i}", 1))) for i in range(size)
    ]


def random_node(rng: random.Random, i: int) -> Node:
    name = f"r{i:03d}"
    total = rng.choice((16, 24)) * GIB  # one card size per node: the index's groups stay exact
    model = rng.choice(MODELS)
    gpus = []
    for j in range(rng.choice((1, 2, 4))):
        pods = rng.choice((0, 0, 1, 2))
        gpus.append(
            gpu(
                name,
                j,
                total,
                model=model,
                memory_promised_mib=rng.randrange(0, total) if pods else 0,
                cores_promised=10 * rng.randrange(0, 8) if pods else 0,
                pods=pods,
                healthy=rng.random() > 0.05,
            )
        )
    return Node(name, tuple(gpus))


def random_usage(rng: random.Random) -> DeviceUsage:
    return DeviceUsage(rng.randrange(1, 8 * GIB), 5 * rng.randrange(0, 6), rng.randrange(1, 3))


def random_request(rng: random.Random, policy: str) -> GpuRequest:
    kind = rng.random()
    if kind < 0.1:  # whole cards
        c = ContainerGpuRequest("c", "containers", 0, rng.choice((1, 2)), memory_percent=100)
        return GpuRequest(containers=(c,), node_policy=policy)
    if kind < 0.2:  # two containers
        return GpuRequest(
            containers=(
                ContainerGpuRequest("a", "containers", 0, 1, memory_mib=rng.randrange(1, 8) * GIB),
                ContainerGpuRequest("b", "containers", 1, 1, memory_mib=rng.randrange(1, 8) * GIB, cores=20),
            ),
            node_policy=policy,
        )
    types = (rng.choice(("a10", "t4")),) if kind < 0.3 else ()
    return ask(
        rng.randrange(1, 20) * GIB, rng.choice((1, 1, 2)), 10 * rng.randrange(0, 5), node_policy=policy, use_types=types
    )


def exhaustive_winner(
    request: GpuRequest, index: PlacementIndex, overlay: dict[str, DeviceUsage], policy: str
) -> str | None:
    """Every node evaluated with the overlay: the best by (tier, score, node order)."""
    s = index.settings
    dctx = device_context(request, s, index.snapshot.utilisation_known)
    best: tuple[int, float, int] | None = None
    winner = None
    for name, node in index.nodes.items():
        v = evaluate_node(node, overlay, request, policy, s, index.sctx, dctx)
        if v.fits and (best is None or (v.tier, -v.score, index.rank[name]) < best):
            best, winner = (v.tier, -v.score, index.rank[name]), name
    return winner


def signature(index: PlacementIndex) -> tuple[object, object]:
    """What the search reads: the records and the candidate lists."""
    return dict(index.recs), {k: (list(b), list(s)) for k, (b, s) in index.lists.items()}


# ---- apply_delta -------------------------------------------------------------------------------


def test_apply_delta_moves_a_node_up_for_binpack_and_down_for_spread() -> None:
    s = PlacementSettings()
    index = build_index(Snapshot(tuple(fleet(20))), s)
    quiet = "n00003"
    assert place(ask(node_policy="binpack"), index, index.applied, s).node != quiet
    assert index.apply_delta({"n3-gpu0": DeviceUsage(memory_mib=6 * GIB, cores=20, pods=2)}) == 1
    assert place(ask(node_policy="binpack"), index, index.applied, s).node == quiet
    least = place(ask(node_policy="spread"), index, index.applied, s).node
    assert least is not None
    index.add_usage({index.nodes[least].gpus[0].uuid: DeviceUsage(memory_mib=GIB, pods=1)})
    assert place(ask(node_policy="spread"), index, index.applied, s).node != least
    # Absolute values: an empty usage removes what was applied, and the node returns to its place.
    index.apply_delta({"n3-gpu0": DeviceUsage(), index.nodes[least].gpus[0].uuid: None})
    assert index.applied == {}
    assert place(ask(node_policy="binpack"), index, index.applied, s).node != quiet
    assert place(ask(node_policy="spread"), index, index.applied, s).node == least


def test_add_usage_sums_shares_of_one_device() -> None:
    s = PlacementSettings()
    index = build_index(Snapshot(tuple(fleet(3))), s)
    one = DeviceUsage(memory_mib=GIB, cores=10, pods=1, workload_types=frozenset({"training"}))
    index.add_usage({"n1-gpu1": one})
    index.add_usage({"n1-gpu1": one})
    assert index.applied["n1-gpu1"] == DeviceUsage(2 * GIB, 20, 2, frozenset({"training"}))
    dev = index.recs["n00001"].devs[1]
    assert (dev.free, dev.cores_free, dev.pods) == (14 * GIB, 80, 2)


def test_remove_usage_takes_back_a_refused_pick() -> None:
    """decide bakes its pick in before awaiting the ledger and takes it back when refused."""
    s = PlacementSettings()
    index = build_index(Snapshot(tuple(fleet(3))), s)
    kept = DeviceUsage(memory_mib=GIB, cores=10, pods=1)
    refused = DeviceUsage(memory_mib=2 * GIB, cores=30, pods=1)
    index.add_usage({"n1-gpu1": kept})
    before = index.recs["n00001"].devs[1]
    index.add_usage({"n1-gpu1": refused, "n2-gpu0": refused})
    index.remove_usage({"n1-gpu1": refused, "n2-gpu0": refused})
    assert index.applied == {"n1-gpu1": kept}
    assert index.recs["n00001"].devs[1] == before
    fresh = build_index(Snapshot(tuple(fleet(3))), s)
    fresh.add_usage({"n1-gpu1": kept})
    assert index.recs == fresh.recs


def test_a_full_device_in_applied_usage_is_never_offered() -> None:
    s = PlacementSettings()
    nodes = [Node("a", (gpu("a", 0),)), Node("b", (gpu("b", 0),))]
    index = build_index(Snapshot(tuple(nodes)), s)
    index.apply_delta({"a-gpu0": DeviceUsage(memory_mib=12 * GIB, pods=1)})
    for policy in ("binpack", "spread"):
        assert place(ask(8 * GIB, node_policy=policy), index, index.applied, s).node == "b"
    index.apply_delta({"b-gpu0": DeviceUsage(memory_mib=12 * GIB, pods=1)})
    d = place(ask(8 * GIB), index, index.applied, s)
    assert not d.fits and d.filtered == {"memory": 2}


def test_nodes_full_on_cores_are_skipped_by_their_lists() -> None:
    """Binpack keeps nodes out of cores (but not memory) at the top of its lists: a pod asking cores
    must not walk past them one by one, nor a whole-card pod past nodes with no empty card."""
    busy = [
        Node(f"busy{i:03d}", (gpu(f"b{i}", 0, memory_promised_mib=4 * GIB + i, cores_promised=95, pods=3),))
        for i in range(150)
    ]
    room = [Node(f"room{i}", (gpu(f"r{i}", 0, memory_promised_mib=GIB, pods=1, cores_promised=10),)) for i in range(3)]
    s = PlacementSettings()
    index = build_index(Snapshot(tuple(busy + room)), s)
    d = place(ask(2 * GIB, cores=20), index, index.applied, s)
    assert d.node == "room0"
    assert d.filtered == {"cores": 150}
    assert index.evaluations <= len(room) + 1
    assert place(ask(2 * GIB), index, index.applied, s).node == "busy149"  # no cores asked: the fullest
    whole = GpuRequest(containers=(ContainerGpuRequest("c", "containers", 0, 1, memory_percent=100),))
    assert not place(whole, index, index.applied, s).fits


# ---- sync_overlay and update_node ----------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_incremental_index_equals_a_fresh_one_and_an_exhaustive_evaluation(seed: int) -> None:
    rng = random.Random(seed)
    s = PlacementSettings()
    nodes = [random_node(rng, i) for i in range(40)]
    index = build_index(Snapshot(tuple(nodes)), s)
    uuids = [g.uuid for n in nodes for g in n.gpus]
    overlay: dict[str, DeviceUsage] = {}
    for step in range(60):
        move = rng.random()
        if move < 0.5:  # a reservation, as the webhook adds it
            share = {u: random_usage(rng) for u in rng.sample(uuids, rng.choice((1, 2)))}
            index.add_usage(share)
            for u, usage in share.items():
                overlay[u] = plus(overlay.get(u), usage)
        elif move < 0.7 and overlay:  # a release or expiry, seen by the next sync
            overlay.pop(rng.choice(sorted(overlay)))
            index.sync_overlay(dict(overlay))
        elif move < 0.85:  # a new snapshot state of one node
            i = rng.randrange(len(nodes))
            nodes[i] = dataclasses.replace(random_node(rng, i), name=nodes[i].name)
            index.update_node(nodes[i])
            uuids = [g.uuid for n in nodes for g in n.gpus]
        else:  # another replica's reservations appear in the ledger
            overlay.update({u: random_usage(rng) for u in rng.sample(uuids, 3)})
            index.sync_overlay(dict(overlay))
        assert index.applied == overlay, step
    index.snapshot = Snapshot(tuple(nodes))
    fresh = build_index(Snapshot(tuple(nodes)), s)
    fresh.sync_overlay(overlay)
    assert signature(index) == signature(fresh)
    for policy in ("binpack", "spread"):
        for _ in range(25):
            request = random_request(rng, policy)
            baked = place(request, index, index.applied, s)
            assert baked.node == exhaustive_winner(request, index, overlay, policy), request
            other = place(request, fresh, overlay, s)
            assert (baked.node, baked.devices, baked.score) == (other.node, other.devices, other.score)


@pytest.mark.parametrize("seed", range(4))
def test_the_winner_s_verdict_from_its_record_equals_a_full_evaluation(seed: int) -> None:
    """The search judges the winner of a lone-container request from its record (quick_verdict):
    devices taken, their order, the node score and the fit must be evaluate_node's, on nodes with
    reservations applied, mixed health and models, for binpack and spread, slices and whole cards."""
    rng = random.Random(seed)
    nodes = [random_node(rng, i) for i in range(40)]
    index = build_index(Snapshot(nodes=tuple(nodes)), PlacementSettings(max_pods_per_gpu=4))
    uuids = [g.uuid for n in nodes for g in n.gpus]
    index.apply_delta({u: random_usage(rng) for u in rng.sample(uuids, len(uuids) // 3)})
    s = index.settings
    compared = fitted = 0
    for _ in range(60):
        policy = rng.choice(("binpack", "spread"))
        kind = rng.random()
        if kind < 0.15:
            c = ContainerGpuRequest("c", "containers", 0, rng.choice((1, 2)), memory_percent=100)
        elif kind < 0.25:  # all the cores: a whole card too, with a memory figure
            c = ContainerGpuRequest("c", "containers", 0, rng.choice((1, 2)), rng.randrange(1, 16) * GIB, cores=100)
        elif kind < 0.4:
            c = ContainerGpuRequest("c", "containers", 0, rng.choice((1, 2)), memory_percent=rng.choice((25, 50)))
        else:
            c = ContainerGpuRequest(
                "c", "containers", 0, rng.choice((1, 1, 2)), rng.randrange(1, 20) * GIB, cores=10 * rng.randrange(0, 5)
            )
        types = (rng.choice(("a10", "t4")),) if rng.random() < 0.2 else ()
        request = GpuRequest(containers=(c,), node_policy=policy, use_types=types)
        dctx = device_context(request, s, True)
        a = ask_of(request, s, None)
        assert a.exact and a.single is not None
        for node in nodes:
            rec = index.recs[node.name]
            full = evaluate_node(node, index.applied, request, policy, s, index.sctx, dctx)
            fast = quick_verdict(rec, a, s, 0, policy == "binpack")
            compared += 1
            if not full.fits:
                assert fast is None, (node.name, request, full)
                continue
            fitted += 1
            assert fast is not None, (node.name, request, full)
            assert fast.assignment == full.assignment and fast.tier == full.tier
            assert fast.score == pytest.approx(full.score, abs=1e-12)
    assert fitted > 100 and compared - fitted > 100  # both outcomes were exercised


def test_the_quick_memo_follows_a_node_filled_and_freed_between_decisions() -> None:
    """The search remembers each node's quick verdict per request shape while its record is the same
    object: a node filled by reservations must stop winning, and one freed again must win again."""
    nodes = [
        Node("a", (gpu("a", 0, memory_promised_mib=8 * GIB, pods=1),)),
        Node("b", (gpu("b", 0),)),
    ]
    index = build_index(Snapshot(nodes=tuple(nodes)), PlacementSettings())
    request = ask(4 * GIB)

    def winner() -> str | None:
        return place(request, index, index.applied, index.settings).node

    # a's card shared by as many pods as it may be, its memory untouched: a stays in the same
    # candidate list, so only the memo's check of the record can tell it changed.
    full = {"a-gpu0": DeviceUsage(0, 0, index.settings.max_pods_per_gpu - 1)}
    index.apply_delta(full)
    assert winner() == "b"  # the memo now holds a's rejection
    for _ in range(2):
        index.apply_delta({"a-gpu0": None})
        assert winner() == "a"  # binpack: the fuller node, free again
        index.apply_delta(full)
        assert winner() == "b"


def test_update_node_keeps_the_applied_usage() -> None:
    s = PlacementSettings()
    nodes = fleet(4)
    index = build_index(Snapshot(tuple(nodes)), s)
    index.apply_delta({"n2-gpu1": DeviceUsage(memory_mib=10 * GIB, cores=30, pods=1)})
    busier = dataclasses.replace(
        nodes[2], gpus=(nodes[2].gpus[0], dataclasses.replace(nodes[2].gpus[1], pods=1, memory_promised_mib=2 * GIB))
    )
    index.update_node(busier)
    dev = index.recs["n00002"].devs[1]
    assert (dev.free, dev.cores_free, dev.pods) == (4 * GIB, 70, 2)  # 16 - 2 promised - 10 reserved
    fresh = build_index(Snapshot((*nodes[:2], busier, nodes[3])), s)
    fresh.apply_delta({"n2-gpu1": DeviceUsage(memory_mib=10 * GIB, cores=30, pods=1)})
    assert index.recs["n00002"] == fresh.recs["n00002"]


def test_usage_of_a_node_not_yet_known_waits_for_it() -> None:
    s = PlacementSettings()
    index = build_index(Snapshot(tuple(fleet(2))), s)
    index.apply_delta({"late-gpu0": DeviceUsage(memory_mib=15 * GIB, pods=1)})
    index.update_node(Node("late", (gpu("late", 0),)))
    assert index.recs["late"].devs[0].free == GIB


def test_sync_is_skipped_for_the_mapping_synced_last_and_redone_after_a_delta() -> None:
    s = PlacementSettings()
    index = build_index(Snapshot(tuple(fleet(10))), s)
    overlay = {"n4-gpu0": DeviceUsage(memory_mib=GIB, pods=1), "n7-gpu1": DeviceUsage(memory_mib=GIB, pods=1)}
    assert index.sync_overlay(overlay) == 2
    assert index.last_synced is overlay
    overlay["n5-gpu0"] = DeviceUsage(memory_mib=GIB, pods=1)  # mutated in place: identity says unchanged
    assert index.sync_overlay(overlay) == 0 and "n5-gpu0" not in index.applied
    assert index.sync_overlay(dict(overlay)) == 1  # a new mapping is diffed: only the new device moves
    index.add_usage({"n1-gpu0": DeviceUsage(memory_mib=GIB, pods=1)})
    assert index.last_synced is None
    same = index.applied
    place(ask(), index, same, s)  # the index's own mapping is never synced against itself
    assert index.applied is same and "n1-gpu0" in index.applied


# ---- the runtime's sync ------------------------------------------------------------------------


async def test_runtime_sync_follows_reservations_expiry_and_is_rate_limited() -> None:
    now = [1000.0]
    runtime = Runtime(Config())
    runtime.ledger = ledger = InProcessLedger(LedgerSettings(ttl_s=30.0), clock=lambda: now[0])
    runtime.apply_snapshot(Snapshot(tuple(fleet(5)), version=1))
    index = runtime.placement_index
    item = ReservationItem("n00001", "n1-gpu1", 4 * GIB, 0, capacity_mib=16 * GIB)
    assert ledger.reserve_now("ns/p", [item]).ok
    runtime.sync_overlay()  # the last sync was apply_snapshot's, just now: not yet
    assert index.applied == {}
    runtime.sync_overlay(force=True)  # what the Decider does after a refused reservation
    assert index.applied == {"n1-gpu1": DeviceUsage(4 * GIB, 0, 1)}
    now[0] += 31  # the reservation expires
    runtime._overlay_synced_at -= 1.0  # as if the sync interval had passed
    runtime.sync_overlay()
    assert index.applied == {}


async def test_a_pick_the_ledger_already_holds_is_not_counted_twice_while_its_reserve_returns() -> None:
    """A Redis refresh can read a reservation before the reserve() that wrote it returns: the
    runtime's pending pick and the ledger's overlay then name the same key, and counting both would
    fill the device on paper and deny pods that fit. A pick the ledger lacks still counts."""
    runtime = Runtime(Config())
    runtime.ledger = ledger = InProcessLedger(LedgerSettings(ttl_s=30.0))
    runtime.apply_snapshot(Snapshot(tuple(fleet(5)), version=1))
    index = runtime.placement_index
    held = ReservationItem("n00001", "n1-gpu1", 4 * GIB, 0, capacity_mib=16 * GIB)
    assert ledger.reserve_now("ns/held", [held]).ok
    runtime.pending["ns/held"] = {"n1-gpu1": DeviceUsage(4 * GIB, 0, 1)}
    runtime.pending["ns/waiting"] = {"n2-gpu1": DeviceUsage(2 * GIB, 0, 1)}
    runtime.sync_overlay(force=True)
    assert index.applied == {"n1-gpu1": DeviceUsage(4 * GIB, 0, 1), "n2-gpu1": DeviceUsage(2 * GIB, 0, 1)}


# ---- denials -------------------------------------------------------------------------------------


def test_denial_names_nodes_short_of_room_before_type_mismatches() -> None:
    s = PlacementSettings()
    nodes = [
        Node("gpu-a", tuple(gpu("a", i, 40 * GIB, model="NVIDIA A100-SXM4-40GB") for i in range(4))),
        Node("gpu-b", (gpu("b", 0, 15 * GIB, model="Tesla T4"),)),
        Node("gpu-c", tuple(gpu("c", i, 80 * GIB, model="NVIDIA H100 80GB HBM3") for i in range(8))),
        Node("gpu-d", (gpu("d", 0, 22 * GIB, model="NVIDIA A10", memory_used_mib=8 * GIB, temperature_c=86.0),)),
        Node("gpu-e", (gpu("e", 0, 22 * GIB, model="NVIDIA A10", memory_used_mib=10 * GIB),)),
    ]
    d = place(ask(20 * GIB, use_types=("A10",), nouse_types=("A100",)), build_index(Snapshot(tuple(nodes)), s), {}, s)
    assert not d.fits
    named = [v.node for v in d.rejected]
    assert named[:2] == ["gpu-e", "gpu-d"]  # memory shortfall, then the hot card; types last
    assert "needs 20.0Gi" in d.rejected[0].reason and "86C" in d.rejected[1].reason


def test_state_keys_of_emptied_classes_are_forgotten_while_readings_keep_moving() -> None:
    nodes = fleet(50)
    index = build_index(Snapshot(tuple(nodes)), PlacementSettings())
    shared = dataclasses.replace(nodes[1], name=nodes[0].name)  # n0 joins n1's state: one class of two
    index.update_node(shared)
    assert index.class_of(nodes[0].name) == index.class_of(nodes[1].name)
    for sweep in range(1, 6):  # every sweep, every node's temperature moves (as real readings do)
        for node in nodes:
            hotter = tuple(dataclasses.replace(g, temperature_c=40.0 + sweep) for g in node.gpus)
            index.update_node(dataclasses.replace(node, gpus=hotter))
        assert len(index._class_of_key) == len(index.classes) <= len(nodes)
    fresh = build_index(Snapshot(tuple(index.nodes.values())), PlacementSettings())
    assert signature(index) == signature(fresh)


def test_a_shape_s_search_figures_are_kept_apart_by_uuid_exclusions_and_utilisation_state() -> None:
    """The index keeps each request shape's search figures (device context, ask); a request that
    differs only by excluded UUIDs, or a snapshot whose utilisation turned unknown, must not reuse
    another's: the excluded device would be offered, the unknown utilisation ignored."""
    nodes = [Node("solo", (gpu("solo", 0, utilisation=10.0), gpu("solo", 1, utilisation=10.0)))]
    index = build_index(Snapshot(nodes=tuple(nodes)), PlacementSettings())
    first = place(ask(), index, index.applied, index.settings)
    assert first.fits
    taken = first.devices[0].uuid
    again = place(ask(nouse_uuids=(taken,)), index, index.applied, index.settings)
    assert again.fits and [d.uuid for d in again.devices] != [taken]
    bounded = ask(max_gpu_util=50.0)
    assert place(bounded, index, index.applied, index.settings).fits
    index.snapshot = dataclasses.replace(index.snapshot, utilisation_known=False)
    refused = place(bounded, index, index.applied, index.settings)
    assert not refused.fits  # conservative: unknown utilisation fails a utilisation bound
    assert "utilisation" in refused.deny_message()
