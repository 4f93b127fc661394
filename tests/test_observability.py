"""The decision log: one JSON line per admission, batched to stdout, errors at once."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import structlog

from hami import observability
from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent


class Sink(io.BytesIO):
    flushes = 0

    def flush(self) -> None:
        self.flushes += 1


def test_lines_are_batched_and_errors_go_out_at_once() -> None:
    raw = Sink()
    buffer = observability.LineBuffer(raw, limit=200)
    observability.LOG_SINK = buffer
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            observability._urgent_errors,
            structlog.processors.JSONRenderer(serializer=observability._orjson_dumps),
        ],
        logger_factory=structlog.BytesLoggerFactory(buffer),
        cache_logger_on_first_use=False,
    )
    try:
        log = structlog.get_logger("t")
        log.info("admission", uid="a")
        log.info("admission", uid="b")
        assert raw.getvalue() == b""  # gathered, not written
        log.error("boom", uid="c")
        lines = raw.getvalue().splitlines()
        assert [json.loads(line)["event"] for line in lines] == ["admission", "admission", "boom"]
        for i in range(10):  # the size limit drains without a tick
            log.info("admission", uid=f"x{i}")
        assert len(raw.getvalue().splitlines()) > 3
        observability.flush_logs()
        assert len(raw.getvalue().splitlines()) == 13
    finally:
        observability.LOG_SINK = None
        structlog.reset_defaults()


def test_served_decisions_reach_stdout_within_the_flush_tick(tmp_path: Path) -> None:
    import ssl
    import urllib.request

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "hami_webhook.py"),
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "log-1",
                "operation": "CREATE",
                "namespace": "default",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "object": {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}},
            },
        }
        deadline = time.monotonic() + 30
        while True:
            try:
                request = urllib.request.Request(
                    f"https://127.0.0.1:{port}/validate",
                    json.dumps(review).encode(),
                    {"Content-Type": "application/json"},
                )
                urllib.request.urlopen(request, context=context, timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        seen = b""
        deadline = time.monotonic() + 3
        while b'"log-1"' not in seen and time.monotonic() < deadline:
            seen += proc.stdout.read() or b""
            time.sleep(0.05)
        line = next(json.loads(x) for x in seen.splitlines() if b'"log-1"' in x)
        assert line["event"] == "admission" and line["result"] == "allowed" and "duration_ms" in line
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
