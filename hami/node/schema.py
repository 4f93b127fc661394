"""The agent's `GET /status` document: defined once, written by agent.py, read by the collector.

Versioned by the `schema` field. A reader accepts any document of the same major version and
ignores fields it does not know, so agents and webhooks can be upgraded independently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA = "hami.io/node-status/v1"


class StatusError(ValueError):
    """A /status document that does not follow the schema; the message names the field."""


@dataclass(frozen=True, slots=True)
class EccCounts:
    volatile_corrected: int = 0
    volatile_uncorrected: int = 0
    aggregate_corrected: int = 0
    aggregate_uncorrected: int = 0


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    pid: int
    used_memory_mib: int


@dataclass(frozen=True, slots=True)
class GpuStatus:
    uuid: str
    index: int
    model: str
    memory_total_mib: int
    memory_used_mib: int
    memory_free_mib: int
    utilisation_gpu: float | None = None  # percent, NVML's own sample (Prometheus is preferred)
    utilisation_memory: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    ecc: EccCounts | None = None  # None when ECC is off or not supported
    processes: tuple[ProcessUsage, ...] = ()
    healthy: bool = True
    health_reason: str = ""


@dataclass(frozen=True, slots=True)
class NodeStatus:
    node: str
    observed_at: float  # unix seconds of the NVML read this document reports
    backend: str  # "nvml" | "simulated"
    gpus: tuple[GpuStatus, ...]
    driver_version: str = ""
    errors: tuple[str, ...] = field(default=())  # NVML calls that failed in the last read
    schema: str = SCHEMA

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _get(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    if key not in doc or doc[key] is None:
        if default is ...:
            raise StatusError(f"{where}.{key} is missing")
        return default
    value = doc[key]
    if isinstance(value, bool) and kind is not bool and not (isinstance(kind, tuple) and bool in kind):
        raise StatusError(f"{where}.{key} must be {kind}, got a boolean")
    if not isinstance(value, kind):
        raise StatusError(f"{where}.{key} must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    return value


_NUM = (int, float)
_SEQ = (list, tuple)  # JSON arrays, or tuples when a document did not go through JSON


def _gpu(doc: Any, where: str) -> GpuStatus:
    if not isinstance(doc, Mapping):
        raise StatusError(f"{where} must be an object")
    ecc_doc = doc.get("ecc")
    ecc = None
    if isinstance(ecc_doc, Mapping):
        ecc = EccCounts(**{k: int(_get(ecc_doc, k, int, f"{where}.ecc", 0)) for k in EccCounts.__dataclass_fields__})
    processes = tuple(
        ProcessUsage(
            int(_get(p, "pid", int, f"{where}.processes[{i}]")),
            int(_get(p, "used_memory_mib", _NUM, f"{where}.processes[{i}]")),
        )
        for i, p in enumerate(_get(doc, "processes", _SEQ, where, []))
        if isinstance(p, Mapping)
    )

    def optional(key: str) -> float | None:
        value = _get(doc, key, _NUM, where, None)
        return None if value is None else float(value)

    return GpuStatus(
        uuid=_get(doc, "uuid", str, where),
        index=int(_get(doc, "index", int, where)),
        model=_get(doc, "model", str, where),
        memory_total_mib=int(_get(doc, "memory_total_mib", _NUM, where)),
        memory_used_mib=int(_get(doc, "memory_used_mib", _NUM, where)),
        memory_free_mib=int(_get(doc, "memory_free_mib", _NUM, where)),
        utilisation_gpu=optional("utilisation_gpu"),
        utilisation_memory=optional("utilisation_memory"),
        temperature_c=optional("temperature_c"),
        power_w=optional("power_w"),
        power_limit_w=optional("power_limit_w"),
        ecc=ecc,
        processes=processes,
        healthy=bool(_get(doc, "healthy", bool, where, True)),
        health_reason=_get(doc, "health_reason", str, where, ""),
    )


def parse_status(doc: Any) -> NodeStatus:
    """Validate and read a /status document. Raises StatusError naming the first bad field."""
    if not isinstance(doc, Mapping):
        raise StatusError("status must be a JSON object")
    schema = _get(doc, "schema", str, "status")
    if schema.rsplit("/", 1)[0] != SCHEMA.rsplit("/", 1)[0] or not schema.endswith("/v1"):
        raise StatusError(f"status.schema {schema!r} is not {SCHEMA!r}")
    gpus = _get(doc, "gpus", _SEQ, "status")
    return NodeStatus(
        node=_get(doc, "node", str, "status"),
        observed_at=float(_get(doc, "observed_at", _NUM, "status")),
        backend=_get(doc, "backend", str, "status", "unknown"),
        gpus=tuple(_gpu(g, f"status.gpus[{i}]") for i, g in enumerate(gpus)),
        driver_version=_get(doc, "driver_version", str, "status", ""),
        errors=tuple(str(e) for e in _get(doc, "errors", _SEQ, "status", [])),
        schema=schema,
    )
