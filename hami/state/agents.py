"""Reading node agents: the HTTP client of `GET /status`, and the translation of a NodeStatus into a Node.

Any object with `node_name` and `async read() -> NodeStatus` is a status source: an `HttpAgent`
here, or a backend of `hami.node` read in-process (the embedded simulated inventory). The
collector applies the timeout and the circuit breaker around `read()`, so a source may be slow
or hang; it only has to raise when it fails (`AgentError` here, `BackendError` in-process).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Protocol

import aiohttp
import orjson

from hami.node.schema import NodeStatus, StatusError, parse_status
from hami.state.model import DeviceUsage, Freshness, Gpu, Node


class StatusSource(Protocol):
    """What the collector reads a node's state from (same shape as hami.node.backend.Backend)."""

    node_name: str

    async def read(self) -> NodeStatus: ...


class AgentError(Exception):
    """A failed agent read; `reason` is a short label for metrics (connect, http_503, schema ...)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class HttpAgent:
    """`GET <url>` of one node agent (or of one node behind a fleet agent) over a shared session."""

    def __init__(self, node_name: str, url: str, session: aiohttp.ClientSession) -> None:
        self.node_name = node_name
        self.url = url
        self._session = session

    async def read(self) -> NodeStatus:
        try:
            async with self._session.get(self.url) as response:
                body = await response.read()
                if response.status != 200:
                    raise AgentError(f"http_{response.status}", body[:200].decode(errors="replace"))
        except aiohttp.ClientError as exc:
            raise AgentError("connect", str(exc)) from exc
        try:
            return parse_status(orjson.loads(body))
        except (orjson.JSONDecodeError, StatusError) as exc:
            raise AgentError("schema", str(exc)) from exc


def status_url(base_url: str) -> str:
    """An agent's /status URL from its base URL (a full .../status URL is kept as it is)."""
    base = base_url.rstrip("/")
    return base if base.endswith("/status") else f"{base}/status"


def fleet_status_url(fleet_url: str, node: str) -> str:
    return f"{fleet_url.rstrip('/')}/nodes/{node}/status"


def error_reason(exc: BaseException) -> str:
    """A metric label for why a read failed; low cardinality on purpose."""
    if isinstance(exc, AgentError):
        return exc.reason
    if isinstance(exc, TimeoutError):
        return "timeout"
    if type(exc).__name__ == "CircuitBreakerError":
        return "breaker_open"
    if type(exc).__name__ == "BackendError":
        return "backend"
    return "error"


NO_USAGE = DeviceUsage()  # one shared instance: runs for every device of every node each sweep


def node_from_status(
    status: NodeStatus,
    *,
    allocations: Mapping[str, DeviceUsage],
    utilisation: Mapping[str, float] | None,
    labels: Mapping[str, str] | None = None,
    name: str | None = None,
) -> Node:
    """A fresh Node from an agent's answer, the pods' allocations and Prometheus' utilisation.

    `utilisation` None means no Prometheus is configured: the agent's own NVML sample is used.
    A device missing from a Prometheus answer has unknown utilisation (None), not 0: a device
    that was never scraped must not look idle. `name` overrides the name the agent reported (the
    inventory's name for the node is the one placement uses).
    """
    gpus = []
    for g in status.gpus:
        usage = allocations.get(g.uuid, NO_USAGE)
        util = g.utilisation_gpu if utilisation is None else utilisation.get(g.uuid)
        gpus.append(
            Gpu(
                uuid=g.uuid,
                index=g.index,
                model=g.model,
                memory_total_mib=g.memory_total_mib,
                memory_used_mib=g.memory_used_mib,
                memory_promised_mib=usage.memory_mib,
                cores_promised=usage.cores,
                pods=usage.pods,
                utilisation=util,
                temperature_c=g.temperature_c,
                ecc_uncorrected=None if g.ecc is None else g.ecc.volatile_uncorrected,
                healthy=g.healthy,
                workload_types=usage.workload_types,
            )
        )
    return Node(
        name=status.node if name is None else name,
        gpus=tuple(gpus),
        labels=MappingProxyType(dict(labels or {})),
        freshness=Freshness.FRESH,
        observed_at=status.observed_at,
        reason="; ".join(status.errors),
    )
