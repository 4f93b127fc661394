"""The aiohttp application: routes, the admission handler, TLS listener and background loops.

Thin on purpose: bytes in -> `decode_review` -> `Decider.decide` -> `encode_review` -> bytes out.
Every failure mode maps to a defined answer: 400 for a bad body, `on_internal_error` for a bug.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hami import certs
from hami.admission import ReviewError, Verdict, decode_review, encode_review
from hami.config import Config
from hami.decide import Decider, Outcome
from hami.gc_policy import LongLivedGc
from hami.observability import (
    ACTIVE_CONNECTIONS,
    ADMISSIONS,
    BAD_REQUESTS,
    INTERNAL_ERRORS,
    flush_logs,
    get_logger,
)
from hami.runtime import Runtime
from hami.tls import ReloadingTls

log = get_logger("hami.server")
LOG_FLUSH_S = 0.25  # decision log lines reach stdout at most this late
DECIDER_KEY = web.AppKey("decider", Decider)
RUNTIME_KEY = web.AppKey("runtime", Runtime)


def _bad_request(endpoint: str, error: ReviewError) -> web.Response:
    BAD_REQUESTS.labels(endpoint=endpoint).inc()
    return web.Response(status=400, body=orjson.dumps(error.to_json()), content_type="application/json")


def _internal_error_verdict(runtime: Runtime) -> Verdict:
    if runtime.config.server.on_internal_error == "allow":
        return Verdict(allowed=True, warnings=("hami-webhook: internal error, admitted per on_internal_error=allow",))
    return Verdict(
        allowed=False,
        code=500,
        reason="InternalError",
        message="hami-webhook could not decide (internal error; see the webhook's log). Retry, or ask the "
        "cluster admins: on_internal_error=deny refuses rather than admitting unchecked pods.",
    )


def make_admission_handler(
    endpoint: str, runtime: Runtime, decider: Decider
) -> Callable[[web.Request], Awaitable[web.Response]]:
    with_patch = endpoint == "mutate"

    async def handle(request: web.Request) -> web.Response:
        try:
            # server.max_body_bytes is the app's client_max_size (a restart setting, not reloaded):
            # aiohttp stops reading and raises as soon as a body passes it.
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            limit = runtime.config.server.max_body_bytes
            return _bad_request(endpoint, ReviewError(f"body exceeds {limit} bytes"))
        started = time.perf_counter()
        try:
            review = decode_review(body)
        except ReviewError as exc:
            return _bad_request(endpoint, exc)
        try:
            outcome = await decider.decide(review, endpoint)
        except ReviewError as exc:
            # The envelope was fine but the object inside is not shaped like its kind.
            return _bad_request(endpoint, exc)
        except Exception as exc:  # the client must never see a traceback; the log gets it
            INTERNAL_ERRORS.labels(endpoint=endpoint).inc()
            log.exception("admission_internal_error", uid=review.uid, endpoint=endpoint, error=repr(exc))
            outcome = Outcome(_internal_error_verdict(runtime), result="error", fields={})
        answer = encode_review(review.api_version, review.uid, outcome.verdict, with_patch=with_patch)
        elapsed = time.perf_counter() - started
        ADMISSIONS.observe(endpoint, review.operation, review.kind, outcome.result, elapsed)
        decider.log_decision(review, endpoint, outcome, elapsed)
        return web.Response(body=answer, content_type="application/json")

    return handle


async def healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def readyz(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME_KEY]
    ready, detail = runtime.readiness()
    return web.json_response({"ready": ready, **detail}, status=200 if ready else 503, dumps=_dumps)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


async def metrics(_: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_app(runtime: Runtime) -> web.Application:
    app = web.Application(client_max_size=runtime.config.server.max_body_bytes)
    app[RUNTIME_KEY] = runtime
    app[DECIDER_KEY] = decider = Decider(runtime)
    app.router.add_post("/mutate", make_admission_handler("mutate", runtime, decider))
    app.router.add_post("/validate", make_admission_handler("validate", runtime, decider))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


def tls_for(config: Config) -> ReloadingTls:
    """Configured certificate files, or self-generated ones in the state dir."""
    if config.tls.cert_file:
        return ReloadingTls(Path(config.tls.cert_file), Path(config.tls.key_file), config.tls.client_ca)
    names = certs.service_sans(config.tls.service_name, config.tls.service_namespace, config.tls.extra_sans)
    paths = certs.ensure_self_signed(config.server.state_dir, names)
    return ReloadingTls(paths.cert, paths.key, config.tls.client_ca)


async def _poll(interval: Callable[[], float], action: Callable[[], Any], what: str) -> None:
    while True:
        await asyncio.sleep(interval())
        try:
            result = action()
            if asyncio.iscoroutine(result):
                await result
        except Exception as exc:  # a poll loop must outlive any single failure
            log.warning("poll_failed", what=what, error=repr(exc))


class WebhookServer:
    """Owns the listener, the background loops and the runtime's lifecycle."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.tls = tls_for(runtime.config)
        self.app = make_app(runtime)
        self.runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=runtime.config.server.shutdown_grace_s)
        self._tasks: list[asyncio.Task[None]] = []
        self.port = 0
        self.gc = LongLivedGc(runtime.config.server.gc_unfreeze_s)
        runtime.on_index_updated.append(self.gc.settled)

    async def start(self) -> None:
        await self.runtime.start()
        await self.runner.setup()
        server = self.runner.server
        if server is not None:
            ACTIVE_CONNECTIONS.set_function(lambda: len(server.connections))
        host, _, port = self.runtime.config.server.listen.rpartition(":")
        site = web.TCPSite(self.runner, host.strip("[]"), int(port), ssl_context=self.tls.listener, backlog=1024)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []  # the real port when 0 was asked
        self.port = sockets[0].getsockname()[1] if sockets else int(port)
        poll_s = lambda: self.runtime.config.server.config_poll_s  # noqa: E731 - re-read: it may be reloaded
        self._tasks.append(asyncio.create_task(_poll(poll_s, self.tls.maybe_reload, "certificate")))
        self._tasks.append(asyncio.create_task(_poll(poll_s, self.runtime.maybe_reload_config, "config")))
        self._tasks.append(asyncio.create_task(_poll(lambda: LOG_FLUSH_S, flush_logs, "log flush")))
        log.info("serving", listen=f"{host}:{self.port}", cert=str(self.tls.cert_file))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.runner.cleanup()
        await self.runtime.stop()
        self.gc.close()
        flush_logs()
