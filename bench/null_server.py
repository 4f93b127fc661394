"""The null webhook: the same TLS, event loop and JSON stack as hami-webhook, and no decision.

Answers every AdmissionReview with allowed=true after parsing it with orjson, so the benchmark's
ratio isolates what the webhook's own work costs.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hami import certs
from hami.tls import make_context


async def admit(request: web.Request) -> web.Response:
    review = orjson.loads(await request.read())
    answer = {
        "apiVersion": review["apiVersion"],
        "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], "allowed": True},
    }
    return web.Response(body=orjson.dumps(answer), content_type="application/json")


async def ready(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def main(listen: str, state_dir: str) -> None:
    paths = certs.ensure_self_signed(state_dir, certs.service_sans("hami-webhook", "hami-system"))
    app = web.Application()
    app.router.add_post("/validate", admit)
    app.router.add_post("/mutate", admit)
    app.router.add_get("/readyz", ready)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, _, port = listen.rpartition(":")
    await web.TCPSite(runner, host, int(port), ssl_context=make_context(paths.cert, paths.key)).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="127.0.0.1:9443")
    parser.add_argument("--state-dir", default=".state-null")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.run(main(args.listen, args.state_dir))
    except ImportError:
        asyncio.run(main(args.listen, args.state_dir))
