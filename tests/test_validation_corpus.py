"""The manifest corpus (tests/corpus) against validate(), as the HTTPS test runs it through /validate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hami.validation import Mode, ValidationContext, ValidationSettings, render_denial, validate
from hami.validation.settings import ALL_RULES
from hami.workloads import pod_templates

CORPUS = Path(__file__).parent / "corpus"
EXPECTED: dict[str, Any] = yaml.safe_load((CORPUS / "expected.yaml").read_text())
CASES: dict[str, dict[str, Any]] = EXPECTED["cases"]


def settings_for(case: dict[str, Any]) -> ValidationSettings:
    key = case.get("settings")
    return ValidationSettings().with_overrides(EXPECTED["settings"][key]) if key else ValidationSettings()


def test_every_manifest_has_an_expectation_and_the_corpus_is_large() -> None:
    manifests = {p.name for p in CORPUS.glob("*.yaml")} - {"expected.yaml"}
    assert manifests == set(CASES)
    assert len(manifests) >= 60


def test_corpus_covers_every_rule_and_every_workload_kind() -> None:
    fired = {rule for case in CASES.values() for key in ("rules", "warns", "audits") for rule in case.get(key, [])}
    assert fired >= set(ALL_RULES)
    kinds = {yaml.safe_load((CORPUS / name).read_text())["kind"] for name in CASES}
    assert kinds >= {"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}
    assert sum(case["allowed"] for case in CASES.values()) >= 25  # plenty of ordinary workloads


@pytest.mark.parametrize("name", sorted(CASES))
def test_corpus_case(name: str) -> None:
    case = CASES[name]
    obj = yaml.safe_load((CORPUS / name).read_text())
    settings = settings_for(case)
    ctx = ValidationContext(
        "CREATE", case["namespace"], user=case.get("user", ""), groups=tuple(case.get("groups", ()))
    )
    violations = validate(obj, pod_templates(obj, case["namespace"]), ctx, settings)
    by_mode = {mode: {v.rule for v in violations if v.mode is mode} for mode in Mode}
    assert by_mode[Mode.ENFORCE] == set(case["rules"])
    assert by_mode[Mode.WARN] == set(case["warns"])
    assert by_mode[Mode.AUDIT] == set(case.get("audits", []))
    assert (not by_mode[Mode.ENFORCE]) == case["allowed"]
    for violation in violations:
        assert len(violation.warning) < 120
        assert violation.path in violation.message
    if not case["allowed"]:
        denial = render_denial(violations, obj["kind"], obj["metadata"]["name"], settings.language)
        assert denial.count("\n") == sum(v.mode is Mode.ENFORCE for v in violations)


def test_every_manifest_follows_the_kubernetes_schema() -> None:
    """Realistic manifests: each passes the Kubernetes 1.32 OpenAPI schema, strictly (no unknown fields)."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for name in CASES:
        kubernetes_validate.validate(yaml.safe_load((CORPUS / name).read_text()), "1.32.0", strict=True)
