"""The simulated backend: the shipped inventory, determinism, faults and lazy fleets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from hami.node.backend import Backend, BackendError
from hami.node.curves import SpecError
from hami.node.faults import FaultState, parse_scheduled
from hami.node.schema import parse_status
from hami.node.simspec import parse_specs
from hami.node.simulated import SimClock, SimulatedNode, generate_fleet, load_fleet

CLUSTER = Path(__file__).resolve().parent.parent / "config" / "sim" / "cluster.yaml"


def _frozen(t: float) -> SimClock:
    return SimClock(frozen_at=t)


def _node(doc: dict[str, object], seed: int = 0, t: float = 0.0) -> SimulatedNode:
    (spec,) = parse_specs({"nodes": {"n1": doc}})
    return SimulatedNode(spec, seed=seed, clock=_frozen(t))


def test_shipped_inventory_has_mixed_cards_and_the_unaccounted_process() -> None:
    fleet = load_fleet(CLUSTER)
    assert len(fleet) >= 3
    models = {g.model for node in fleet.values() for g in node.sample(0).gpus}
    assert len(models) >= 3
    # The opening incident: a card nothing was promised on, 90% full per "NVML".
    t4 = [g for g in fleet["gpu-b"].sample(0).gpus if g.processes]
    assert t4 and t4[0].memory_used_mib >= 0.9 * t4[0].memory_total_mib
    assert t4[0].memory_used_mib == sum(p.used_memory_mib for p in t4[0].processes)


def test_simulated_nodes_implement_backend_and_their_documents_parse() -> None:
    for node in load_fleet(CLUSTER).values():
        assert isinstance(node, Backend)
        status = node.sample(12.5)
        assert parse_status(status.to_json()) == status
        for gpu in status.gpus:
            assert gpu.memory_used_mib + gpu.memory_free_mib == gpu.memory_total_mib
            assert 0 <= (gpu.utilisation_gpu or 0) <= 100


def _readings(seed: int, t: float) -> list[tuple[object, ...]]:
    fleet = load_fleet(CLUSTER, seed=seed, clock=_frozen(t))
    return [(g.uuid, g.utilisation_gpu, g.temperature_c, g.power_w) for n in fleet.values() for g in n.sample(t).gpus]


def test_same_seed_same_time_same_readings_and_another_seed_differs() -> None:
    assert _readings(7, 30.0) == _readings(7, 30.0)
    assert _readings(7, 30.0) != _readings(8, 30.0)


def test_uuids_do_not_depend_on_the_seed_and_are_unique() -> None:
    uuids = [r[0] for r in _readings(1, 0)]
    assert uuids == [r[0] for r in _readings(2, 0)]
    assert len(set(uuids)) == len(uuids)


def test_jitter_changes_between_periods_but_not_within_one() -> None:
    node = _node({"gpus": [{"model": "X", "memory_total_mib": 100, "utilisation_gpu": 50}]})
    assert node.sample(3.1).gpus[0].utilisation_gpu == node.sample(3.9).gpus[0].utilisation_gpu
    assert len({node.sample(t).gpus[0].utilisation_gpu for t in range(10)}) > 1


def test_count_expands_cards_and_power_follows_utilisation_without_a_curve() -> None:
    doc = {"jitter": {"power_w": 0, "utilisation": 0}, "gpus": []}
    doc["gpus"] = [
        {"model": "X", "memory_total_mib": 100, "count": 3, "utilisation_gpu": 0, "power_limit_w": 100},
        {"model": "X", "memory_total_mib": 100, "utilisation_gpu": 100, "power_limit_w": 100},
    ]
    gpus = _node(doc).sample(0).gpus
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[0].power_w is not None and gpus[3].power_w is not None
    assert gpus[0].power_w < gpus[3].power_w <= 100


def test_scheduled_ecc_fault_appears_at_its_time_on_its_card_and_makes_it_unhealthy() -> None:
    doc = {
        "gpus": [{"model": "X", "memory_total_mib": 100, "count": 2}],
        "faults": [{"at_s": 60, "gpu": 1, "ecc_uncorrected": 2}],
    }
    before = _node(doc, t=59).sample(59)
    after = _node(doc, t=60).sample(60)
    assert all(g.healthy for g in before.gpus)
    assert after.gpus[0].healthy
    assert after.gpus[1].ecc is not None and after.gpus[1].ecc.volatile_uncorrected == 2
    assert not after.gpus[1].healthy and "ECC" in after.gpus[1].health_reason


def test_temperature_spike_window_ends() -> None:
    doc = {
        "jitter": {"temperature_c": 0},
        "gpus": [{"model": "X", "memory_total_mib": 100, "temperature_c": 60}],
        "faults": [{"at_s": 10, "until_s": 20, "temp_spike_c": 35}],
    }
    node = _node(doc)
    temps = [node.sample(t).gpus[0].temperature_c for t in (5, 15, 25)]
    assert temps == [60, 95, 60]
    assert not node.sample(15).gpus[0].healthy


def test_ecc_off_means_no_counters_even_under_an_ecc_fault() -> None:
    node = _node({"gpus": [{"model": "X", "memory_total_mib": 100, "ecc": False}], "faults": [{"ecc_corrected": 5}]})
    assert node.sample(0).gpus[0].ecc is None


def test_unsupported_calls_leave_fields_absent_and_are_listed() -> None:
    node = _node({"gpus": [{"model": "X", "memory_total_mib": 100, "power_limit_w": 70}]})
    node.faults.apply({"unsupported": ["power", "temperature"]})
    status = node.sample(0)
    gpu = status.gpus[0]
    assert gpu.power_w is None and gpu.temperature_c is None and gpu.utilisation_gpu is not None
    assert sorted(status.errors) == ["gpu0.power: Not Supported", "gpu0.temperature: Not Supported"]


def test_runtime_faults_merge_and_clear() -> None:
    state = FaultState()
    state.apply({"slow_s": 2})
    state.apply({"ecc_uncorrected": 3, "gpu": 0})
    assert (state.runtime.slow_s, state.runtime.ecc_uncorrected) == (2.0, 3)
    state.apply({"clear": True, "hang": True})
    assert state.runtime.slow_s == 0 and state.runtime.hang
    state.apply({"clear": True})
    assert state.active(0) == ()


@pytest.mark.parametrize("doc", [{"bogus": 1}, {"slow_s": -1}, {"hang": "yes"}, {"unsupported": ["fan"]}])
def test_bad_runtime_faults_are_refused(doc: dict[str, object]) -> None:
    with pytest.raises(SpecError):
        FaultState().apply(doc)


def test_scheduled_fault_window_defaults_to_forever() -> None:
    fault = parse_scheduled({"at_s": 5, "nvml_error": True}, "f")
    state = FaultState((fault,))
    assert state.active(4) == () and state.active(1e9) == (fault.faults,)


async def test_read_fails_under_nvml_error_and_recovers_when_cleared() -> None:
    node = _node({"gpus": [{"model": "X", "memory_total_mib": 100}]})
    node.faults.apply({"nvml_error": True})
    with pytest.raises(BackendError):
        await node.read()
    node.faults.apply({"clear": True})
    assert (await node.read()).node == "n1"


async def test_a_hung_read_finishes_once_the_hang_is_cleared() -> None:
    node = _node({"gpus": [{"model": "X", "memory_total_mib": 100}]})
    node.faults.apply({"hang": True})
    read = asyncio.ensure_future(node.read())
    done, _ = await asyncio.wait({read}, timeout=0.3)
    assert not done
    node.faults.apply({"clear": True})
    status = await asyncio.wait_for(read, timeout=5)
    assert status.gpus


def test_generated_fleet_is_lazy_and_names_are_stable(tmp_path: Path) -> None:
    fleet = generate_fleet(CLUSTER, 10_000, seed=1)
    assert len(fleet) == 10_000
    assert not fleet._built  # nothing exists before it is asked for
    names = list(fleet)
    assert names[0] == "node-00000" and names[-1] == "node-09999" and len(set(names)) == 10_000
    node = fleet["node-01234"]
    assert fleet["node-01234"] is node  # built once, so its runtime faults persist
    assert len(fleet._built) == 1
    assert node.sample(0).node == "node-01234"
    assert "node-10000" not in fleet and "gpu-a" not in fleet
    with pytest.raises(KeyError):
        fleet["node-10000"]
    # Templates are cycled: node i has the cards of template node i mod len(templates).
    templates = list(load_fleet(CLUSTER).values())
    assert len(fleet["node-00001"].sample(0).gpus) == len(templates[1].sample(0).gpus)


def test_bad_simulation_files_are_refused_naming_the_place(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"nodes": {"n1": {"gpus": [{"model": "X", "memory_total_mib": 0}]}}}))
    with pytest.raises(SpecError, match=r"nodes\.n1\.gpus\[0\]\.memory_total_mib"):
        load_fleet(bad)
    bad.write_text("nodes: [")
    with pytest.raises(SpecError, match=r"bad\.yaml"):
        load_fleet(bad)
