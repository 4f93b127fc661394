"""The decision log: one JSON line per admission, batched to stdout, errors at once."""

from __future__ import annotations

import datetime
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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
            observability.render_json,
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
        stamped = datetime.datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00"))
        assert abs((datetime.datetime.now(datetime.UTC) - stamped).total_seconds()) < 30
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)


def test_timestamps_are_iso_utc_with_microseconds_across_second_boundaries(monkeypatch) -> None:
    # The date-and-seconds part is cached per second: a new second must never reuse the old one.
    instants = [1796083199.999999, 1796083200.0, 1796083200.25, 1796169600.5]  # across midnight
    expected = [
        "2026-11-30T23:59:59.999999Z",
        "2026-12-01T00:00:00.000000Z",
        "2026-12-01T00:00:00.250000Z",
        "2026-12-02T00:00:00.500000Z",
    ]
    for instant, want in zip(instants, expected, strict=True):
        monkeypatch.setattr(observability.time, "time", lambda instant=instant: instant)
        assert observability.iso_utc_now() == want
        moment = datetime.datetime.fromtimestamp(instant, datetime.UTC)
        # What structlog's TimeStamper(fmt="iso", utc=True) writes, except that it drops a zero
        # microsecond part (fixed width here, so lines sort and align).
        assert moment.isoformat(timespec="microseconds").replace("+00:00", "Z") == want


def test_configured_json_log_goes_through_the_buffer_and_renders_exceptions() -> None:
    raw = Sink()
    observability.configure_logging("info", "json")
    assert observability.LOG_SINK is not None
    observability.LOG_SINK._raw = raw
    try:
        log = structlog.get_logger("t")
        log.debug("hidden")
        log.info("admission", uid="a", reason=None)
        assert raw.getvalue() == b""  # buffered until the tick
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed", uid="b")  # errors drain at once, traceback rendered as text
        lines = [json.loads(line) for line in raw.getvalue().splitlines()]
        assert [line["event"] for line in lines] == ["admission", "failed"]
        assert lines[0]["level"] == "info" and lines[0]["reason"] is None and "exc_info" not in lines[0]
        assert "ValueError: boom" in lines[1]["exception"] and lines[1]["level"] == "error"
    finally:
        observability.LOG_SINK = None
        structlog.reset_defaults()


def test_admission_metrics_count_per_label_set_and_bucket_inclusively() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    metrics = observability.AdmissionMetrics(buckets=(0.001, 0.01))
    registry = CollectorRegistry()
    registry.register(metrics)
    for seconds in (0.0005, 0.001, 0.002, 5.0):  # 0.001 is on the bound: le is inclusive
        metrics.observe("mutate", "CREATE", "Pod", "patched", seconds)
    metrics.observe("validate", "UPDATE", "Deployment", "denied", 0.02)
    text = generate_latest(registry).decode()
    assert 'hami_webhook_requests_total{endpoint="mutate",kind="Pod",operation="CREATE",result="patched"} 4.0' in text
    denied = 'endpoint="validate",kind="Deployment",operation="UPDATE",result="denied"'
    assert f"hami_webhook_requests_total{{{denied}}} 1.0" in text
    assert 'hami_webhook_request_duration_seconds_bucket{endpoint="mutate",le="0.001"} 2.0' in text
    assert 'hami_webhook_request_duration_seconds_bucket{endpoint="mutate",le="0.01"} 3.0' in text
    assert 'hami_webhook_request_duration_seconds_bucket{endpoint="mutate",le="+Inf"} 4.0' in text
    assert 'hami_webhook_request_duration_seconds_count{endpoint="mutate"} 4.0' in text
    assert 'hami_webhook_request_duration_seconds_sum{endpoint="mutate"} 5.0035' in text
    assert 'hami_webhook_request_duration_seconds_bucket{endpoint="validate",le="0.01"} 0.0' in text


def _configured_json_log(raw: io.BytesIO, level: str = "info", render_every: int = 64) -> None:
    observability.configure_logging(level, "json")
    assert observability.LOG_SINK is not None
    observability.LOG_SINK._raw = raw
    observability.LOG_SINK._render_every = render_every


def test_deferred_decision_lines_keep_their_moment_and_their_order(monkeypatch: Any) -> None:
    raw = Sink()
    _configured_json_log(raw, render_every=3)
    clock = iter([1_700_000_000.25, 1_700_000_001.5, 1_700_000_002.75, 1_700_000_003.0, 1_700_000_004.0])
    monkeypatch.setattr(observability.time, "time", lambda: next(clock))
    try:
        log = structlog.get_logger("t").bind()
        observability.defer_line(log, "admission", {"uid": "a"})  # moment .25
        observability.defer_line(log, "admission", {"uid": "b"})  # moment 1.5
        assert observability.LOG_SINK._waiting and not observability.LOG_SINK._parts  # not rendered yet
        log.info("other", uid="c")  # moment 2.75: the waiting lines are rendered before it
        observability.defer_line(log, "admission", {"uid": "d"})  # moment 3.0
        observability.flush_logs()
        lines = [json.loads(line) for line in raw.getvalue().splitlines()]
        assert [line["uid"] for line in lines] == ["a", "b", "c", "d"]
        assert [line["timestamp"] for line in lines] == [
            "2023-11-14T22:13:20.250000Z",
            "2023-11-14T22:13:21.500000Z",
            "2023-11-14T22:13:22.750000Z",
            "2023-11-14T22:13:23.000000Z",
        ]
        assert {line["level"] for line in lines} == {"info"} and lines[0]["event"] == "admission"
    finally:
        observability.LOG_SINK = None
        structlog.reset_defaults()


def test_deferred_lines_render_in_batches_and_go_out_before_an_error() -> None:
    raw = Sink()
    _configured_json_log(raw, render_every=3)
    sink = observability.LOG_SINK
    assert sink is not None
    try:
        log = structlog.get_logger("t").bind()
        for uid in ("a", "b"):
            observability.defer_line(log, "admission", {"uid": uid})
        assert len(sink._waiting) == 2 and not sink._parts
        observability.defer_line(log, "admission", {"uid": "c"})  # the third renders the batch
        assert not sink._waiting and len(sink._parts) == 3 and raw.getvalue() == b""  # rendered, still buffered
        observability.defer_line(log, "admission", {"uid": "d"})
        log.error("boom")  # an error goes out at once, after the decision waiting before it
        lines = [json.loads(line) for line in raw.getvalue().splitlines()]
        assert [line.get("uid", line["event"]) for line in lines] == ["a", "b", "c", "d", "boom"]
        observability.defer_line(log, "admission", {"uid": "e"})  # an info line after it waits again
        assert raw.getvalue().count(b"\n") == 5
    finally:
        observability.LOG_SINK = None
        structlog.reset_defaults()


def test_record_matches_the_keyword_call_and_respects_the_level() -> None:
    raw = Sink()
    _configured_json_log(raw)
    try:
        log = structlog.get_logger("t").bind(replica="r1")  # bound context reaches record lines too
        fields = {"uid": "a", "reason": None, "candidates": ["n1: full"]}
        log.record("admission", dict(fields))
        log.info("admission", **fields)
        observability.flush_logs()
        first, second = (json.loads(line) for line in raw.getvalue().splitlines())
        first.pop("timestamp"), second.pop("timestamp")
        assert first == second == {**fields, "replica": "r1", "event": "admission", "level": "info"}
    finally:
        observability.LOG_SINK = None
        structlog.reset_defaults()
    raw = Sink()
    _configured_json_log(raw, level="warning")
    try:
        log = structlog.get_logger("t").bind()
        observability.defer_line(log, "admission", {"uid": "quiet"})
        log.warning("loud")
        observability.flush_logs()
        assert [json.loads(line)["event"] for line in raw.getvalue().splitlines()] == ["loud"]
    finally:
        observability.LOG_SINK = None
        structlog.reset_defaults()


def test_without_the_buffered_sink_a_deferred_line_is_logged_at_once() -> None:
    captured: list[dict[str, Any]] = []

    def keep(_: Any, __: str, event: dict[str, Any]) -> str:
        captured.append(dict(event))
        return ""

    observability.LOG_SINK = None
    structlog.configure(processors=[keep], logger_factory=structlog.ReturnLoggerFactory())
    try:
        observability.defer_line(structlog.get_logger("t"), "admission", {"uid": "a"})  # plain structlog: no record()
        assert captured == [{"uid": "a", "event": "admission"}]
    finally:
        structlog.reset_defaults()
