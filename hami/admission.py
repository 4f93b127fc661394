"""The AdmissionReview envelope (admission.k8s.io/v1 and v1beta1): decode, check, encode.

Pure functions and typed errors, no aiohttp: the server maps `ReviewError` to HTTP 400 with a JSON
body naming what is wrong, and never lets a malformed review reach the decision code.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
MAX_WARNING_CHARS = 119  # kube-apiserver truncates longer warnings; keep each under 120


class ReviewError(ValueError):
    """The request body is not a usable AdmissionReview. Always answered with HTTP 400."""

    def __init__(self, message: str, field_path: str = "") -> None:
        super().__init__(message)
        self.field_path = field_path

    def to_json(self) -> dict[str, Any]:
        return {"error": "invalid AdmissionReview", "field": self.field_path, "message": str(self)}


class UserInfo(NamedTuple):
    username: str = ""
    groups: tuple[str, ...] = ()


# NamedTuples, not frozen dataclasses: equally immutable, and built several times faster (a
# frozen dataclass sets each field through object.__setattr__), which counts on a record decoded
# for every admission.
class AdmissionRequest(NamedTuple):
    """The fields of `request` the webhook uses, type-checked."""

    api_version: str  # of the review; the answer uses the same
    uid: str
    operation: str
    kind: str  # request.kind.kind, e.g. "Pod"
    group: str
    version: str
    resource: str
    sub_resource: str
    namespace: str
    name: str
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None
    dry_run: bool
    user: UserInfo = UserInfo()


def _expect(container: Mapping[str, Any], key: str, kind: type | tuple[type, ...], path: str, required: bool) -> Any:
    value = container.get(key)
    if value is None:
        if required:
            raise ReviewError(f"{path}.{key} is required", f"{path}.{key}")
        return None
    if isinstance(value, bool) and kind is not bool:
        raise ReviewError(f"{path}.{key} must be {_type_name(kind)}, got boolean", f"{path}.{key}")
    if not isinstance(value, kind):
        raise ReviewError(
            f"{path}.{key} must be {_type_name(kind)}, got {_json_type(value)}",
            f"{path}.{key}",
        )
    return value


def _type_name(kind: type | tuple[type, ...]) -> str:
    names = {dict: "an object", str: "a string", bool: "a boolean", list: "a list", int: "an integer"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


_STR = {str}
_new_tuple = tuple.__new__


class _NotTypical(Exception):
    """The fast path's signal: let the field-by-field checker decide (and name the problem)."""


def _fast_request(doc: dict[str, Any]) -> AdmissionRequest:
    """The review as kube-apiserver sends it, read without a check per field.

    Any deviation (a missing optional field included) raises _NotTypical and the careful path
    below takes over; both return the same AdmissionRequest for a well-formed review. This matters
    because the envelope is read on every admission, and the careful path costs several times more.
    """
    try:
        api_version, request = doc["apiVersion"], doc["request"]
        uid, operation, kind = request["uid"], request["operation"], request["kind"]
        obj, old, dry_run, user = request["object"], request.get("oldObject"), request["dryRun"], request["userInfo"]
        kind_name, group, version = kind["kind"], kind["group"], kind["version"]
        resource = request["resource"]["resource"]
        namespace, name = request.get("namespace", ""), request.get("name", "")
        sub_resource = request.get("subResource", "")
        username, groups = user["username"], user.get("groups", [])
    except (KeyError, TypeError):
        raise _NotTypical from None
    # One flat chain of identity checks: measured cheaper than any loop or set built over them.
    if (
        api_version not in API_VERSIONS  # tuples: a list or dict here must not raise
        or doc.get("kind") != "AdmissionReview"
        or type(uid) is not str
        or not uid
        or operation not in ("CREATE", "UPDATE")
        or type(obj) is not dict
        or (old is not None and type(old) is not dict)
        or type(dry_run) is not bool
        or type(kind_name) is not str
        or type(group) is not str
        or type(version) is not str
        or type(resource) is not str
        or type(namespace) is not str
        or type(name) is not str
        or type(sub_resource) is not str
        or type(username) is not str
        or type(groups) is not list
        or (groups and set(map(type, groups)) != _STR)
        or type(obj.get("metadata", {})) is not dict
    ):
        raise _NotTypical
    # tuple.__new__ is what the NamedTuple's generated __new__ ends in, without its Python-level
    # argument binding: a third of the record's cost on a path every admission takes.
    user_info = _new_tuple(UserInfo, (username, tuple(groups)))
    fields = (api_version, uid, operation, kind_name, group, version, resource, sub_resource, namespace, name)
    return _new_tuple(AdmissionRequest, (*fields, obj, old, dry_run, user_info))


def decode_review(body: bytes) -> AdmissionRequest:
    """Parse and check a review. Raises ReviewError with the offending field."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ReviewError(f"body is not JSON: {exc}") from None
    if type(doc) is dict:
        try:
            return _fast_request(doc)
        except _NotTypical:
            pass  # the careful path below either accepts it or names the bad field
    return checked_request(doc)


def checked_request(doc: Any) -> AdmissionRequest:
    """Every field checked in turn; the first bad one is named in the ReviewError."""
    if not isinstance(doc, dict):
        raise ReviewError(f"body must be a JSON object, got {_json_type(doc)}")
    api_version = doc.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise ReviewError(f"apiVersion must be one of {', '.join(API_VERSIONS)}, got {api_version!r}", "apiVersion")
    if doc.get("kind") != "AdmissionReview":
        raise ReviewError(f"kind must be 'AdmissionReview', got {doc.get('kind')!r}", "kind")
    request = _expect(doc, "request", dict, "", True)
    uid = _expect(request, "uid", str, "request", True)
    if not uid:
        raise ReviewError("request.uid must not be empty", "request.uid")
    operation = _expect(request, "operation", str, "request", True)
    if operation not in OPERATIONS:
        raise ReviewError(f"request.operation must be one of {', '.join(OPERATIONS)}", "request.operation")
    kind = _expect(request, "kind", dict, "request", True)
    kind_name = _expect(kind, "kind", str, "request.kind", True)
    group = _expect(kind, "group", str, "request.kind", False) or ""
    version = _expect(kind, "version", str, "request.kind", False) or ""
    resource_doc = _expect(request, "resource", dict, "request", False) or {}
    resource = _expect(resource_doc, "resource", str, "request.resource", False) or ""
    sub_resource = _expect(request, "subResource", str, "request", False) or ""
    namespace = _expect(request, "namespace", str, "request", False) or ""
    name = _expect(request, "name", str, "request", False) or ""
    obj = _expect(request, "object", dict, "request", False)
    old = _expect(request, "oldObject", dict, "request", False)
    dry_run = _expect(request, "dryRun", bool, "request", False) or False
    if operation in ("CREATE", "UPDATE") and obj is None:
        raise ReviewError(f"request.object is required for {operation}", "request.object")
    user_doc = _expect(request, "userInfo", dict, "request", False) or {}
    username = _expect(user_doc, "username", str, "request.userInfo", False) or ""
    groups = _expect(user_doc, "groups", list, "request.userInfo", False) or []
    if not all(isinstance(g, str) for g in groups):
        raise ReviewError("request.userInfo.groups must be a list of strings", "request.userInfo.groups")
    if obj is not None:
        metadata = obj.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise ReviewError("request.object.metadata must be an object", "request.object.metadata")
    return AdmissionRequest(
        api_version=api_version,
        uid=uid,
        operation=operation,
        kind=kind_name,
        group=group,
        version=version,
        resource=resource,
        sub_resource=sub_resource,
        namespace=namespace,
        name=name,
        object=obj,
        old_object=old,
        dry_run=dry_run,
        user=UserInfo(username, tuple(groups)),
    )


def clip_warning(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_WARNING_CHARS else text[: MAX_WARNING_CHARS - 1] + "…"


class Verdict(NamedTuple):
    """What the decision code answers; `encode_review` turns it into the wire format."""

    allowed: bool
    message: str = ""
    reason: str = ""  # machine reason on denial: Forbidden, Invalid, InternalError
    code: int = 200
    warnings: tuple[str, ...] = ()
    patch: Sequence[Mapping[str, Any]] = ()  # RFC 6902 operations; only /mutate sends them
    audit_annotations: Mapping[str, str] = MappingProxyType({})  # read-only: the default is shared


def deny(message: str, code: int = 403, reason: str = "Forbidden", warnings: tuple[str, ...] = ()) -> Verdict:
    return Verdict(allowed=False, message=message, reason=reason, code=code, warnings=warnings)


ALLOW = Verdict(allowed=True)


def build_response(api_version: str, uid: str, verdict: Verdict, *, with_patch: bool) -> dict[str, Any]:
    """The AdmissionReview answer. `with_patch` is False for /validate: kube-apiserver rejects
    patches from validating webhooks, so they are dropped here whatever the decision code said."""
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {
            "status": "Failure",
            "code": verdict.code,
            "reason": verdict.reason or "Forbidden",
            "message": verdict.message,
        }
    elif verdict.message:
        response["status"] = {"status": "Success", "code": 200, "message": verdict.message}
    if verdict.warnings:
        response["warnings"] = [clip_warning(w) for w in verdict.warnings]
    if with_patch and verdict.allowed and verdict.patch:
        response["patch"] = base64.b64encode(orjson.dumps(list(verdict.patch))).decode("ascii")
        response["patchType"] = "JSONPatch"
    if verdict.audit_annotations:
        response["auditAnnotations"] = dict(verdict.audit_annotations)
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}


def encode_review(api_version: str, uid: str, verdict: Verdict, *, with_patch: bool) -> bytes:
    if verdict is ALLOW:  # most admissions: nothing to add to the answer
        return orjson.dumps(
            {"apiVersion": api_version, "kind": "AdmissionReview", "response": {"uid": uid, "allowed": True}}
        )
    return orjson.dumps(build_response(api_version, uid, verdict, with_patch=with_patch))
