"""validate(): exemptions, the rules over every pod template, modes, UPDATE handling, messages."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from fnmatch import fnmatchcase
from typing import Any

from hami.validation.gpu import gpu_count_findings, slicing_findings
from hami.validation.host import host_findings
from hami.validation.messages import render
from hami.validation.model import Finding, Mode, ValidationContext, Violation
from hami.validation.quota import quota_findings, usage_of
from hami.validation.resources import overcommit_findings, read_template
from hami.validation.settings import ValidationSettings
from hami.workloads import PodTemplate, pod_templates


@functools.lru_cache(maxsize=8192)
def _matches(value: str, patterns: tuple[str, ...]) -> bool:
    # Namespaces, users and groups repeat: remember the verdict instead of re-running fnmatch.
    return any(fnmatchcase(value, pattern) for pattern in patterns)


def is_exempt(ctx: ValidationContext, settings: ValidationSettings) -> bool:
    """Exempt namespaces, users and groups are never validated (so a broken webhook can be repaired)."""
    return (
        _matches(ctx.namespace, settings.exempt_namespaces)
        or (bool(ctx.user) and _matches(ctx.user, settings.exempt_users))
        or any(_matches(group, settings.exempt_groups) for group in ctx.groups)
    )


def opted_out(template: PodTemplate, settings: ValidationSettings) -> bool:
    return bool(settings.opt_out_label) and template.labels.get(settings.opt_out_label) == settings.opt_out_value


_NATIVE_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})


def clean_parts(template: PodTemplate) -> tuple[bool, bool]:
    """(host-clean, native resources only). Host-clean: nothing host-level, no security context that
    widens anything, no hostPath, so no host-escape rule can fire. Native resources only: no container
    names a resource beyond CPU, memory and ephemeral storage, so no GPU rule can fire either. Anything
    unusual answers False and gets the rules."""
    spec = template.spec
    host = not (spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"))  # unrolled: per admission
    native = True
    context = spec.get("securityContext")
    if context and not (type(context) is dict and "windowsOptions" not in context):
        host = False
    volumes = spec.get("volumes")
    if volumes and any(type(v) is not dict or "hostPath" in v for v in volumes):
        host = False
    for _, _, container in template.container_list:
        if host:
            context = container.get("securityContext")
            if context and not (
                type(context) is dict
                and not context.get("privileged")
                and "windowsOptions" not in context
                and not (context.get("capabilities") or {}).get("add")
            ):
                host = False
        if native:
            resources = container.get("resources")
            if resources:
                if type(resources) is not dict:
                    native = False
                else:
                    for section in resources.values():
                        if section and not (type(section) is dict and _NATIVE_RESOURCES.issuperset(section)):
                            native = False
                            break
        if not (host or native):
            break
    return host, native


def trivially_clean(template: PodTemplate) -> bool:
    """True when no rule can fire (see `clean_parts`): most pods of a cluster, answered for a
    fraction of running every rule."""
    host, native = clean_parts(template)
    return host and native


def template_findings(
    template: PodTemplate, ctx: ValidationContext, settings: ValidationSettings, count_quota: bool
) -> Iterator[Finding]:
    """Every finding of every rule for one pod template, whatever the modes (the caller filters)."""
    host_clean, native = clean_parts(template)
    if host_clean and native:
        return
    namespace = template.namespace or ctx.namespace
    if not host_clean:  # a GPU pod with nothing host-level skips the host-escape rules
        yield from host_findings(template, settings.extra_runtime_sockets)
    gpus, malformed = read_template(template, settings.resources)
    yield from malformed
    yield from overcommit_findings(template)
    yield from gpu_count_findings(gpus, settings.gpu_cap(namespace), namespace, template.path)
    card = ctx.largest_card_mib or settings.largest_card_mib_fallback
    for gpu in gpus:
        yield from slicing_findings(gpu, card, settings.memory_granularity_mib)
    asking = [g for g in gpus if g.devices > 0]
    quota = settings.quota(namespace)
    if asking and quota.bounded:  # no cap, no finding: the pod's usage is not even counted
        used = ctx.usage if count_quota else None
        yield from quota_findings(usage_of(gpus, card), used, quota, namespace, f"{asking[0].path}.resources")


Located = tuple[PodTemplate, Finding]


def _findings(
    templates: list[PodTemplate], ctx: ValidationContext, settings: ValidationSettings, count_quota: bool
) -> list[Located]:
    found: list[Located] = []
    for template in templates:
        skip = frozenset(settings.opt_out_rules) if opted_out(template, settings) else frozenset()
        found.extend(
            (template, f) for f in template_findings(template, ctx, settings, count_quota) if f.rule not in skip
        )
    return found


def _key(located: Located) -> tuple[str, str, str]:
    finding = located[1]
    return finding.rule, finding.key, finding.path


def _is_deleting(obj: Mapping[str, Any]) -> bool:
    metadata = obj.get("metadata")
    return isinstance(metadata, Mapping) and bool(metadata.get("deletionTimestamp"))


def _update_findings(
    obj: Mapping[str, Any], templates: list[PodTemplate], ctx: ValidationContext, settings: ValidationSettings
) -> list[Located]:
    """On UPDATE only what the update brings is judged.

    An object being deleted is never refused (its finalizers must be removable). A controller whose pod
    template is unchanged (scaling, labels, the deployment controller scaling down an old ReplicaSet)
    starts no new kind of pod, so nothing is re-judged; a changed template is validated whole, since new
    pods roll out from it. A Pod's spec is mostly immutable: only findings absent from the old object
    (above all ephemeral containers from `kubectl debug --profile=sysadmin`) count, and quotas are not
    recounted.
    """
    if _is_deleting(obj):
        return []
    old = ctx.old_object
    new_findings = _findings(templates, ctx, settings, count_quota=False)
    if old is None:
        return new_findings
    try:
        old_templates = pod_templates(old, ctx.namespace)
    except ValueError:
        return new_findings  # an unreadable old object grandfathers nothing
    if obj.get("kind") != "Pod":
        unchanged = [(t.metadata, t.spec) for t in templates] == [(t.metadata, t.spec) for t in old_templates]
        return [] if unchanged else new_findings
    old_keys = {_key(f) for f in _findings(old_templates, ctx, settings, count_quota=False)}
    return [f for f in new_findings if _key(f) not in old_keys]


def validate(
    obj: Mapping[str, Any], templates: list[PodTemplate], ctx: ValidationContext, settings: ValidationSettings
) -> list[Violation]:
    """Every violation of the object's pod templates, in rule modes other than off.

    `templates` is `hami.workloads.pod_templates(obj, namespace)`. Never raises for a malformed value in
    a GPU field (that is a violation with its path); WorkloadError from a mis-shaped object propagates.
    """
    if ctx.operation not in ("CREATE", "UPDATE") or not templates or is_exempt(ctx, settings):
        return []
    if ctx.operation == "UPDATE":
        findings = _update_findings(obj, templates, ctx, settings)
    else:
        # Only a bare Pod counts against the live usage; a controller's template has no replicas yet.
        findings = _findings(templates, ctx, settings, count_quota=obj.get("kind") == "Pod")
    violations: list[Violation] = []
    for template, finding in findings:
        mode = settings.mode(finding.rule)
        if mode is Mode.OFF:
            continue
        violations.append(
            render(finding, mode, template.kind, template.namespace or ctx.namespace, template.name, settings.language)
        )
    return violations
