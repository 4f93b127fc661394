"""What placement answers: the chosen node and devices, and enough context to explain it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

_EXPLAIN_LIMIT = 480  # the hami.io/decision annotation must stay under 500 characters

# NamedTuples, not frozen dataclasses: as immutable, and several times cheaper to build (a frozen
# dataclass sets each field through object.__setattr__), on a path every GPU admission takes.


class DeviceChoice(NamedTuple):
    container: str
    container_index: int
    uuid: str
    gpu_index: int
    model: str
    memory_mib: int
    cores: int


class NodeVerdict(NamedTuple):
    node: str
    fits: bool
    score: float
    reason: str  # why it was filtered, or why it lost


class Decision(NamedTuple):
    node: str | None
    devices: tuple[DeviceChoice, ...]
    policy: str
    score: float
    considered: int
    filtered: Mapping[str, int] = MappingProxyType({})  # read-only: the default is shared
    runners_up: tuple[NodeVerdict, ...] = ()
    rejected: tuple[NodeVerdict, ...] = ()
    stale: bool = False

    @property
    def fits(self) -> bool:
        return self.node is not None

    def explain(self) -> str:
        """One line for the decision annotation: policy, score, and why the runners-up lost."""
        if self.node is None:
            return self.deny_message()[:_EXPLAIN_LIMIT]
        text = f"policy={self.policy} node={self.node} score={self.score:.2f} considered={self.considered}"
        if self.stale:
            text += " (stale node state)"
        for verdict in self.runners_up:
            part = f"; {verdict.node}: {verdict.reason}"
            if len(text) + len(part) > _EXPLAIN_LIMIT:
                break
            text += part
        return text

    def deny_message(self) -> str:
        """Why nothing fits, best candidates first, each with its reason."""
        if not self.rejected:
            return "no node fits: no GPU node is known" if self.considered == 0 else "no node fits"
        return "no node fits: " + "; ".join(f"{v.node}: {v.reason}" for v in self.rejected)
