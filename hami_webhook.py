#!/usr/bin/env python3
"""hami-webhook: validating + mutating admission webhook for GPU pods.

serve    run the webhook (HTTPS) on its config
certs    write a CA and serving certificate for a cluster install, print the caBundle
review   explain offline what the webhook would do with manifests
drill    run the failure drills against simulated agents
config   print the effective configuration
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

import yaml


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    server: dict[str, Any] = {}
    if getattr(args, "listen", None):
        server["listen"] = args.listen
    if getattr(args, "state_dir", None):
        server["state_dir"] = args.state_dir
    return {"server": server} if server else {}


def _load_config(args: argparse.Namespace) -> Any:
    from hami import config
    from hami.settings_loader import SettingsError

    try:
        return config.load(args.config, overrides=_overrides(args))
    except SettingsError as exc:
        print(f"hami-webhook: invalid configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


async def _serve(args: argparse.Namespace) -> None:
    from hami.observability import configure_logging
    from hami.runtime_factory import build_runtime
    from hami.server import WebhookServer

    cfg = _load_config(args)
    configure_logging(cfg.logging.level, cfg.logging.format)
    server = WebhookServer(build_runtime(cfg, args.config, _overrides(args)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await server.start()
    print(f"hami-webhook serving https://{cfg.server.listen.rpartition(':')[0]}:{server.port}", file=sys.stderr)
    try:
        await stop.wait()
    finally:
        await server.stop()


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # uvloop is optional (e.g. on Windows)
        return asyncio.run(coro)
    return uvloop.run(coro)


def cmd_serve(args: argparse.Namespace) -> int:
    _run(_serve(args))
    return 0


def cmd_certs(args: argparse.Namespace) -> int:
    from hami import certs

    names = certs.service_sans(args.service, args.namespace, tuple(args.san or ()))
    paths = certs.write_bundle(args.out, names)
    print(f"wrote {paths.ca}, {paths.cert}, {paths.key} for {', '.join(names)}", file=sys.stderr)
    print(certs.ca_bundle_b64(paths.ca))
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from hami.config_doc import documented_yaml, reference_table
    from hami.settings_loader import to_plain

    cfg = _load_config(args)
    if args.documented:
        print(documented_yaml(cfg), end="")
    elif args.reference:
        print(reference_table(cfg))
    else:
        print(yaml.safe_dump(to_plain(cfg), sort_keys=False), end="")
    return 0


def cmd_review(args: argparse.Namespace) -> int:
    from hami.review import run_review

    cfg = _load_config(args)
    return run_review(cfg, args.files, output=args.output, state_file=args.state, namespace=args.namespace)


def cmd_snapshot(args: argparse.Namespace) -> int:
    from hami.state.snapshot_io import save
    from hami.state_once import first_snapshot

    save(_run(first_snapshot(_load_config(args))), args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def cmd_drill(args: argparse.Namespace) -> int:
    from hami.drill import main as drill_main

    return int(drill_main(args.rest) or 0)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="hami_webhook.py", description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", help="YAML config file (default: embedded defaults, see config/webhook.yaml)")
        return p

    serve = with_config(sub.add_parser("serve", help="run the webhook"))
    serve.add_argument("--listen", help="HOST:PORT (default 127.0.0.1:8443)")
    serve.add_argument("--state-dir", help="where self-generated certificates live (default .state)")
    serve.set_defaults(func=cmd_serve)

    certs_p = sub.add_parser("certs", help="write ca.pem, tls.crt, tls.key and print the caBundle")
    certs_p.add_argument("--service", default="hami-webhook")
    certs_p.add_argument("--namespace", default="hami-system")
    certs_p.add_argument("--out", required=True)
    certs_p.add_argument("--san", action="append", help="extra DNS name or IP (repeatable)")
    certs_p.set_defaults(func=cmd_certs)

    review = with_config(sub.add_parser("review", help="explain what the webhook would do with manifests"))
    review.add_argument("files", nargs="+", help="YAML files (multi-document), '-' for stdin")
    review.add_argument("--output", choices=("text", "json"), default="text")
    review.add_argument("--state", help="a saved snapshot (JSON) instead of the configured state sources")
    review.add_argument("--namespace", default="default", help="namespace for objects that name none")
    review.set_defaults(func=cmd_review)

    snap = with_config(sub.add_parser("snapshot", help="save the current GPU state (for review --state)"))
    snap.add_argument("--out", required=True)
    snap.set_defaults(func=cmd_snapshot)

    drill = sub.add_parser("drill", help="failure drills (see docs/runbook.md)", add_help=False)
    drill.add_argument("rest", nargs=argparse.REMAINDER)
    drill.set_defaults(func=cmd_drill)

    dump = with_config(sub.add_parser("config", help="print the effective configuration"))
    dump.add_argument(
        "--documented", action="store_true", help="as YAML with every key's comment (config/webhook.yaml)"
    )
    dump.add_argument("--reference", action="store_true", help="as a Markdown table (the README's reference)")
    dump.set_defaults(func=cmd_config)
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["drill"]:  # argparse's REMAINDER cannot start with an option: hand over as is
        from hami.drill import main as drill_main

        return int(drill_main(argv[1:]) or 0)
    args = parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
