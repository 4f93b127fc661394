"""A Snapshot as JSON and back: `hami_webhook.py snapshot` saves one, `review --state FILE` reads it.

A saved snapshot lets a platform team replay "what would the webhook have done at 03:00" against
the cluster as it was, or review manifests in CI without any live state source.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from hami.state.model import Freshness, Gpu, Node, Snapshot

FORMAT = "hami.io/snapshot/v1"


class SnapshotFormatError(ValueError):
    """The file is not a saved snapshot; the message says which field is wrong."""


def to_json(snapshot: Snapshot) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "taken_at": snapshot.taken_at,
        "utilisation_known": snapshot.utilisation_known,
        "version": snapshot.version,
        "nodes": [
            {
                "name": n.name,
                "labels": dict(n.labels),
                "freshness": str(n.freshness),
                "observed_at": n.observed_at,
                "reason": n.reason,
                "cpu_milli_free": n.cpu_milli_free,
                "memory_mib_free": n.memory_mib_free,
                "gpus": [
                    {
                        "uuid": g.uuid,
                        "index": g.index,
                        "model": g.model,
                        "memory_total_mib": g.memory_total_mib,
                        "memory_used_mib": g.memory_used_mib,
                        "memory_promised_mib": g.memory_promised_mib,
                        "cores_promised": g.cores_promised,
                        "pods": g.pods,
                        "utilisation": g.utilisation,
                        "temperature_c": g.temperature_c,
                        "ecc_uncorrected": g.ecc_uncorrected,
                        "healthy": g.healthy,
                        "workload_types": sorted(g.workload_types),
                    }
                    for g in n.gpus
                ],
            }
            for n in snapshot.nodes
        ],
    }


def _gpu(doc: Mapping[str, Any]) -> Gpu:
    fields = dict(doc)
    fields["workload_types"] = frozenset(fields.get("workload_types") or ())
    return Gpu(**fields)


def from_json(doc: Any) -> Snapshot:
    if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
        raise SnapshotFormatError(f"not a saved snapshot (expected format {FORMAT!r})")
    try:
        nodes = tuple(
            Node(
                name=n["name"],
                gpus=tuple(_gpu(g) for g in n.get("gpus", ())),
                labels=dict(n.get("labels") or {}),
                freshness=Freshness(n.get("freshness", "fresh")),
                observed_at=float(n.get("observed_at", 0.0)),
                reason=n.get("reason", ""),
                cpu_milli_free=n.get("cpu_milli_free"),
                memory_mib_free=n.get("memory_mib_free"),
            )
            for n in doc["nodes"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotFormatError(f"bad node entry: {exc!r}") from None
    return Snapshot(
        nodes=nodes,
        taken_at=float(doc.get("taken_at", 0.0)),
        utilisation_known=bool(doc.get("utilisation_known", True)),
        version=int(doc.get("version", 1)) or 1,
    )


def save(snapshot: Snapshot, path: str | Path) -> None:
    Path(path).write_bytes(orjson.dumps(to_json(snapshot), option=orjson.OPT_INDENT_2))


def load(path: str | Path) -> Snapshot:
    try:
        return from_json(orjson.loads(Path(path).read_bytes()))
    except orjson.JSONDecodeError as exc:
        raise SnapshotFormatError(f"{path}: not JSON: {exc}") from None
