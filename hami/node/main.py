"""agent.py's life: settings -> backends -> aiohttp server until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Mapping

from aiohttp import web

from hami.node.agent_app import make_agent_app
from hami.node.backend import Backend, BackendError, NoDriverError
from hami.node.curves import SpecError
from hami.node.nvml import NvmlBackend
from hami.node.settings import AgentSettings
from hami.node.simulated import SimClock, generate_fleet, load_fleet

EXIT_USAGE = 2  # bad flags or simulation file
EXIT_NO_GPU = 1  # NVML unusable: no driver, no library, init failed


class UsageError(ValueError):
    """Settings that cannot be served; the message is shown as is."""


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen must be HOST:PORT, got {listen!r}")
    return host.strip("[]"), int(port)


def simulated_backends(settings: AgentSettings) -> tuple[Mapping[str, Backend], bool]:
    """(backends, fleet mode) for --simulate / --fleet-size. Raises SpecError or UsageError."""
    clock = SimClock(settings.sim_time_s if settings.sim_time_s >= 0 else None)
    nodes: Mapping[str, Backend]
    if settings.fleet_size > 0:
        template = settings.fleet_template or settings.simulate
        if not template:
            raise UsageError("--fleet-size needs --fleet-template FILE (or --simulate FILE)")
        nodes = generate_fleet(
            template,
            settings.fleet_size,
            settings.seed,
            prefix=settings.fleet_prefix,
            clock=clock,
            health=settings.health,
        )
    else:
        nodes = load_fleet(settings.simulate, settings.seed, clock=clock, health=settings.health)
    if settings.node_name:
        if settings.node_name not in nodes:
            raise UsageError(f"--node-name {settings.node_name!r} is not in the simulation")
        return {settings.node_name: nodes[settings.node_name]}, False
    return nodes, len(nodes) != 1 or settings.fleet_size > 0


def nvml_backend(settings: AgentSettings) -> NvmlBackend:
    """An initialised NVML backend. Raises NoDriverError / BackendError."""
    name = settings.node_name or os.environ.get("NODE_NAME") or socket.gethostname()
    backend = NvmlBackend(name, health=settings.health)
    backend.start()
    return backend


async def serve(app: web.Application, host: str, port: int, banner: str) -> None:
    # access_log=None: a scrape every second per node would drown the agent's own log.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        print(f"hami-agent: {banner} on http://{host}:{port}", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def _run_loop(coro: object) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)  # type: ignore[arg-type]
    else:
        uvloop.run(coro)  # type: ignore[arg-type]


def run(settings: AgentSettings) -> int:
    """Serve until a signal; the exit status. Errors are one line on stderr."""
    nvml: NvmlBackend | None = None
    try:
        host, port = parse_listen(settings.listen)
        if settings.interval_s < 0:
            raise UsageError(f"--interval must be >= 0, got {settings.interval_s}")
        if settings.simulate or settings.fleet_size > 0:
            backends, fleet = simulated_backends(settings)
            kind = "simulated"
        else:
            nvml = nvml_backend(settings)
            backends, fleet, kind = {nvml.node_name: nvml}, False, "nvml"
    except (UsageError, SpecError) as exc:
        print(f"agent.py: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (NoDriverError, BackendError) as exc:
        print(f"agent.py: error: {exc} (use --simulate FILE on a machine without GPUs)", file=sys.stderr)
        return EXIT_NO_GPU
    app = make_agent_app(backends, fleet=fleet, interval_s=settings.interval_s)
    what = f"{len(backends)} {kind} nodes (fleet)" if fleet else f"{next(iter(backends))} ({kind})"
    try:
        _run_loop(serve(app, host, port, what))
    except OSError as exc:  # e.g. the port is taken
        print(f"agent.py: error: cannot listen on {settings.listen}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if nvml is not None:
            nvml.close()
    return 0
