"""The values validation works with: modes, findings, violations and the request's context.

Rules produce `Finding`s (what is wrong, where, with which figures) and know nothing of modes or
languages; the engine turns them into `Violation`s (mode applied, message rendered). Keeping the two
apart lets the same rule output be shown as a long denial line or a short warning, in English or
Chinese, and lets UPDATE handling compare findings of the old and new object by key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from hami.state.model import NamespaceUsage

__all__ = ["Finding", "Mode", "NamespaceUsage", "ValidationContext", "Violation"]


class Mode(StrEnum):
    """What a rule does when it fires."""

    ENFORCE = "enforce"  # deny the request
    WARN = "warn"  # allow, with a warning shown to the kubectl user
    AUDIT = "audit"  # allow silently; the server logs and counts it
    OFF = "off"  # rule not evaluated


@dataclass(frozen=True, slots=True)
class ValidationContext:
    """Everything about the request that is not the object itself."""

    operation: str  # CREATE | UPDATE (DELETE and CONNECT are never validated)
    namespace: str
    user: str = ""
    groups: tuple[str, ...] = ()
    largest_card_mib: int = 0  # from the live snapshot; 0 = unknown -> settings fallback
    # The namespace's live GPU usage, excluding this object.
    usage: NamespaceUsage = field(default_factory=NamespaceUsage)
    old_object: Mapping[str, Any] | None = None  # UPDATE only


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a rule found wrong, before mode and language are applied.

    `key` selects the message in the catalogue, `params` fills it. `container` is the container's
    name (None for pod-level findings); `path` the dotted field path from the object's root.
    """

    rule: str
    key: str
    path: str
    container: str | None = None
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Violation:
    """A finding with its mode and its messages in the configured language.

    `message` is the long form used in denials and logs (names the object, container, field, limit
    and fix); `warning` the short form (< 120 characters) sent as an admission warning.
    """

    rule: str
    mode: Mode
    path: str
    message: str
    warning: str = ""
