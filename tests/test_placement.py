"""Placement engine: filters, scorers and the decision on small known inventories."""

from __future__ import annotations

from hami.placement.engine import PlacementSettings, build_index, place
from hami.placement.frag import Shape, ShapeMix
from hami.placement.selectors import selector_allows
from hami.requests import ContainerGpuRequest, GpuRequest
from hami.state.model import DeviceUsage, Freshness, Gpu, Node, Snapshot

GIB = 1024


def gpu(node: str, i: int, total: int = 16 * GIB, **kw: object) -> Gpu:
    return Gpu(uuid=f"{node}-gpu{i}", index=i, model=str(kw.pop("model", "A100")), memory_total_mib=total, **kw)  # type: ignore[arg-type]


def node(name: str, *gpus: Gpu, **kw: object) -> Node:
    return Node(name=name, gpus=gpus, **kw)  # type: ignore[arg-type]


def ask(mib: int = 4 * GIB, count: int = 1, cores: int = 0, **kw: object) -> GpuRequest:
    return GpuRequest(containers=(ContainerGpuRequest("c", "containers", 0, count, memory_mib=mib, cores=cores),), **kw)  # type: ignore[arg-type]


def decide(nodes: list[Node], request: GpuRequest, reserved: dict[str, DeviceUsage] | None = None, **settings: object):
    s = PlacementSettings(**settings)  # type: ignore[arg-type]
    return place(request, build_index(Snapshot(tuple(nodes)), s), reserved or {}, s)


def loaded_pair() -> list[Node]:
    busy = node("a-busy", gpu("a", 0, memory_promised_mib=8 * GIB, pods=1), gpu("a", 1))
    idle = node("b-idle", gpu("b", 0), gpu("b", 1))
    return [busy, idle]


def test_binpack_prefers_the_fuller_node_and_device_as_hami_does() -> None:
    d = decide(loaded_pair(), ask(node_policy="binpack"))
    assert d.node == "a-busy"
    assert d.devices[0].gpu_index == 0  # the device already in use scores highest
    assert d.policy == "binpack"


def test_spread_prefers_the_emptier_node() -> None:
    d = decide(loaded_pair(), ask(node_policy="spread"))
    assert d.node == "b-idle"
    assert d.runners_up and d.runners_up[0].node == "a-busy"
    assert "score" in d.runners_up[0].reason


def test_card_free_by_promise_but_full_by_nvml_is_not_offered() -> None:
    """The opening incident: nothing promised on the card, yet an unaccounted process filled it."""
    ghost = node("ghost", gpu("g", 0, memory_used_mib=15 * GIB))
    d = decide([ghost], ask(8 * GIB))
    assert not d.fits
    assert d.filtered == {"memory": 1}
    assert "ghost" in d.deny_message() and "needs 8.0Gi" in d.deny_message()


def test_overlay_prevents_double_promise() -> None:
    only = node("n", gpu("n", 0))
    reserved = {"n-gpu0": DeviceUsage(memory_mib=10 * GIB, pods=1)}
    assert decide([only], ask(8 * GIB)).fits
    assert not decide([only], ask(8 * GIB), reserved).fits
    assert decide([only], ask(6 * GIB), reserved).fits


def test_whole_card_request_needs_an_empty_device() -> None:
    shared = node("n", gpu("n", 0, memory_promised_mib=GIB, pods=1, cores_promised=10), gpu("n", 1))
    whole = GpuRequest(containers=(ContainerGpuRequest("c", "containers", 0, 1, memory_percent=100),))
    d = decide([shared], whole)
    assert d.devices[0].gpu_index == 1
    two = GpuRequest(containers=(ContainerGpuRequest("c", "containers", 0, 2, memory_percent=100),))
    assert not decide([shared], two).fits


def test_cores_and_pod_limits_filter_devices() -> None:
    hot = node("n", gpu("n", 0, cores_promised=80, pods=2))
    assert not decide([hot], ask(GIB, cores=30)).fits
    assert decide([hot], ask(GIB, cores=20)).fits
    assert decide([hot], ask(GIB), max_pods_per_gpu=2).filtered == {"pods": 1}


def test_multi_container_pod_gets_distinct_devices_per_container_and_shares_by_capacity() -> None:
    n = node("n", gpu("n", 0), gpu("n", 1))
    pod = GpuRequest(
        containers=(
            ContainerGpuRequest("a", "containers", 0, 2, memory_mib=6 * GIB),
            ContainerGpuRequest("b", "containers", 1, 1, memory_mib=6 * GIB),
        )
    )
    d = decide([n], pod)
    assert d.fits
    assert len({c.uuid for c in d.devices if c.container == "a"}) == 2
    too_big = GpuRequest(
        containers=(
            ContainerGpuRequest("a", "containers", 0, 2, memory_mib=10 * GIB),
            ContainerGpuRequest("b", "containers", 1, 1, memory_mib=10 * GIB),
        )
    )
    assert not decide([n], too_big).fits


def test_unhealthy_hot_and_ecc_devices_are_filtered() -> None:
    nodes = [
        node("sick", gpu("s", 0, healthy=False)),
        node("hot", gpu("h", 0, temperature_c=91.0)),
        node("ecc", gpu("e", 0, ecc_uncorrected=2)),
        node("fine", gpu("f", 0, temperature_c=60.0)),
    ]
    d = decide(nodes, ask())
    assert d.node == "fine"
    assert d.filtered == {"unhealthy": 3}


def test_type_and_uuid_constraints() -> None:
    nodes = [node("a", gpu("a", 0, model="NVIDIA A100")), node("t", gpu("t", 0, model="Tesla T4"))]
    assert decide(nodes, ask(use_types=("t4",))).node == "t"
    assert decide(nodes, ask(nouse_types=("A100",))).node == "t"
    assert decide(nodes, ask(use_uuids=("a-gpu0",))).node == "a"
    assert decide(nodes, ask(nouse_uuids=("a-gpu0",))).node == "t"
    assert not decide(nodes, ask(use_types=("H100",))).fits


def test_training_and_inference_are_separated() -> None:
    nodes = [
        node("a", gpu("a", 0, workload_types=frozenset({"training"}), pods=1, memory_promised_mib=GIB)),
        node("b", gpu("b", 0)),
    ]
    assert decide(nodes, ask(workload_type="inference")).node == "b"
    assert decide(nodes, ask(workload_type="training")).node == "a"  # binpack joins its own kind
    reserved = {"b-gpu0": DeviceUsage(memory_mib=GIB, pods=1, workload_types=frozenset({"training"}))}
    assert not decide(nodes, ask(workload_type="inference"), reserved).fits


def test_node_selector_and_required_affinity_intersect() -> None:
    nodes = [
        node("n1", gpu("a", 0), labels={"zone": "z1", "pool": "gpu"}),
        node("n2", gpu("b", 0), labels={"zone": "z2", "pool": "gpu"}),
        node("n3", gpu("c", 0), labels={"zone": "z1"}),
    ]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "Exists"}]}]
            }
        }
    }
    d = decide(nodes, ask(node_selector={"zone": "z1"}, affinity=affinity))
    assert d.node == "n1"
    assert d.filtered == {"selector": 2}
    assert decide(nodes, ask(node_selector={"kubernetes.io/hostname": "n3"})).node == "n3"


def test_affinity_operators() -> None:
    labels = {"gen": "5", "zone": "z1"}

    def term(*exprs: dict[str, object]) -> dict[str, object]:
        return {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": list(exprs)}]
                }
            }
        }

    assert selector_allows({}, term({"key": "gen", "operator": "Gt", "values": ["4"]}), labels)[0]
    assert not selector_allows({}, term({"key": "gen", "operator": "Lt", "values": ["4"]}), labels)[0]
    assert selector_allows({}, term({"key": "zone", "operator": "NotIn", "values": ["z2"]}), labels)[0]
    assert not selector_allows({}, term({"key": "zone", "operator": "DoesNotExist"}), labels)[0]


def test_degradation_ranks_stale_below_fresh_or_excludes_it() -> None:
    stale = node("a-stale", gpu("a", 0, memory_promised_mib=8 * GIB, pods=1), freshness=Freshness.STALE)
    fresh = node("b-fresh", gpu("b", 0))
    unknown = node("c-unknown", gpu("c", 0), freshness=Freshness.UNKNOWN, reason="breaker open")
    conservative = decide([stale, fresh, unknown], ask())
    assert conservative.node == "b-fresh"
    assert conservative.filtered == {"freshness": 2}
    aggressive = decide([stale, unknown], ask(), degradation="aggressive")
    assert aggressive.node == "a-stale" and aggressive.stale
    # binpack would prefer the loaded stale node, but any fresh node ranks above it
    assert decide([stale, fresh], ask(), degradation="aggressive").node == "b-fresh"


def test_latency_bound_needs_known_low_utilisation() -> None:
    nodes = [
        node("busy", gpu("a", 0, utilisation=70.0)),
        node("quiet", gpu("b", 0, utilisation=10.0)),
        node("blind", gpu("c", 0)),
    ]
    assert decide(nodes, ask(workload_type="latency-sensitive")).node == "quiet"
    assert decide(nodes, ask(max_gpu_util=5.0)).filtered == {"utilisation": 3}
    assert decide(nodes[2:], ask(max_gpu_util=50.0), degradation="aggressive").fits
    assert decide(nodes, ask(node_policy="latency")).node == "quiet"


def test_deny_message_lists_closest_candidates_with_reasons() -> None:
    nodes = [
        node("node-3", gpu("x", 0, memory_promised_mib=12 * GIB)),
        node("node-7", gpu("y", 0, memory_promised_mib=8 * GIB)),
        node("node-9", gpu("z", 0, healthy=False)),
    ]
    d = decide(nodes, ask(10 * GIB))
    message = d.deny_message()
    assert message.startswith("no node fits: node-7: GPU-0 has 8.0Gi effective free, needs 10.0Gi")
    assert message.index("node-7") < message.index("node-3")
    assert "unhealthy" in message
    assert len(d.explain()) < 500


def test_node_name_restricts_to_that_node() -> None:
    s = PlacementSettings()
    d = place(ask(node_policy="spread"), build_index(Snapshot(tuple(loaded_pair())), s), {}, s, node_name="a-busy")
    assert d.node == "a-busy" and d.considered == 1


def test_frag_beats_binpack_on_a_crafted_sequence() -> None:
    """Two nodes of two 1000-unit cards; shares of 0.3 and 0.7 and 2-card pods are equally popular.
    binpack stacks both 0.3s on one card, so the 0.7s land on two different nodes and the closing
    2-card pod finds no node; frag pairs 0.3 with 0.7 and keeps one node whole."""
    mix = ShapeMix(((Shape(1, 700), 1 / 3), (Shape(1, 300), 1 / 3), (Shape(2, 1000), 1 / 3)))
    nodes = [node(f"n{i}", gpu(f"n{i}", 0, total=1000), gpu(f"n{i}", 1, total=1000)) for i in range(2)]
    outcomes = {}
    for policy in ("binpack", "frag"):
        s = PlacementSettings(default_policy=policy)
        index = build_index(Snapshot(tuple(nodes)), s, mix)
        for mib in (300, 300, 700, 700):
            d = place(ask(mib), index, {}, s)
            assert d.node is not None
            chosen = index.nodes[d.node]
            gpus = tuple(
                Gpu(g.uuid, g.index, g.model, 1000, memory_promised_mib=g.memory_promised_mib + mib, pods=g.pods + 1)
                if g.uuid == d.devices[0].uuid
                else g
                for g in chosen.gpus
            )
            index.update_node(Node(chosen.name, gpus))
        outcomes[policy] = place(ask(1000, count=2), index, {}, s).fits
    assert outcomes == {"binpack": False, "frag": True}


def fleet(size: int, used_gib: int = 0) -> list[Node]:
    """`size` distinct nodes (used memory differs per node) of two 16 GiB cards."""
    return [
        node(f"n{i:05d}", gpu(f"n{i}", 0, memory_promised_mib=used_gib * GIB + i % 512, pods=1), gpu(f"n{i}", 1))
        for i in range(size)
    ]


def test_nodes_checked_stay_bounded_when_the_cluster_grows_tenfold() -> None:
    s = PlacementSettings()
    checked = []
    for size in (50, 500):
        index = build_index(Snapshot(tuple(fleet(size))), s)
        for policy in ("binpack", "spread"):
            assert place(ask(node_policy=policy), index, {}, s).fits
        checked.append(index.evaluations)
    assert checked[1] <= 2 * checked[0] + 8  # best-first: the same handful, not 10x the nodes


def test_overlay_moves_a_node_up_for_binpack_and_down_for_spread() -> None:
    nodes = fleet(20)
    s = PlacementSettings()
    index = build_index(Snapshot(tuple(nodes)), s)
    quiet = "n00003"
    reserved = {"n3-gpu0": DeviceUsage(memory_mib=6 * GIB, cores=20, pods=2)}
    assert place(ask(node_policy="binpack"), index, {}, s).node != quiet
    assert place(ask(node_policy="binpack"), index, reserved, s).node == quiet
    least = place(ask(node_policy="spread"), index, {}, s).node
    assert least is not None
    squeeze = {f"{index.nodes[least].gpus[0].uuid}": DeviceUsage(memory_mib=GIB, pods=1)}
    assert place(ask(node_policy="spread"), index, squeeze, s).node != least
    full = {g.uuid: DeviceUsage(memory_mib=16 * GIB, pods=1) for n in nodes for g in n.gpus if n.name != "n00011"}
    assert place(ask(node_policy="spread"), index, full, s).node == "n00011"  # the only room left


def test_max_nodes_scored_bounds_the_search_and_zero_means_all() -> None:
    # Every node but the last lacks host CPU, which no bucket can see: only checking finds it.
    nodes = [node(f"n{i:03d}", gpu(f"n{i}", 0), cpu_milli_free=0 if i < 30 else 8000) for i in range(31)]
    request = ask(cpu_milli=1000)
    assert not decide(nodes, request, max_nodes_scored=10).fits
    assert decide(nodes, request, max_nodes_scored=10).filtered == {"host-resources": 10}
    assert decide(nodes, request, max_nodes_scored=0).node == "n030"
    assert decide(nodes, request).node == "n030"  # adaptive: at least 100 nodes


def test_deny_counts_every_node_and_names_the_closest() -> None:
    nodes = [*fleet(40, used_gib=14), node("sick", gpu("s", 0, healthy=False))]
    d = decide(nodes, ask(10 * GIB, count=2))
    assert not d.fits
    assert sum(d.filtered.values()) == len(nodes)
    assert d.rejected and all("needs" in v.reason or "unhealthy" in v.reason for v in d.rejected)
    assert d.rejected[0].node.startswith("n")  # came closer (memory stage) than the unhealthy node
