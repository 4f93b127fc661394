"""The agent's HTTP face (aiohttp): /status, /metrics, /healthz and /faults, for one node or a fleet.

Single-node mode serves them at the root. Fleet mode (many simulated nodes in one process, for
scale tests and drills) serves them under /nodes/{name}/ and lists the nodes at /nodes. Each
node gets its read cache on first request: nothing per node runs in the background.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from hami.node.backend import Backend, BackendError
from hami.node.cache import CachedReader
from hami.node.curves import SpecError
from hami.node.faults import FaultState
from hami.node.metrics import CONTENT_TYPE, render


class Agent:
    """The nodes served and their read caches, created on first use."""

    def __init__(self, backends: Mapping[str, Backend], interval_s: float) -> None:
        self.backends = backends
        self.interval_s = interval_s
        self.started_at = time.time()
        self._readers: dict[str, CachedReader] = {}

    def reader(self, name: str) -> CachedReader | None:
        found = self._readers.get(name)
        if found is None:
            try:
                backend = self.backends[name]
            except KeyError:
                return None
            found = self._readers[name] = CachedReader(backend, self.interval_s)
        return found


AGENT = web.AppKey("agent", Agent)
SINGLE = web.AppKey("single", str)  # the node name in single-node mode


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json")


def _reader(request: web.Request) -> tuple[str, CachedReader]:
    app = request.app
    name = request.match_info.get("name") or app[SINGLE]
    reader = app[AGENT].reader(name)
    if reader is None:
        raise web.HTTPNotFound(body=orjson.dumps({"error": f"no node {name!r}"}), content_type="application/json")
    return name, reader


async def status(request: web.Request) -> web.Response:
    name, reader = _reader(request)
    try:
        node_status = await reader.status()
    except BackendError as exc:
        return _json({"error": str(exc), "node": name}, status=503)
    # orjson serialises the frozen dataclasses natively, byte for byte as NodeStatus.to_json()
    # would (tests/test_agent_encoding.py holds it to that) and ~7x faster than asdict().
    return web.Response(body=orjson.dumps(node_status), content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    name, reader = _reader(request)
    try:
        node_status = await reader.status()
    except BackendError:
        node_status = None  # the scrape still succeeds: it carries the error counters
    return web.Response(body=render(name, node_status, reader.stats), headers={"Content-Type": CONTENT_TYPE})


def _fault_state(reader: CachedReader) -> FaultState:
    state = getattr(reader.backend, "faults", None)
    if not isinstance(state, FaultState):
        raise web.HTTPNotFound(
            body=orjson.dumps({"error": "fault injection needs a simulated backend (--simulate)"}),
            content_type="application/json",
        )
    return state


async def get_faults(request: web.Request) -> web.Response:
    name, reader = _reader(request)
    return _json({"node": name, "runtime": _fault_state(reader).runtime.to_json()})


async def post_faults(request: web.Request) -> web.Response:
    name, reader = _reader(request)
    state = _fault_state(reader)
    try:
        body = orjson.loads(await request.read())
        if not isinstance(body, dict):
            raise SpecError("the body must be a JSON object")
        runtime = state.apply(body)
    except (orjson.JSONDecodeError, SpecError) as exc:
        return _json({"error": str(exc)}, status=400)
    # A drill expects its fault on the very next request, not up to one interval later.
    reader.invalidate()
    return _json({"node": name, "runtime": runtime.to_json()})


async def healthz(request: web.Request) -> web.Response:
    # Liveness of the process only: a hung or failing backend shows in /status and /metrics,
    # and restarting the agent would not mend a broken GPU.
    agent = request.app[AGENT]
    return _json({"ok": True, "nodes": len(agent.backends), "uptime_s": round(time.time() - agent.started_at, 3)})


async def list_nodes(request: web.Request) -> web.Response:
    names = list(request.app[AGENT].backends)
    return _json({"count": len(names), "nodes": names})


def make_agent_app(backends: Mapping[str, Backend], *, fleet: bool, interval_s: float = 1.0) -> web.Application:
    """The agent's application. Without `fleet`, `backends` must hold exactly one node."""
    if not fleet and len(backends) != 1:
        raise ValueError(f"single-node mode serves exactly one backend, got {len(backends)}")
    app = web.Application()
    app[AGENT] = Agent(backends, interval_s)
    app.router.add_get("/healthz", healthz)
    if fleet:
        app[SINGLE] = ""
        app.router.add_get("/nodes", list_nodes)
        prefix = "/nodes/{name}"
    else:
        app[SINGLE] = next(iter(backends))
        prefix = ""
    app.router.add_get(f"{prefix}/status", status)
    app.router.add_get(f"{prefix}/metrics", metrics)
    app.router.add_get(f"{prefix}/faults", get_faults)
    app.router.add_post(f"{prefix}/faults", post_faults)
    return app
