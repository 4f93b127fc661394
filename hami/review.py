"""`hami_webhook.py review`: what the webhook would do with manifests, offline, like `kyverno apply`.

Every object goes through the same decision code as `/mutate` (validation, then placement for
Pods) against the configured state sources (by default the embedded simulated inventory) or a
saved snapshot. Objects are admitted in file order with an in-process ledger, so the pods of one
manifest compete for capacity as they would when applied together. Exit code 1 when anything is
denied, 2 when an input cannot be read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

import orjson
import yaml

from hami.admission import ReviewError, decode_review
from hami.config import Config
from hami.decide import Decider, Outcome
from hami.runtime import Runtime
from hami.state import snapshot_io
from hami.state.model import Snapshot


class SnapshotRuntime(Runtime):
    """A runtime over a fixed, saved snapshot: no collector, no agents, no network."""

    def __init__(self, config: Config, snapshot: Snapshot) -> None:
        super().__init__(config)
        self._fixed = snapshot
        self.apply_snapshot(snapshot)

    @property
    def snapshot(self) -> Snapshot:
        return self._fixed

    async def start(self) -> None:
        return None

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return True, {"snapshot_version": self._fixed.version}


def read_objects(paths: Iterable[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(source, object) for every document of every file; `kind: List` is unpacked."""
    for path in paths:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        for number, doc in enumerate(yaml.safe_load_all(text), 1):
            if doc is None:
                continue
            if not isinstance(doc, dict):
                raise ReviewError(f"{path}: document {number} is not a mapping")
            items = doc.get("items") if doc.get("kind", "").endswith("List") else [doc]
            for item in items or []:
                if isinstance(item, dict):
                    yield f"{path}#{number}", item


def _review_for(obj: dict[str, Any], namespace: str) -> bytes:
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    group, _, version = str(obj.get("apiVersion", "v1")).rpartition("/")
    kind = str(obj.get("kind", ""))
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": group, "version": version, "kind": kind},
                "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
                "name": metadata.get("name", ""),
                "namespace": metadata.get("namespace") or namespace,
                "operation": "CREATE",
                "userInfo": {"username": "hami-review", "groups": ["system:authenticated"]},
                "object": obj,
                "dryRun": False,
            },
        }
    )


def entry(obj: dict[str, Any], namespace: str, outcome: Outcome) -> dict[str, Any]:
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    verdict = outcome.verdict
    return {
        "kind": obj.get("kind", ""),
        "namespace": metadata.get("namespace") or namespace,
        "name": metadata.get("name") or (metadata.get("generateName", "") + "*"),
        "allowed": verdict.allowed,
        "result": outcome.result,
        "message": verdict.message,
        "warnings": list(verdict.warnings),
        "violations": outcome.fields.get("violations", []),
        "patch": [dict(op) for op in verdict.patch] if verdict.allowed else [],
        "decision": outcome.fields.get("decision"),
        "placement": outcome.fields.get("placement"),
    }


def render_text(item: dict[str, Any], out: TextIO) -> None:
    verdict = "ALLOWED" if item["allowed"] else "DENIED"
    out.write(f"{item['kind']} {item['namespace']}/{item['name']}: {verdict} ({item['result']})\n")
    if item["message"]:
        for line in item["message"].splitlines():
            out.write(f"  {line}\n")
    for warning in item["warnings"]:
        out.write(f"  warning: {warning}\n")
    decision = item.get("decision")
    if decision:
        out.write(
            f"  placement: node={decision.get('node')} devices={','.join(decision.get('devices') or []) or '-'} "
            f"policy={decision.get('policy')} score={decision.get('score')} considered={decision.get('considered')}\n"
        )
        if decision.get("filtered"):
            out.write(f"  filtered: {', '.join(f'{k}={v}' for k, v in decision['filtered'].items())}\n")
        for candidate in decision.get("candidates") or []:
            out.write(f"  candidate {candidate}\n")
    elif item.get("placement"):
        out.write(f"  placement: {item['placement']}\n")
    for op in item["patch"]:
        value = orjson.dumps(op.get("value")).decode() if "value" in op else ""
        out.write(f"  patch: {op['op']} {op['path']} {value[:160]}\n")


async def _review(config: Config, paths: list[str], namespace: str, state_file: str | None) -> list[dict[str, Any]]:
    # Offline: never touch a shared Redis ledger (a review must not reserve real capacity).
    config = dataclasses.replace(config, state=dataclasses.replace(config.state, redis_url=""))
    runtime: Runtime
    if state_file:
        runtime = SnapshotRuntime(config, snapshot_io.load(state_file))
    else:
        runtime = Runtime(config)
        await runtime.start()
    try:
        if runtime.state is not None:
            await runtime.state.collector.wait_ready(10.0)
            runtime.apply_snapshot(runtime.snapshot)  # no waiting for the background index update
        decider = Decider(runtime)
        results = []
        for _, obj in read_objects(paths):
            request = decode_review(_review_for(obj, namespace))
            try:
                outcome = await decider.decide(request, "mutate")
            except ReviewError as exc:
                results.append(
                    {
                        "kind": obj.get("kind", ""),
                        "namespace": request.namespace,
                        "name": request.name,
                        "allowed": False,
                        "result": "invalid",
                        "message": str(exc),
                        "warnings": [],
                        "violations": [],
                        "patch": [],
                        "decision": None,
                        "placement": None,
                    }
                )
                continue
            results.append(entry(obj, request.namespace, outcome))
        return results
    finally:
        await runtime.stop()


def run_review(
    config: Config,
    paths: list[str],
    *,
    output: str = "text",
    state_file: str | None = None,
    namespace: str = "default",
    out: TextIO = sys.stdout,
) -> int:
    from hami.observability import configure_logging

    configure_logging("error", "console")  # the decision log would drown the report
    try:
        results = asyncio.run(_review(config, paths, namespace, state_file))
    except (OSError, yaml.YAMLError, ReviewError, snapshot_io.SnapshotFormatError) as exc:
        print(f"hami-webhook review: {exc}", file=sys.stderr)
        return 2
    if output == "json":
        out.write(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        for item in results:
            render_text(item, out)
        denied = sum(not r["allowed"] for r in results)
        out.write(f"{len(results)} objects: {len(results) - denied} allowed, {denied} denied\n")
    return 1 if any(not r["allowed"] for r in results) else 0
