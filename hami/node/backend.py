"""What agent.py reads GPU state from: NVML on a real node, or a simulated node.

The collector (hami/state) may also hold backends directly, in-process, when no agents are
configured; that is why the contract is this small protocol and not an HTTP client.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from hami.node.schema import NodeStatus


class BackendError(Exception):
    """A whole read failed (NVML error, injected fault); nothing about the node can be trusted."""


class NoDriverError(BackendError):
    """NVML cannot be used on this machine at all (no library, driver not loaded)."""


@runtime_checkable
class Backend(Protocol):
    node_name: str

    async def read(self) -> NodeStatus:
        """One fresh read of the node. May raise BackendError; simulated faults may make it slow or hang."""
        ...
