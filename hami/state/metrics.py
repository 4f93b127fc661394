"""Prometheus metrics of the live-state layer (registered once, in the default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from hami.metric_children import Children

# Per node: hami_webhook_node_breaker_state, hami_webhook_gpu_memory_promised_mib and
# hami_webhook_gpu_memory_used_mib are made at scrape time (hami/state/node_metrics.py).
NODE_QUERY_ERRORS = Counter(
    "hami_webhook_node_query_errors_total", "Failed reads of a node agent's /status, by reason", ["node", "reason"]
)
CACHE_HITS = Counter("hami_webhook_cache_hits_total", "State cache hits, by level (l1, l2)", ["level"])
CACHE_MISSES = Counter("hami_webhook_cache_misses_total", "State cache misses, by level (l1, l2)", ["level"])
LEDGER_RESERVATIONS = Counter(
    "hami_webhook_ledger_reservations_total",
    "Reservation attempts by result (ok, refused, fallback_ok, fallback_refused)",
    ["result"],
)
RESERVATION_RESULTS: Children[Counter] = Children(LEDGER_RESERVATIONS)  # its children, looked up once
DEGRADATION_TRANSITIONS = Counter(
    "hami_webhook_degradation_transitions_total",
    "State transitions of a dependency (what: node, prometheus, redis, kube) to a state (to)",
    ["what", "to"],
)
SNAPSHOT_AGE = Gauge("hami_webhook_snapshot_age_seconds", "Age of the snapshot the request path reads")
REDIS_UP = Gauge("hami_webhook_redis_up", "1 while Redis answers, 0 while the webhook runs on L1 and in-process")
PROMETHEUS_UP = Gauge("hami_webhook_prometheus_up", "1 while the utilisation query answers")
