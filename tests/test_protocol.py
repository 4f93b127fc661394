"""The AdmissionReview v1/v1beta1 protocol as kube-apiserver speaks it, over real HTTPS."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import pytest

from hami.admission import MAX_WARNING_CHARS, Verdict, build_response
from tests.webhook_fixture import Webhook, pod, review_of, running_webhook

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
ENDPOINTS = ("validate", "mutate")


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("api_version", API_VERSIONS)
async def test_answer_echoes_uid_in_request_api_version(webhook: Webhook, endpoint: str, api_version: str) -> None:
    review = review_of(pod(), api_version=api_version)
    answer = await webhook.review(endpoint, review)
    assert answer["apiVersion"] == api_version
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == review["request"]["uid"]
    assert answer["response"]["allowed"] is True


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
async def test_delete_and_connect_pass_untouched(webhook: Webhook, endpoint: str, operation: str) -> None:
    review = review_of(None, operation=operation, old=pod(privileged_marker="x") if operation == "DELETE" else None)
    if operation == "CONNECT":
        review["request"]["kind"] = {"group": "", "version": "v1", "kind": "PodExecOptions"}
        review["request"]["object"] = {"kind": "PodExecOptions", "command": ["sh"]}
    answer = (await webhook.review(endpoint, review))["response"]
    assert answer["allowed"] is True
    assert "patch" not in answer


@pytest.mark.parametrize("endpoint", ENDPOINTS)
async def test_unhandled_kinds_pass_untouched(webhook: Webhook, endpoint: str) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}}
    answer = (await webhook.review(endpoint, review_of(config_map)))["response"]
    assert answer == {"uid": answer["uid"], "allowed": True}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
async def test_generate_name_pod_with_empty_name(webhook: Webhook, endpoint: str) -> None:
    review = review_of(pod(generate_name="worker-"))
    review["request"]["name"] = ""
    answer = (await webhook.review(endpoint, review))["response"]
    assert answer["allowed"] is True


BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("not json", b"{nope", "not JSON"),
    ("json list", b"[1, 2]", "JSON object"),
    ("wrong apiVersion", orjson.dumps({"apiVersion": "v1", "kind": "AdmissionReview", "request": {}}), "apiVersion"),
    ("wrong kind", orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}), "kind"),
    ("missing request", orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "request"),
]


def _review_with(**request_changes: Any) -> bytes:
    review = review_of(pod())
    for key, value in request_changes.items():
        if value is ...:
            review["request"].pop(key)
        else:
            review["request"][key] = value
    return orjson.dumps(review)


BAD_BODIES += [
    ("missing uid", _review_with(uid=...), "request.uid"),
    ("empty uid", _review_with(uid=""), "request.uid"),
    ("uid not a string", _review_with(uid=42), "request.uid"),
    ("object not a mapping", _review_with(object=["x"]), "request.object"),
    ("object missing on CREATE", _review_with(object=...), "request.object"),
    ("dryRun not a bool", _review_with(dryRun="yes"), "request.dryRun"),
    ("unknown operation", _review_with(operation="PATCH"), "request.operation"),
    ("groups not strings", _review_with(userInfo={"username": "a", "groups": [1]}), "groups"),
    ("kind not a mapping", _review_with(kind="Pod"), "request.kind"),
    ("metadata not a mapping", _review_with(object={"kind": "Pod", "metadata": "x", "spec": {}}), "metadata"),
    ("containers not a list", _review_with(object={"kind": "Pod", "spec": {"containers": {"a": 1}}}), "containers"),
    (
        "template not a mapping",
        _review_with(object={"kind": "Deployment", "apiVersion": "apps/v1", "spec": {"template": []}}),
        "spec.template",
    ),
]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize(("case", "body", "names"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
async def test_bad_input_is_400_naming_the_problem(
    webhook: Webhook, endpoint: str, case: str, body: bytes, names: str
) -> None:
    status, answer = await webhook.post(endpoint, body)
    assert status == 400, (case, answer)
    assert isinstance(answer, dict)
    assert names in answer["message"] or names in answer.get("field", ""), answer


@pytest.mark.parametrize("endpoint", ENDPOINTS)
async def test_body_over_limit_is_400(tmp_path: Path, endpoint: str) -> None:
    async with running_webhook(tmp_path, {"server": {"max_body_bytes": 4096}}) as hook:
        big = review_of(pod(annotations={"filler": "x" * 8000}))
        status, answer = await hook.post(endpoint, big)
        assert status == 400
        assert "exceeds 4096" in answer["message"]
        status, _ = await hook.post(endpoint, review_of(pod()))
        assert status == 200  # the connection and the server are fine afterwards


class _Boom(Exception):
    pass


@pytest.mark.parametrize("policy", ["allow", "deny"])
async def test_internal_error_follows_on_internal_error(tmp_path: Path, policy: str) -> None:
    async with running_webhook(tmp_path, {"server": {"on_internal_error": policy}}) as hook:
        decider = hook.server.app[__import__("hami.server", fromlist=["DECIDER_KEY"]).DECIDER_KEY]

        async def explode(*_: Any) -> Any:
            raise _Boom("bug")

        decider.decide = explode  # type: ignore[method-assign]
        review = review_of(pod())
        status, answer = await hook.post("validate", review)
        assert status == 200
        response = answer["response"]
        assert response["uid"] == review["request"]["uid"]
        assert response["allowed"] is (policy == "allow")
        assert "Traceback" not in orjson.dumps(answer).decode()
        if policy == "deny":
            assert response["status"]["code"] == 500
            assert response["status"]["reason"] == "InternalError"
        status, _ = await hook.post("validate", b"")  # still alive
        assert status == 400


async def test_health_ready_and_metrics(webhook: Webhook) -> None:
    await webhook.review("validate", review_of(pod()))
    async with webhook.session.get(f"{webhook.url}/healthz") as response:
        assert response.status == 200
    async with webhook.session.get(f"{webhook.url}/readyz") as response:
        assert response.status == 200
    async with webhook.session.get(f"{webhook.url}/metrics") as response:
        text = await response.text()
    assert 'hami_webhook_requests_total{endpoint="validate",kind="Pod",operation="CREATE",result="allowed"}' in text
    assert "hami_webhook_request_duration_seconds_bucket" in text
    assert 'le="0.0001"' in text
    assert "hami_webhook_active_connections" in text


async def test_plain_http_is_refused(webhook: Webhook) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as plain:
        with pytest.raises(aiohttp.ClientError):
            async with plain.get(f"http://127.0.0.1:{webhook.server.port}/healthz") as response:
                await response.read()


def test_encoding_rules() -> None:
    """Patches only from /mutate, warnings clipped, status on denial."""
    patch = [{"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}]
    verdict = Verdict(allowed=True, patch=patch, warnings=("w" * 300,))
    mutated = build_response("admission.k8s.io/v1", "u", verdict, with_patch=True)["response"]
    assert mutated["patchType"] == "JSONPatch"
    assert orjson.loads(base64.b64decode(mutated["patch"])) == patch
    assert all(len(w) <= MAX_WARNING_CHARS for w in mutated["warnings"])
    validated = build_response("admission.k8s.io/v1", "u", verdict, with_patch=False)["response"]
    assert "patch" not in validated and "patchType" not in validated
    denied = build_response("admission.k8s.io/v1", "u", Verdict(False, "no", "Forbidden", 403), with_patch=True)
    assert denied["response"]["status"] == {"status": "Failure", "code": 403, "reason": "Forbidden", "message": "no"}


def test_the_plain_allow_answer_is_what_build_response_writes() -> None:
    from hami.admission import ALLOW, encode_review

    for api_version in ("admission.k8s.io/v1", "admission.k8s.io/v1beta1"):
        for with_patch in (True, False):
            fast = encode_review(api_version, "uid-1", ALLOW, with_patch=with_patch)
            assert orjson.loads(fast) == build_response(api_version, "uid-1", ALLOW, with_patch=with_patch)
    # An equal verdict that is not the shared ALLOW takes the general path, with the same answer.
    assert encode_review("admission.k8s.io/v1", "u", Verdict(True), with_patch=True) == encode_review(
        "admission.k8s.io/v1", "u", ALLOW, with_patch=True
    )
