"""A real webhook on a real HTTPS socket (port 0 on loopback), and a client that trusts its CA."""

from __future__ import annotations

import ssl
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from hami import config as config_mod
from hami.config import Config
from hami.runtime_factory import build_runtime
from hami.server import WebhookServer


@dataclass
class Webhook:
    server: WebhookServer
    session: aiohttp.ClientSession
    ca_file: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"

    async def post(self, endpoint: str, body: bytes | Mapping[str, Any]) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        async with self.session.post(
            f"{self.url}/{endpoint}", data=data, headers={"Content-Type": "application/json"}
        ) as response:
            raw = await response.read()
            try:
                return response.status, orjson.loads(raw)
            except orjson.JSONDecodeError:
                return response.status, raw.decode(errors="replace")

    async def review(self, endpoint: str, review: Mapping[str, Any]) -> dict[str, Any]:
        status, answer = await self.post(endpoint, review)
        assert status == 200, answer
        return answer


def client_context(ca_file: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca_file))
    return context


@asynccontextmanager
async def running_webhook(
    tmp_path: Path,
    overrides: Mapping[str, Any] | None = None,
    config_path: str | None = None,
    configure: Callable[[Config], Config] | None = None,
) -> AsyncIterator[Webhook]:
    data: dict[str, Any] = {"server": {"listen": "127.0.0.1:0", "state_dir": str(tmp_path / "state")}}
    data = config_mod.merge(data, overrides or {})
    cfg = config_mod.load(config_path, environ={}, overrides=data)
    if configure:
        cfg = configure(cfg)
    server = WebhookServer(build_runtime(cfg, config_path, data))
    await server.start()
    ca_file = Path(cfg.tls.cert_file) if cfg.tls.cert_file else tmp_path / "state" / "ca.pem"
    connector = aiohttp.TCPConnector(ssl=client_context(ca_file), limit=64)
    session = aiohttp.ClientSession(connector=connector)
    try:
        yield Webhook(server, session, ca_file)
    finally:
        await session.close()
        await server.stop()


def review_of(
    obj: Mapping[str, Any] | None,
    *,
    operation: str = "CREATE",
    namespace: str = "default",
    api_version: str = "admission.k8s.io/v1",
    dry_run: bool = False,
    old: Mapping[str, Any] | None = None,
    user: str = "alice",
    groups: tuple[str, ...] = ("system:authenticated",),
    sub_resource: str = "",
) -> dict[str, Any]:
    """An AdmissionReview as kube-apiserver sends it for `obj`."""
    source = obj or old or {}
    kind = source.get("kind", "Pod")
    group, _, version = (source.get("apiVersion") or "v1").rpartition("/")
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "name": (source.get("metadata") or {}).get("name", ""),
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": user, "groups": list(groups)},
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


def pod(
    name: str = "app",
    *,
    containers: list[dict[str, Any]] | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    generate_name: str = "",
    **spec: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"namespace": "default"}
    if generate_name:
        metadata["generateName"] = generate_name
    else:
        metadata["name"] = name
    if annotations:
        metadata["annotations"] = dict(annotations)
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": containers or [{"name": "main", "image": "nginx:1.27"}], **spec},
    }


def gpu_container(name: str = "cuda", **limits: Any) -> dict[str, Any]:
    return {"name": name, "image": "nvidia/cuda:12.4.1-base-ubuntu22.04", "resources": {"limits": dict(limits)}}
