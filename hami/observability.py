"""Prometheus metrics of the admission path, and the structlog set-up (one JSON line per decision).

There is deliberately no per-request access log: with one decision line per admission it would
only double the log volume (and, measured, cost a large share of throughput).
"""

from __future__ import annotations

import logging
import sys
import time
from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

import orjson
import structlog
from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector as RegistryCollector
from prometheus_client.utils import floatToGoString

from hami.metric_children import Children

# 100 µs .. 1 s: admissions live in the sub-millisecond range, timeouts at seconds.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class AdmissionMetrics(RegistryCollector):
    """hami_webhook_requests_total and hami_webhook_request_duration_seconds, counted in plain ints
    and floats and turned into metric families when Prometheus scrapes.

    prometheus_client's Counter and Histogram children take a lock per increment and walk the
    buckets in Python: about 2 µs of every admission, measured. The webhook answers admissions on
    its one event-loop thread, and the scrape runs on that thread too, so no lock is needed."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self._bounds = buckets
        self._requests: dict[tuple[str, str, str, str], int] = {}
        # endpoint -> count per bucket (not cumulative; the last is +Inf), and the sum of seconds
        self._buckets: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}

    def observe(self, endpoint: str, operation: str, kind: str, result: str, seconds: float) -> None:
        key = (endpoint, operation, kind, result)
        self._requests[key] = self._requests.get(key, 0) + 1
        counts = self._buckets.get(endpoint)
        if counts is None:
            counts = self._buckets[endpoint] = [0] * (len(self._bounds) + 1)
            self._sums[endpoint] = 0.0
        counts[bisect_left(self._bounds, seconds)] += 1  # le is inclusive: the first bound >= seconds
        self._sums[endpoint] += seconds

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "hami_webhook_requests_total",
            "Admission requests answered, by endpoint, operation, kind and result "
            "(allowed, denied, warned, patched, error).",
            labels=["endpoint", "operation", "kind", "result"],
        )
        for key, count in self._requests.items():
            requests.add_metric(list(key), count)
        yield requests
        duration = HistogramMetricFamily(
            "hami_webhook_request_duration_seconds",
            "Time from request body received to answer encoded.",
            labels=["endpoint"],
        )
        for endpoint, counts in self._buckets.items():
            cumulative = list(accumulate(counts))
            edges = [*(floatToGoString(bound) for bound in self._bounds), "+Inf"]
            duration.add_metric([endpoint], list(zip(edges, cumulative, strict=True)), self._sums[endpoint])
        yield duration

    def describe(self) -> Iterator[Metric]:
        # Without describe() the registry would call collect() at registration to learn the names.
        return iter(())


ADMISSIONS = AdmissionMetrics()
REGISTRY.register(ADMISSIONS)
ACTIVE_CONNECTIONS = Gauge("hami_webhook_active_connections", "Open client connections (TLS included).")
POLICY_RESULTS = Counter(
    "hami_webhook_policy_results_total",
    "Rule outcomes: result is violation for every rule that fired, by the mode it fired in.",
    ["rule", "mode", "result"],
)
BAD_REQUESTS = Counter("hami_webhook_bad_requests_total", "Bodies answered with HTTP 400.", ["endpoint"])
INTERNAL_ERRORS = Counter(
    "hami_webhook_internal_errors_total",
    "Exceptions inside the decision code, answered per on_internal_error.",
    ["endpoint"],
)
CONFIG_RELOADS = Counter("hami_webhook_config_reloads_total", "Policy reloads from the config file.", ["result"])
CERT_RELOADS = Counter("hami_webhook_certificate_reloads_total", "Serving certificate reloads.", ["result"])
CERT_EXPIRY = Gauge(
    "hami_webhook_certificate_expiry_timestamp_seconds", "notAfter of the serving certificate, unix seconds."
)
PLACEMENTS = Counter(
    "hami_webhook_placements_total",
    "Placement outcomes for GPU pods: placed, no_fit, hands_off, preset_node, reserve_conflict.",
    ["policy", "result"],
)
PLACEMENT_RESULTS: Children[Counter] = Children(PLACEMENTS)  # PLACEMENTS' children, looked up once


class LineBuffer:
    """stdout for the JSON log, written in batches instead of once per line, and the decision lines
    waiting to be rendered.

    structlog's BytesLogger flushes after every line: one write(2) per admission, which measured as
    a large share of a plain pod's admission cost. Lines are kept until 64 KiB have gathered or the
    server's flush tick (every 0.25 s) comes, and always on shutdown and before an error line.

    Decision lines are deferred one step further (`defer`): the request keeps only the line's
    fields and the moment, and structlog renders them `render_every` at a time. Rendered in a
    batch, the processors run with warm caches; one per request, interleaved with TLS and HTTP
    work, they cost several times more (measured: 5.5 µs in a loop, about 17 µs served). A line
    that is written in between renders the waiting ones first, so the output keeps its order."""

    def __init__(self, raw: Any, limit: int = 64 * 1024, render_every: int = 64) -> None:
        self._raw = raw
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self.urgent = False  # set for the line being rendered when it is an error
        self._render_every = render_every
        self._waiting: list[tuple[Any, str, dict[str, Any], float]] = []

    def defer(self, logger: Any, event: str, fields: dict[str, Any]) -> None:
        """`logger.record(event, fields)` later, stamped with this moment."""
        self._waiting.append((logger, event, fields, time.time()))
        if len(self._waiting) >= self._render_every:
            self.render_waiting()

    def render_waiting(self) -> None:
        waiting, self._waiting = self._waiting, []  # taken first: rendering writes back into this buffer
        for logger, event, fields, moment in waiting:
            fields["timestamp"] = moment  # `stamp` formats a given moment instead of the clock
            record_line(logger, event, fields)

    def write(self, data: bytes) -> None:
        if self._waiting:  # earlier decision lines go out before this one
            urgent, self.urgent = self.urgent, False  # the urgency is this line's, not theirs
            self.render_waiting()
            self.urgent = urgent
        self._parts.append(data)
        self._size += len(data)
        if self._size >= self._limit or self.urgent:
            self.urgent = False
            self.drain()

    def flush(self) -> None:
        """Called by BytesLogger after each line: deliberately nothing (see drain)."""

    def drain(self) -> None:
        if self._waiting:
            self.render_waiting()
        if self._parts:
            data, self._parts, self._size = b"".join(self._parts), [], 0
            self._raw.write(data)
            self._raw.flush()


class BufferedLogger:
    """A structlog logger (any object with a method per level) writing rendered lines to a
    LineBuffer. structlog's BytesLogger takes a threading lock and calls flush for every line;
    the webhook logs from its one event loop thread and flushes in batches, so neither is needed."""

    def __init__(self, sink: LineBuffer) -> None:
        self._sink = sink

    def msg(self, message: bytes) -> None:
        self._sink.write(message + b"\n")

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


class BufferedLoggerFactory:
    def __init__(self, sink: LineBuffer) -> None:
        self._logger = BufferedLogger(sink)

    def __call__(self, *_: Any) -> BufferedLogger:
        return self._logger


def iso_utc_now() -> str:
    return iso_utc(time.time())


def iso_utc(moment: float) -> str:
    """ISO 8601 UTC time with microseconds, as TimeStamper(fmt="iso", utc=True) writes it (but
    always with the microseconds, fixed width), for a quarter of its cost: the date-and-seconds part
    is formatted once per second (a decision line is written for every admission)."""
    second = int(moment)
    if second != _stamp_cache[0]:
        _stamp_cache[0], _stamp_cache[1] = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    return f"{_stamp_cache[1]}.{int((moment - second) * 1e6):06d}Z"


_stamp_cache: list[Any] = [-1, ""]
# add_log_level's names: a line logged with .warn() or .exception() says warning or error.
_LEVEL_OF_METHOD = {"warn": "warning", "exception": "error"}
_URGENT_METHODS = frozenset({"error", "exception", "critical"})

LOG_SINK: LineBuffer | None = None  # the JSON log's buffer; the server drains it periodically


def flush_logs() -> None:
    if LOG_SINK is not None:
        LOG_SINK.drain()


def defer_line(logger: Any, event: str, fields: dict[str, Any]) -> None:
    """An info line from `fields`, rendered with the next batch where the JSON log is buffered
    (see LineBuffer.defer), at once otherwise (console format, tests, tools)."""
    if LOG_SINK is not None:
        LOG_SINK.defer(logger, event, fields)
    else:
        record_line(logger, event, fields)


def stamp(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    """structlog's add_log_level, TimeStamper and format_exc_info in one processor, plus urgency:
    error lines reach the output at once, with everything logged before them.

    One processor instead of four because the decision line runs the chain on every admission,
    and each processor is a Python call; format_exc_info only runs for lines carrying exc_info."""
    event["level"] = _LEVEL_OF_METHOD.get(method, method)
    moment = event.get("timestamp")  # a deferred line brings the moment it was logged
    event["timestamp"] = iso_utc(moment) if type(moment) is float else iso_utc_now()
    if "exc_info" in event:
        event = structlog.processors.format_exc_info(logger, method, event)
    if method in _URGENT_METHODS and LOG_SINK is not None:
        LOG_SINK.urgent = True
    return event


def render_json(logger: Any, method: str, event: dict[str, Any]) -> bytes:
    """The JSON chain in one processor: `stamp`, then JSONRenderer's work (orjson, str() for what
    JSON cannot hold). One Python call instead of three on the line written for every admission."""
    return orjson.dumps(stamp(logger, method, event), default=str)


def recording_logger_class(min_level: int) -> type[Any]:
    """structlog's filtering bound logger for `min_level`, plus `record(event, fields)`: an
    info line from a dict the caller has built, run through the configured processors like any other.

    The decision line carries some fifteen fields; given as keywords they are packed and unpacked
    three times on the way through the bound logger (method, _proxy_to_logger, _process_event),
    which measured as 2.3 of the 6 µs the line cost. structlog's custom-wrapper hook is made for
    this: `_process_event` is documented as available to wrapper classes."""

    def record(self: Any, event: str, fields: dict[str, Any]) -> Any:
        try:
            args, kw = self._process_event("info", event, fields)
        except structlog.DropEvent:
            return None
        return self._logger.info(*args, **kw)

    def record_nothing(self: Any, event: str, fields: dict[str, Any]) -> None:
        return None

    base = structlog.make_filtering_bound_logger(min_level)
    # Like the filtering class's own methods, `record` is a no-op below the minimum level.
    method = record if min_level <= logging.INFO else record_nothing
    return type(f"Recording{base.__name__}", (base,), {"record": method})


def record_line(logger: Any, event: str, fields: dict[str, Any]) -> None:
    """`logger.record` where logging is configured by configure_logging, else the keyword call
    (tests and tools that configure structlog themselves)."""
    record = getattr(logger, "record", None)
    if record is not None:
        record(event, fields)
    else:
        logger.info(event, **fields)


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    numeric = getattr(logging, level.upper(), logging.INFO)
    processors: list[Any]
    if fmt == "console":
        processors = [stamp, structlog.dev.ConsoleRenderer(colors=False)]
        factory: Any = structlog.PrintLoggerFactory(sys.stderr)
    else:
        global LOG_SINK
        processors = [render_json]
        LOG_SINK = LineBuffer(sys.stdout.buffer)
        factory = BufferedLoggerFactory(LOG_SINK)
    structlog.configure(
        processors=processors,
        wrapper_class=recording_logger_class(numeric),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )


def get_logger(name: str = "hami") -> Any:
    return structlog.get_logger(name)
