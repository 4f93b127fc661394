"""Validation rules for GPU pods and pod controllers: host escape, GPU caps, vGPU slicing, tenant quota.

A pure core: `validate()` takes the admitted object, its pod templates, the request context and the
settings, and returns violations with their modes and messages. The server decides what to do with
them (deny, warn, log and count).
"""

from hami.validation.engine import is_exempt, trivially_clean, validate
from hami.validation.hostpaths import exposes_runtime_socket, normalise
from hami.validation.messages import render_denial, render_warnings
from hami.validation.model import Finding, Mode, NamespaceUsage, ValidationContext, Violation
from hami.validation.quota import pod_gpu_usage
from hami.validation.settings import (
    ALL_RULES,
    DEFAULT_RULE_MODES,
    RESOURCE_RULES,
    SECURITY_RULES,
    Quota,
    ValidationSettings,
)

__all__ = [
    "ALL_RULES",
    "DEFAULT_RULE_MODES",
    "RESOURCE_RULES",
    "SECURITY_RULES",
    "Finding",
    "Mode",
    "NamespaceUsage",
    "Quota",
    "ValidationContext",
    "ValidationSettings",
    "Violation",
    "exposes_runtime_socket",
    "is_exempt",
    "normalise",
    "pod_gpu_usage",
    "render_denial",
    "render_warnings",
    "trivially_clean",
    "validate",
]
