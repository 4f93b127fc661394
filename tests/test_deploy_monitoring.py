"""deploy/monitoring: the dashboard queries only metrics the webhook exports, every query and
alert is valid PromQL (promtool), and the alerts fire on the situations they are named after."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_deploy_lib import DEPLOY, REPO

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")

# The metrics the webhook promises (issue "Production deployment").
CONTRACT = frozenset(
    {
        "hami_webhook_requests_total",
        "hami_webhook_request_duration_seconds",
        "hami_webhook_active_connections",
        "hami_webhook_policy_results_total",
        "hami_webhook_node_breaker_state",
        "hami_webhook_node_query_errors_total",
        "hami_webhook_cache_hits_total",
        "hami_webhook_cache_misses_total",
        "hami_webhook_ledger_reservations_total",
        "hami_webhook_redis_up",
        "hami_webhook_prometheus_up",
        "hami_webhook_gpu_memory_promised_mib",
        "hami_webhook_gpu_memory_used_mib",
        "hami_webhook_certificate_expiry_timestamp_seconds",
        "hami_webhook_internal_errors_total",
    }
)
HISTOGRAMS = frozenset({"hami_webhook_request_duration_seconds"})
PROMETHEUS_BUILTINS = frozenset({"up"})
_METRIC = re.compile(r"\b(hami_webhook_[a-z0-9_]+)")
_DEFINED = re.compile(r"""["'](hami_webhook_[a-z0-9_]+)["']""")


def metric_names(expr: str) -> set[str]:
    """Metric families an expression reads (histogram series folded onto their family)."""
    names = set()
    for name in _METRIC.findall(expr):
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name[: -len(suffix)] in HISTOGRAMS:
                name = name[: -len(suffix)]
        names.add(name)
    return names


def defined_in_code() -> set[str]:
    """Metric names registered under hami/ (prometheus_client constructors take the name first)."""
    names: set[str] = set()
    for path in (REPO / "hami").rglob("*.py"):
        names |= set(_DEFINED.findall(path.read_text(encoding="utf-8")))
    return names


def dashboard() -> dict[str, Any]:
    return json.loads((DEPLOY / "monitoring" / "dashboard.json").read_text(encoding="utf-8"))


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def rule_groups() -> list[dict[str, Any]]:
    doc = yaml.safe_load((DEPLOY / "monitoring" / "prometheusrule.yaml").read_text(encoding="utf-8"))
    assert doc["kind"] == "PrometheusRule"
    return doc["spec"]["groups"]


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule_groups() for r in g["rules"] if "alert" in r}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


# --- dashboard -----------------------------------------------------------------------------


def test_dashboard_queries_only_promised_metrics() -> None:
    exprs = dashboard_exprs()
    assert exprs
    used = set().union(*map(metric_names, exprs))
    assert used <= CONTRACT, f"not in the metrics contract: {sorted(used - CONTRACT)}"
    code = defined_in_code()
    if code:  # once the code registers metrics, the dashboard must read real ones
        assert used <= code, f"not registered under hami/: {sorted(used - code)}"


def test_dashboard_covers_what_operators_look_at() -> None:
    by_title = {p["title"]: " ".join(t["expr"] for t in p.get("targets", [])) for p in dashboard()["panels"]}
    text = " ".join(by_title.values())
    assert "rate(hami_webhook_requests_total" in text
    assert "histogram_quantile(0.5," in text and "histogram_quantile(0.99," in text
    assert 'hami_webhook_policy_results_total{mode="enforce"' in text
    assert "hami_webhook_node_breaker_state" in text
    assert "hami_webhook_cache_hits_total" in text and "hami_webhook_cache_misses_total" in text
    promised = [t for t, e in by_title.items() if "gpu_memory_promised" in e and "gpu_memory_used" in e]
    assert promised and "by (node)" in by_title[promised[0]], "promised vs used must be per node, on one panel"
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    # promtool has no bare "parse this query"; a recording rule per query gets the same parser.
    rules = [
        {"record": f"dashboard:query_{i}", "expr": e.replace("$__rate_interval", "5m")}
        for i, e in enumerate(dashboard_exprs())
    ]
    (tmp_path / "q.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = promtool("check", "rules", "q.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


# --- alerts --------------------------------------------------------------------------------


def test_alerts_cover_the_failure_modes_and_are_actionable() -> None:
    rules = alerts()
    exprs = {name: r["expr"] for name, r in rules.items()}
    for needle in (
        "hami_webhook_request_duration_seconds_bucket",
        'hami_webhook_requests_total{result="error"}',
        "hami_webhook_node_breaker_state",
        "hami_webhook_certificate_expiry_timestamp_seconds",
        "hami_webhook_redis_up",
        "hami_webhook_ledger_reservations_total",
    ):
        assert any(needle in e for e in exprs.values()), f"no alert reads {needle}"
    assert any("14 * 86400" in e for e in exprs.values()), "certificate alert must look 14 days ahead"
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
    known = CONTRACT | PROMETHEUS_BUILTINS | defined_in_code()
    for name, expr in exprs.items():
        assert metric_names(expr) <= known, f"{name} reads unknown metrics {metric_names(expr) - known}"


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups()}))
    return path


@needs_promtool
def test_alert_rules_pass_promtool(rules_file: Path) -> None:
    done = promtool("check", "rules", rules_file.name, cwd=rules_file.parent)
    assert done.returncode == 0, done.stdout + done.stderr


# Synthetic series through the real rules: each alert fires on its situation and stays quiet
# on the healthy neighbour of it. Times are relative to 0; `time()` is the evaluation time.
DAY = 86400
UNIT_TESTS: list[dict[str, Any]] = [
    {
        "interval": "1m",
        "input_series": [
            # expires 10 days after t=0 on one replica, 60 days on the other
            {"series": 'hami_webhook_certificate_expiry_timestamp_seconds{pod="a"}', "values": f"{10 * DAY}x180"},
            {"series": 'hami_webhook_certificate_expiry_timestamp_seconds{pod="b"}', "values": f"{60 * DAY}x180"},
        ],
        "alert_rule_test": [
            {
                "eval_time": "2h",
                "alertname": "HamiWebhookCertificateExpiringSoon",
                "exp_alerts": [{"exp_labels": {"severity": "warning"}}],
            },
            {"eval_time": "2h", "alertname": "HamiWebhookCertificateExpiryCritical", "exp_alerts": []},
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            {"series": 'hami_webhook_certificate_expiry_timestamp_seconds{pod="a"}', "values": f"{30 * DAY}x180"}
        ],
        "alert_rule_test": [{"eval_time": "2h", "alertname": "HamiWebhookCertificateExpiringSoon", "exp_alerts": []}],
    },
    {
        "interval": "1m",
        "input_series": [
            {"series": 'hami_webhook_node_breaker_state{node="gpu-1",pod="a"}', "values": "2x30"},
            {"series": 'hami_webhook_node_breaker_state{node="gpu-2",pod="a"}', "values": "0x30"},
            {"series": 'hami_webhook_node_breaker_state{node="gpu-3",pod="a"}', "values": "1x30"},
        ],
        "alert_rule_test": [
            {
                "eval_time": "20m",
                "alertname": "HamiWebhookNodeBreakerOpen",
                "exp_alerts": [{"exp_labels": {"severity": "warning", "node": "gpu-1"}}],
            },
            # 1 of 3 nodes open is above the 25% line
            {
                "eval_time": "20m",
                "alertname": "HamiWebhookManyBreakersOpen",
                "exp_alerts": [{"exp_labels": {"severity": "critical"}}],
            },
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            # 5% errors: 95 allowed + 5 error per minute
            {"series": 'hami_webhook_requests_total{endpoint="/validate",result="allowed"}', "values": "0+95x40"},
            {"series": 'hami_webhook_requests_total{endpoint="/validate",result="error"}', "values": "0+5x40"},
        ],
        "alert_rule_test": [
            {
                "eval_time": "30m",
                "alertname": "HamiWebhookErrorRate",
                "exp_alerts": [{"exp_labels": {"severity": "critical"}}],
            }
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            {"series": 'hami_webhook_requests_total{endpoint="/validate",result="allowed"}', "values": "0+1000x40"},
            {"series": 'hami_webhook_requests_total{endpoint="/validate",result="error"}', "values": "0+1x40"},
        ],
        "alert_rule_test": [{"eval_time": "30m", "alertname": "HamiWebhookErrorRate", "exp_alerts": []}],
    },
    {
        "interval": "1m",
        "input_series": [
            # Redis-less install: redis_up is 0 but nothing falls back -> quiet
            {"series": 'hami_webhook_redis_up{pod="a"}', "values": "0x40"},
            {"series": 'hami_webhook_ledger_reservations_total{pod="a",result="ok"}', "values": "0+10x40"},
            # ha replica that lost Redis and falls back -> fires for that pod only
            {"series": 'hami_webhook_redis_up{pod="b"}', "values": "0x40"},
            {"series": 'hami_webhook_ledger_reservations_total{pod="b",result="fallback_ok"}', "values": "0+10x40"},
        ],
        "alert_rule_test": [
            {
                "eval_time": "30m",
                "alertname": "HamiWebhookRedisDown",
                "exp_alerts": [{"exp_labels": {"severity": "warning", "pod": "b"}}],
            },
            {
                "eval_time": "30m",
                "alertname": "HamiWebhookLedgerUnavailable",
                "exp_alerts": [{"exp_labels": {"severity": "warning"}}],
            },
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            # every request takes 0.5 s (bucket le=0.5): p99 is over the 100 ms budget, under 1 s
            {"series": 'hami_webhook_request_duration_seconds_bucket{endpoint="/mutate",le="0.1"}', "values": "0x40"},
            {
                "series": 'hami_webhook_request_duration_seconds_bucket{endpoint="/mutate",le="0.5"}',
                "values": "0+60x40",
            },
            {
                "series": 'hami_webhook_request_duration_seconds_bucket{endpoint="/mutate",le="+Inf"}',
                "values": "0+60x40",
            },
        ],
        "alert_rule_test": [
            {
                "eval_time": "30m",
                "alertname": "HamiWebhookLatencyHigh",
                "exp_alerts": [{"exp_labels": {"severity": "warning", "endpoint": "/mutate"}}],
            },
            {"eval_time": "30m", "alertname": "HamiWebhookLatencyCritical", "exp_alerts": []},
        ],
    },
]


@needs_promtool
def test_alerts_fire_on_synthetic_series(tmp_path: Path) -> None:
    # promtool compares annotations exactly and ours are templated prose: test the rules without
    # them, on what matters here (which alert fires, with which labels).
    groups = json.loads(json.dumps(rule_groups()))
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": UNIT_TESTS})
    )
    done = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
