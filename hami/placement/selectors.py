"""The pod's own node constraints: `nodeSelector` and required node affinity, as kube-scheduler reads them.

The webhook writes a node affinity of its own into the pod; it must choose a node the pod's own
constraints allow, or the pod would stay Pending forever. Pure functions over plain mappings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

HOSTNAME_LABEL = "kubernetes.io/hostname"


def node_labels(name: str, labels: Mapping[str, str]) -> dict[str, str]:
    """The labels selectors see: the node's own plus the hostname label the kubelet always sets."""
    merged = dict(labels)
    merged.setdefault(HOSTNAME_LABEL, name)
    return merged


def _as_int(value: str) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def expression_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One `matchExpressions` entry (In, NotIn, Exists, DoesNotExist, Gt, Lt); unknown operators never match."""
    key = expression.get("key")
    operator = expression.get("operator")
    values = expression.get("values") or ()
    if not isinstance(key, str):
        return False
    present = key in labels
    value = labels.get(key)
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        mine, bound = _as_int(value or ""), _as_int(str(values[0]))
        if mine is None or bound is None:
            return False
        return mine > bound if operator == "Gt" else mine < bound
    return False


def term_matches(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A nodeSelectorTerm: all its matchExpressions hold (matchFields on metadata.name included).

    An empty term matches nothing, as in kube-scheduler.
    """
    expressions: Sequence[Any] = term.get("matchExpressions") or ()
    fields: Sequence[Any] = term.get("matchFields") or ()
    if not expressions and not fields:
        return False
    for expression in expressions:
        if not isinstance(expression, Mapping) or not expression_matches(expression, labels):
            return False
    for expression in fields:
        # matchFields only supports metadata.name; the hostname label carries the node name here.
        if not isinstance(expression, Mapping) or expression.get("key") != "metadata.name":
            return False
        renamed = {**expression, "key": HOSTNAME_LABEL}
        if not expression_matches(renamed, labels):
            return False
    return True


def required_terms(affinity: Mapping[str, Any]) -> Sequence[Mapping[str, Any]] | None:
    """The required nodeSelectorTerms, or None when the pod has no required node affinity."""
    node_affinity = affinity.get("nodeAffinity")
    if not isinstance(node_affinity, Mapping):
        return None
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(required, Mapping):
        return None
    terms = required.get("nodeSelectorTerms")
    if not isinstance(terms, Sequence):
        return None
    return [t for t in terms if isinstance(t, Mapping)]


def selector_allows(
    node_selector: Mapping[str, str], affinity: Mapping[str, Any], labels: Mapping[str, str]
) -> tuple[bool, str]:
    """Whether the pod may run on a node with `labels` (hostname included); the reason when not."""
    for key, wanted in node_selector.items():
        if labels.get(key) != wanted:
            return False, f"nodeSelector {key}={wanted} does not match"
    terms = required_terms(affinity)
    if terms is not None and not any(term_matches(term, labels) for term in terms):
        return False, "required node affinity does not match"
    return True, ""


def mentions_hostname(node_selector: Mapping[str, str], affinity: Mapping[str, Any]) -> bool:
    """True when the constraints name nodes individually (so nodes cannot be judged by class)."""
    if HOSTNAME_LABEL in node_selector:
        return True
    for term in required_terms(affinity) or ():
        for expression in term.get("matchExpressions") or ():
            if isinstance(expression, Mapping) and expression.get("key") == HOSTNAME_LABEL:
                return True
        if term.get("matchFields"):
            return True
    return False
