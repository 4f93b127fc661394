"""What the agent writes on the wire: the /status JSON and the Prometheus text."""

from __future__ import annotations

import orjson
from prometheus_client.parser import text_string_to_metric_families

from hami.node.cache import ReadStats
from hami.node.metrics import render
from hami.node.schema import EccCounts, GpuStatus, NodeStatus, ProcessUsage, parse_status

STATUS = NodeStatus(
    node='odd"node\\',
    observed_at=1.5,
    backend="nvml",
    gpus=(
        GpuStatus(
            uuid="GPU-1",
            index=0,
            model='Weird "card"\\\nname',
            memory_total_mib=100,
            memory_used_mib=40,
            memory_free_mib=60,
            utilisation_gpu=12.5,
            temperature_c=50.0,
            ecc=EccCounts(1, 2, 3, 4),
            processes=(ProcessUsage(7, 40),),
        ),
        GpuStatus(uuid="GPU-2", index=1, model="Plain", memory_total_mib=10, memory_used_mib=0, memory_free_mib=10),
    ),
    errors=("gpu1.power: Not Supported",),
)


def test_the_wire_json_is_exactly_to_json() -> None:
    assert orjson.dumps(STATUS) == orjson.dumps(STATUS.to_json())
    assert parse_status(orjson.loads(orjson.dumps(STATUS))) == STATUS


def _samples(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def test_label_values_survive_escaping() -> None:
    samples = _samples(render(STATUS.node, STATUS, ReadStats()))
    labels = {lab["gpu"]: lab for lab, _ in samples["DCGM_FI_DEV_FB_USED"]}
    assert labels["0"]["modelName"] == STATUS.gpus[0].model
    assert labels["0"]["Hostname"] == STATUS.node


def test_absent_fields_are_absent_series_not_zeros() -> None:
    samples = _samples(render(STATUS.node, STATUS, ReadStats()))
    assert [lab["gpu"] for lab, _ in samples["DCGM_FI_DEV_GPU_TEMP"]] == ["0"]
    assert [lab["gpu"] for lab, _ in samples["DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"]] == ["0"]
    assert samples["DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"][0][1] == 4
    assert "DCGM_FI_DEV_POWER_USAGE" not in samples
    assert len(samples["DCGM_FI_DEV_FB_FREE"]) == 2


def test_a_failed_read_exposes_only_the_agent_series() -> None:
    stats = ReadStats(reads=3, read_errors=2, call_errors=5)
    samples = _samples(render("n1", None, stats))
    assert not any(name.startswith("DCGM_") for name in samples)
    errors = {lab["kind"]: value for lab, value in samples["hami_agent_read_errors_total"]}
    assert errors == {"read": 2, "call": 5}
    assert samples["hami_agent_reads_total"][0][1] == 3
    assert samples["hami_agent_read_ok"][0][1] == 0
