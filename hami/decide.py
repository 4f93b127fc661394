"""The decision for one admission: validation, then (on /mutate, for GPU pods) placement.

Both endpoints run the same validation, so a mutating-only install still refuses what it must.
Placement reads the runtime's snapshot and index (built in the background) and makes at most one
network call: the ledger reservation, bounded by its own timeout.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from hami import mutation
from hami.admission import ALLOW, AdmissionRequest, ReviewError, Verdict, deny
from hami.observability import PLACEMENT_RESULTS, POLICY_RESULTS, defer_line, get_logger
from hami.placement.decision import Decision
from hami.placement.engine import place
from hami.queue import reservation_items, usage_of
from hami.requests import GpuRequest, RequestError, gpu_request
from hami.runtime import Runtime
from hami.state.model import NamespaceUsage, ReservationItem
from hami.validation import Mode, ValidationContext, Violation, render_denial, trivially_clean, validate
from hami.workloads import PodTemplate, WorkloadError, object_name, pod_templates

log = get_logger("hami.decision")
NO_USAGE = NamespaceUsage()
RESERVE_ATTEMPTS = 5  # a refused reservation (another replica took the room) re-plans this often


class Outcome(NamedTuple):
    verdict: Verdict
    result: str  # allowed | denied | warned | patched | error
    fields: dict[str, Any]  # extra fields for the decision log line


UNTOUCHED = Outcome(ALLOW, "allowed", {"skipped": "not handled"})


def _allowed(warnings: tuple[str, ...], fields: dict[str, Any]) -> Outcome:
    if warnings:
        return Outcome(Verdict(True, warnings=warnings), "warned", fields)
    return Outcome(ALLOW, "allowed", fields)


def _reservation_key(request: AdmissionRequest, template: PodTemplate) -> str:
    """Namespace-prefixed, so quotas can count reservations; the admission uid when the pod's
    name is not chosen yet (generateName). The pod carries the key in hami.io/reservation, which
    is how the pod watch releases it once the pod is bound."""
    name = template.metadata.get("name")
    ident = name if isinstance(name, str) and name else f"uid-{request.uid}"
    return f"{template.namespace or request.namespace}/{ident}"


class Decider:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        # Bound once: the module's lazy proxy re-resolves itself on every call (logging is set up
        # before any Decider is made).
        self._log = log.bind()

    # -- entry -------------------------------------------------------------------------------
    async def decide(self, request: AdmissionRequest, endpoint: str) -> Outcome:
        if request.operation not in ("CREATE", "UPDATE") or request.object is None:
            return UNTOUCHED  # DELETE and CONNECT pass untouched
        try:
            templates = pod_templates(request.object, request.namespace)  # checks the containers' shape
        except WorkloadError as exc:
            raise ReviewError(f"request.object: {exc}", "request.object") from None
        if not templates:
            return UNTOUCHED
        if all(map(trivially_clean, templates)):
            # No rule can fire, and no container names a resource beyond CPU, memory and ephemeral
            # storage, so there is no GPU to place either: most pods of a cluster end here.
            return _allowed((), {})
        violations = self.validate(request, templates)
        outcome = await self._judge(request, endpoint, templates, violations)
        if violations:
            # Rule ids land in the API server's audit log (the point of `audit` mode) and in ours.
            audit = {"violations": ",".join(f"{v.rule}={v.mode}" for v in violations)}
            outcome.fields["violations"] = [{"rule": v.rule, "mode": str(v.mode), "path": v.path} for v in violations]
            outcome = Outcome(outcome.verdict._replace(audit_annotations=audit), outcome.result, outcome.fields)
        return outcome

    async def _judge(
        self, request: AdmissionRequest, endpoint: str, templates: list[PodTemplate], violations: list[Violation]
    ) -> Outcome:
        fields: dict[str, Any] = {}
        warnings: tuple[str, ...] = ()
        if violations:
            enforced = [v for v in violations if v.mode is Mode.ENFORCE]
            warnings = tuple(v.warning or v.message for v in violations if v.mode is Mode.WARN)
            if enforced:
                template = templates[0]
                language = self.runtime.config.validation.language
                namespace = template.namespace or request.namespace
                message = render_denial(enforced, template.kind, template.name, language, namespace=namespace)
                return Outcome(deny(message, warnings=warnings), "denied", fields)
        is_pod_create = request.kind == "Pod" and request.operation == "CREATE" and not request.sub_resource
        if endpoint == "mutate" and is_pod_create:
            try:
                ask = gpu_request(templates[0], self.runtime.config.validation.resources)
            except RequestError as exc:
                return Outcome(deny(f"cannot read the GPU request: {exc}", 400, "Invalid", warnings), "denied", fields)
            if ask is not None:  # most pods ask for no GPU: they never enter placement
                return await self.place(request, templates[0], ask, warnings, fields)
        return _allowed(warnings, fields)

    # -- validation --------------------------------------------------------------------------
    def validate(self, request: AdmissionRequest, templates: list[PodTemplate]) -> list[Violation]:
        """The templates' violations; `decide` has answered trivially clean objects already."""
        settings = self.runtime.config.validation
        namespace = templates[0].namespace or request.namespace
        # The namespace's live usage only matters against a quota; most namespaces have none.
        bounded = settings.quota(namespace).bounded
        context = ValidationContext(
            operation=request.operation,
            namespace=namespace,
            user=request.user.username,
            groups=request.user.groups,
            largest_card_mib=self.runtime.snapshot.largest_card_mib,
            usage=self.runtime.namespace_usage(namespace) if bounded else NO_USAGE,
            old_object=request.old_object,
        )
        violations = validate(request.object or {}, templates, context, settings)
        for violation in violations:
            POLICY_RESULTS.labels(violation.rule, str(violation.mode), "violation").inc()
        return violations

    # -- placement ---------------------------------------------------------------------------
    async def place(
        self,
        request: AdmissionRequest,
        template: PodTemplate,
        ask: GpuRequest,
        warnings: tuple[str, ...],
        fields: dict[str, Any],
    ) -> Outcome:
        pod = request.object or {}
        cfg = self.runtime.config
        if mutation.already_injected(template.metadata):
            fields["placement"] = "already injected"
            return Outcome(Verdict(True, warnings=warnings), "allowed", fields)
        scheduler = template.spec.get("schedulerName")
        if isinstance(scheduler, str) and scheduler in cfg.mutation.hands_off_schedulers:
            PLACEMENT_RESULTS("none", "hands_off").inc()
            fields["placement"] = f"left to {scheduler}"
            return Outcome(Verdict(True, warnings=warnings), "allowed", fields)
        node_name = template.spec.get("nodeName") if isinstance(template.spec.get("nodeName"), str) else None
        key = _reservation_key(request, template)
        decision = self._place(ask, node_name)
        attempts = 0
        maybe_written = False  # a timed-out attempt may have reserved the key all the same
        while decision.fits and not request.dry_run and cfg.mutation.placement == "pin":
            items = self._items(decision, ask)
            # Bake the pick into the index *before* awaiting the ledger, O(devices): admissions that
            # run while this one waits for Redis see it and do not all pick the same best device.
            # Undone if the ledger refuses. A key that re-reserves counts twice until the next sync.
            index, usage = self.runtime.placement_index, usage_of(items)
            index.add_usage(usage)
            self.runtime.pending[key] = usage  # kept through overlay syncs until the ledger answers
            try:
                result = await self.runtime.ledger.reserve(key, items)
            finally:
                self.runtime.pending.pop(key, None)
            if result.ok:
                break
            maybe_written = maybe_written or result.maybe_written
            if self.runtime.placement_index is index:  # a rebuilt index synced from the ledger already
                index.remove_usage(usage)
            attempts += 1
            PLACEMENT_RESULTS(decision.policy, "reserve_conflict").inc()
            if attempts >= RESERVE_ATTEMPTS:
                await self._forget(key, maybe_written)
                return Outcome(
                    deny(
                        f"GPU capacity changed while placing this pod ({result.reason}); retry",
                        409,
                        "Conflict",
                        warnings,
                    ),
                    "denied",
                    fields,
                )
            decision = self._place(ask, node_name, fresh=True)  # the ledger's overlay shows the other booking
        fields["decision"] = self._log_fields(decision)
        if not decision.fits:
            await self._forget(key, maybe_written)
            return self._no_fit(pod, ask, decision, node_name, warnings, fields)
        PLACEMENT_RESULTS(decision.policy, "placed").inc()
        if not request.dry_run:
            self.runtime.shapes.observe(decision, ask, self.runtime.snapshot)
        if cfg.mutation.placement == "shortlist":
            others = [v.node for v in decision.runners_up if v.fits][: cfg.mutation.shortlist_k - 1]
            nodes = [decision.node or "", *others]
            patch = mutation.shortlist_patch(pod, nodes, decision.explain(), cfg.mutation.topology_key)
        else:
            patch = mutation.pin_patch(pod, decision, key, cfg.mutation.topology_key)
        return Outcome(Verdict(True, warnings=warnings, patch=patch), "patched", fields)

    async def _forget(self, key: str, maybe_written: bool) -> None:
        """The pod is not placed: take back a reservation a timed-out attempt may have written."""
        if maybe_written:
            await self.runtime.ledger.release(key)

    def _place(self, ask: GpuRequest, node_name: str | None, *, fresh: bool = False) -> Decision:
        # The index carries the ledger's reservations (`applied`); catching up with expiries and
        # other replicas is O(overlay), so it runs every `overlay_sync_s` (0.1 s), or now after a refusal.
        self.runtime.sync_overlay(force=fresh)
        index = self.runtime.placement_index
        # The index's settings: the placement section with the state layer's degradation mode.
        return place(ask, index, index.applied, index.settings, node_name=node_name)

    def _items(self, decision: Decision, ask: GpuRequest) -> list[ReservationItem]:
        # The capacities come from the node state placement judged (the index's), not from a
        # snapshot that may have arrived since: the two must agree or the ledger refuses a pick
        # that placement thought fitted.
        return list(reservation_items(decision, ask, self.runtime.placement_index.node(decision.node or "")))

    def _no_fit(
        self,
        pod: dict[str, Any] | Any,
        ask: GpuRequest,
        decision: Decision,
        node_name: str | None,
        warnings: tuple[str, ...],
        fields: dict[str, Any],
    ) -> Outcome:
        cfg = self.runtime.config.mutation
        reason = decision.deny_message()
        if node_name:
            PLACEMENT_RESULTS(decision.policy, "preset_node_no_fit").inc()
            return Outcome(
                deny(f"spec.nodeName={node_name} cannot host this pod: {reason}", warnings=warnings), "denied", fields
            )
        if ask.priority >= cfg.allow_priority_at_or_above:
            PLACEMENT_RESULTS(decision.policy, "no_fit_priority").inc()
            note = f"{reason}; priority {ask.priority} left to kube-scheduler preemption"
            return Outcome(Verdict(True, warnings=warnings, patch=mutation.note_patch(pod, note)), "patched", fields)
        PLACEMENT_RESULTS(decision.policy, f"no_fit_{cfg.on_no_fit}").inc()
        if cfg.on_no_fit == "allow":
            note = f"{reason}; admitted per on_no_fit=allow, kube-scheduler decides"
            return Outcome(Verdict(True, warnings=warnings, patch=mutation.note_patch(pod, note)), "patched", fields)
        if cfg.on_no_fit == "queue":
            patch = mutation.queue_patch(pod, cfg.scheduling_gate, f"queued: {reason}")
            return Outcome(Verdict(True, warnings=warnings, patch=patch), "patched", fields)
        fix = " Fix: ask for less GPU memory or fewer GPUs, relax the type/UUID constraints, or retry later."
        return Outcome(deny(reason + "." + fix, warnings=warnings), "denied", fields)

    @staticmethod
    def _log_fields(decision: Decision) -> dict[str, Any]:
        return {
            "node": decision.node,
            "devices": [d.uuid for d in decision.devices],
            "policy": decision.policy,
            "score": round(decision.score, 3),
            "considered": decision.considered,
            "filtered": dict(decision.filtered),
            # Why the others lost (runners-up) or failed (rejected): the "why not my node?" answer.
            "candidates": [f"{v.node}: {v.reason}" for v in (*decision.runners_up, *decision.rejected)],
            "stale": decision.stale or None,
        }

    # -- log ---------------------------------------------------------------------------------
    def log_decision(self, request: AdmissionRequest, endpoint: str, outcome: Outcome, elapsed: float) -> None:
        verdict = outcome.verdict
        namespace, name = request.namespace, request.name
        if not (namespace and name):  # a pod named by generateName, or a review without namespace
            obj = request.object or request.old_object or {}
            namespace = namespace or (obj.get("metadata") or {}).get("namespace", "")
            name = name or object_name(obj)
        fields = {
            "uid": request.uid,
            "endpoint": endpoint,
            "kind": request.kind,
            "namespace": namespace,
            "name": name,
            "operation": request.operation,
            "dry_run": request.dry_run,
            "user": request.user.username,
            "result": outcome.result,
            "reason": verdict.message or None,
            "warnings": list(verdict.warnings) or None,
            "patch_paths": [op.get("path") for op in verdict.patch] if endpoint == "mutate" and verdict.patch else None,
            "duration_ms": round(elapsed * 1000, 3),
        }
        fields.update(outcome.fields)
        defer_line(self._log, "admission", fields)  # rendered in batches: see LineBuffer.defer
