"""The decision for one admission: validation, then (on /mutate, for GPU pods) placement.

Both endpoints run the same validation, so a mutating-only install still refuses what it must.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hami.admission import ALLOW, AdmissionRequest, ReviewError, Verdict
from hami.observability import get_logger
from hami.runtime import Runtime
from hami.workloads import WorkloadError, object_name, pod_templates

log = get_logger("hami.decision")


@dataclass(frozen=True, slots=True)
class Outcome:
    verdict: Verdict
    result: str  # allowed | denied | warned | patched | error
    fields: dict[str, Any] = field(default_factory=dict)  # extra fields for the decision log line


UNTOUCHED = Outcome(ALLOW, "allowed", {"skipped": "not handled"})


class Decider:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def decide(self, request: AdmissionRequest, endpoint: str) -> Outcome:
        if request.operation not in ("CREATE", "UPDATE") or request.object is None:
            return UNTOUCHED  # DELETE and CONNECT pass untouched
        try:
            templates = pod_templates(request.object, request.namespace)
            for template in templates:
                template.containers()  # shape check: every container list and entry well-formed
        except WorkloadError as exc:
            raise ReviewError(f"request.object: {exc}", "request.object") from None
        if not templates:
            return UNTOUCHED
        return Outcome(ALLOW, "allowed")

    def log_decision(self, request: AdmissionRequest, endpoint: str, outcome: Outcome, elapsed: float) -> None:
        obj = request.object or request.old_object or {}
        patch_paths = [op.get("path") for op in outcome.verdict.patch] if endpoint == "mutate" else []
        log.info(
            "admission",
            uid=request.uid,
            endpoint=endpoint,
            kind=request.kind,
            namespace=request.namespace or (obj.get("metadata") or {}).get("namespace", ""),
            name=request.name or object_name(obj),
            operation=request.operation,
            dry_run=request.dry_run,
            user=request.user.username,
            result=outcome.result,
            reason=outcome.verdict.message or None,
            warnings=list(outcome.verdict.warnings) or None,
            patch_paths=patch_paths or None,
            duration_ms=round(elapsed * 1000, 3),
            **outcome.fields,
        )
