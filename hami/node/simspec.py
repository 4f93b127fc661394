"""The simulation file: nodes, their cards, and how each card's readings move over time.

Format (see config/sim/cluster.yaml for a full example)::

    driver_version: "550.54.15"          # optional, per file or per node
    jitter: {utilisation: 2, temperature_c: 0.5, power_w: 3, period_s: 1}
    nodes:
      gpu-b:
        gpus:
          - model: Tesla T4
            memory_total_mib: 15360
            count: 2                     # expands to identical cards
            utilisation_gpu: {sine: {mean: 40, amplitude: 20, period_s: 60}}
            temperature_c: 55
            processes: [{pid: 4242, used_memory_mib: 13824}]   # memory used defaults to their sum
        faults:
          - {at_s: 120, gpu: 1, ecc_uncorrected: 2}
          - {at_s: 300, until_s: 330, hang: true}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from hami.node.curves import Constant, Curve, SpecError, parse_curve
from hami.node.faults import ScheduledFault, parse_scheduled
from hami.node.schema import ProcessUsage

DEFAULT_DRIVER = "550.54.15"


@dataclass(frozen=True, slots=True)
class Jitter:
    """Seeded noise added on top of the curves, so identical cards do not read identically."""

    utilisation: float = 2.0  # +- percent points on both utilisations
    temperature_c: float = 0.5  # +- degrees
    power_w: float = 3.0  # +- watts
    period_s: float = 1.0  # a new draw every period of simulated time


@dataclass(frozen=True, slots=True)
class GpuSpec:
    model: str
    memory_total_mib: int
    utilisation_gpu: Curve
    utilisation_memory: Curve
    temperature_c: Curve
    memory_used_mib: Curve | None = None  # None: the sum of `processes`
    processes: tuple[ProcessUsage, ...] = ()
    power_w: Curve | None = None  # None: derived from utilisation and the power limit
    power_limit_w: float | None = None
    ecc: bool = True  # False: ECC off, the counters are absent
    uuid: str = ""  # "" : derived from the node name and the index (stable across seeds)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: tuple[GpuSpec, ...]
    driver_version: str = DEFAULT_DRIVER
    faults: tuple[ScheduledFault, ...] = ()
    jitter: Jitter = Jitter()


_GPU_KEYS = frozenset(
    {
        "model",
        "memory_total_mib",
        "memory_used_mib",
        "processes",
        "utilisation_gpu",
        "utilisation_memory",
        "temperature_c",
        "power_w",
        "power_limit_w",
        "ecc",
        "uuid",
        "count",
    }
)


def _mapping(doc: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise SpecError(f"{where} must be a mapping, got {type(doc).__name__}")
    return doc


def _int(doc: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"{where}.{key} must be a whole number >= 0, got {value!r}")
    return value


def _processes(doc: Any, where: str) -> tuple[ProcessUsage, ...]:
    if not isinstance(doc, list):
        raise SpecError(f"{where} must be a list, got {doc!r}")
    found = []
    for i, p in enumerate(doc):
        at = f"{where}[{i}]"
        p = _mapping(p, at)
        found.append(ProcessUsage(pid=_int(p, "pid", at), used_memory_mib=_int(p, "used_memory_mib", at)))
    return tuple(found)


def _gpus(doc: Mapping[str, Any], where: str) -> list[GpuSpec]:
    unknown = set(doc) - _GPU_KEYS
    if unknown:
        raise SpecError(f"{where}: unknown keys {sorted(unknown)}")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise SpecError(f"{where}.model must be a non-empty string")
    total = _int(doc, "memory_total_mib", where)
    if total == 0:
        raise SpecError(f"{where}.memory_total_mib must be > 0")
    power_limit = doc.get("power_limit_w")
    if power_limit is not None and (isinstance(power_limit, bool) or not isinstance(power_limit, int | float)):
        raise SpecError(f"{where}.power_limit_w must be a number, got {power_limit!r}")
    ecc = doc.get("ecc", True)
    if not isinstance(ecc, bool):
        raise SpecError(f"{where}.ecc must be true or false, got {ecc!r}")
    count = _int(doc, "count", where, 1)
    uuid = doc.get("uuid", "")
    if not isinstance(uuid, str) or (uuid and count != 1):
        raise SpecError(f"{where}.uuid must be a string, and only on a card with count 1")

    def curve(key: str, default: float) -> Curve:
        return parse_curve(doc[key], f"{where}.{key}") if key in doc else Constant(default)

    def optional_curve(key: str) -> Curve | None:
        return parse_curve(doc[key], f"{where}.{key}") if key in doc else None

    spec = GpuSpec(
        model=model,
        memory_total_mib=total,
        memory_used_mib=optional_curve("memory_used_mib"),
        processes=_processes(doc.get("processes", []), f"{where}.processes"),
        utilisation_gpu=curve("utilisation_gpu", 0.0),
        utilisation_memory=curve("utilisation_memory", 0.0),
        temperature_c=curve("temperature_c", 35.0),
        power_w=optional_curve("power_w"),
        power_limit_w=None if power_limit is None else float(power_limit),
        ecc=ecc,
        uuid=uuid,
    )
    return [spec] * count


def _jitter(doc: Any, where: str, base: Jitter) -> Jitter:
    doc = _mapping(doc, where)
    changes: dict[str, float] = {}
    for key, value in doc.items():
        if key not in Jitter.__dataclass_fields__:
            raise SpecError(f"{where}: unknown key {key!r}")
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise SpecError(f"{where}.{key} must be a number >= 0, got {value!r}")
        changes[key] = float(value)
    if changes.get("period_s", base.period_s) <= 0:
        raise SpecError(f"{where}.period_s must be > 0")
    return replace(base, **changes)


def _node(name: str, doc: Any, where: str, driver: str, jitter: Jitter) -> NodeSpec:
    doc = _mapping(doc, where)
    unknown = set(doc) - {"gpus", "faults", "driver_version", "jitter"}
    if unknown:
        raise SpecError(f"{where}: unknown keys {sorted(unknown)}")
    gpu_docs = doc.get("gpus")
    if not isinstance(gpu_docs, list) or not gpu_docs:
        raise SpecError(f"{where}.gpus must be a non-empty list")
    gpus = [g for i, d in enumerate(gpu_docs) for g in _gpus(_mapping(d, f"{where}.gpus[{i}]"), f"{where}.gpus[{i}]")]
    fault_docs = doc.get("faults", [])
    if not isinstance(fault_docs, list):
        raise SpecError(f"{where}.faults must be a list")
    return NodeSpec(
        name=name,
        gpus=tuple(gpus),
        driver_version=str(doc.get("driver_version", driver)),
        faults=tuple(parse_scheduled(f, f"{where}.faults[{i}]") for i, f in enumerate(fault_docs)),
        jitter=_jitter(doc["jitter"], f"{where}.jitter", jitter) if "jitter" in doc else jitter,
    )


def parse_specs(doc: Any, where: str = "sim") -> tuple[NodeSpec, ...]:
    """Every node of a simulation document, in file order."""
    doc = _mapping(doc, where)
    driver = str(doc.get("driver_version", DEFAULT_DRIVER))
    jitter = _jitter(doc["jitter"], f"{where}.jitter", Jitter()) if "jitter" in doc else Jitter()
    nodes = _mapping(doc.get("nodes"), f"{where}.nodes")
    if not nodes:
        raise SpecError(f"{where}.nodes must name at least one node")
    return tuple(_node(str(name), body, f"{where}.nodes.{name}", driver, jitter) for name, body in nodes.items())


def load_specs(path: str | Path) -> tuple[NodeSpec, ...]:
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: {exc}") from exc
    return parse_specs(doc, str(path))
