"""The webhook over HTTPS with real parts around it: agent processes, Prometheus, Redis, two replicas."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import ssl
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from tests.servers import AgentProcess, PrometheusServer, RedisServer, free_port
from tests.webhook_fixture import Webhook, gpu_container, pod, review_of, running_webhook

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
SIM = ROOT / "config" / "sim" / "cluster.yaml"


def _gpu_pod(name: str, annotations: dict[str, str] | None = None, **limits: Any) -> dict[str, Any]:
    return pod(name, containers=[gpu_container(**limits)], annotations=annotations)


def _node_of(answer: dict[str, Any]) -> str | None:
    for op in orjson.loads(base64.b64decode(answer["patch"])) if "patch" in answer else []:
        if op["path"] == "/metadata/annotations":
            return op["value"].get("hami.io/vgpu-node")
        if op["path"] == "/metadata/annotations/hami.io~1vgpu-node":
            return op["value"]
    return None


async def _ready(hook: Webhook, check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if hook.server.runtime.readiness()[0] and check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("webhook state never became ready")


async def test_latency_bound_follows_real_prometheus_utilisation(
    tmp_path: Path, start_agent: Callable[..., AgentProcess], start_prometheus: Callable[..., PrometheusServer]
) -> None:
    """gpu-d's A10 runs at 85%, gpu-b's T4s at 10-35%: a pod bounded at 50% never lands on gpu-d."""
    agents = {name: start_agent(SIM, name) for name in ("gpu-b", "gpu-d")}
    prom = start_prometheus([a.target for a in agents.values()], 1.0)
    overrides = {
        "state": {
            "interval_s": 0.3,
            "inventory": {"source": "static", "agents": {n: a.url for n, a in agents.items()}},
            "prometheus": {"url": prom.url, "query": "DCGM_FI_DEV_GPU_UTIL"},
        },
        "placement": {"default_policy": "binpack"},
    }
    async with running_webhook(tmp_path, overrides) as hook:
        runtime = hook.server.runtime
        await _ready(hook, lambda: all(g.utilisation is not None for n in runtime.snapshot.nodes for g in n.gpus))
        unbounded = await hook.review("mutate", review_of(_gpu_pod("free", **{"nvidia.com/gpumem": 1024})))
        bounded = await hook.review(
            "mutate",
            review_of(_gpu_pod("fast", {"hami.io/max-gpu-util": "50"}, **{"nvidia.com/gpumem": 1024})),
        )
        assert _node_of(bounded["response"]) == "gpu-b"
        # Without the bound, binpack is free to take the busy A10 (more used memory): the bound made the difference.
        assert _node_of(unbounded["response"]) in {"gpu-b", "gpu-d"}
        strict = await hook.review(
            "mutate", review_of(_gpu_pod("strict", {"hami.io/max-gpu-util": "1"}, **{"nvidia.com/gpumem": 1024}))
        )
        assert not strict["response"]["allowed"]
        assert "utilisation" in strict["response"]["status"]["message"]


async def test_a_hanging_agent_never_holds_an_admission(
    tmp_path: Path, start_agent: Callable[..., AgentProcess]
) -> None:
    """The request path never waits for agents: with one agent hanging, admissions answer at once."""
    agents = {name: start_agent(SIM, name) for name in ("gpu-a", "gpu-c")}
    overrides = {
        "state": {
            "interval_s": 0.2,
            "agents": {"timeout_s": 0.5, "fail_max": 2, "reset_timeout_s": 30},
            "inventory": {"source": "static", "agents": {n: a.url for n, a in agents.items()}},
        }
    }
    async with running_webhook(tmp_path, overrides) as hook:
        await _ready(hook, lambda: len(hook.server.runtime.snapshot.nodes) == 2)
        async with aiohttp.ClientSession() as plain:
            await plain.post(f"{agents['gpu-a'].url}/faults", json={"hang": True})
        slowest = 0.0
        nodes: Counter[str | None] = Counter()
        for i in range(40):
            started = time.perf_counter()
            answer = await hook.review("mutate", review_of(_gpu_pod(f"p{i}", **{"nvidia.com/gpumem": 1024})))
            slowest = max(slowest, time.perf_counter() - started)
            nodes[_node_of(answer["response"])] += 1
            await asyncio.sleep(0.05)
        # Each agent read waits up to 500 ms; an admission that waited for one would show it.
        assert slowest < 0.5, slowest
        assert hook.server.runtime.state.collector.breaker("gpu-a").current_state == "open"
        assert nodes["gpu-c"] > 0  # placements went on, to the node that answers
        async with aiohttp.ClientSession() as plain:
            await plain.post(f"{agents['gpu-a'].url}/faults", json={"clear": True})


async def test_redis_dies_and_returns_without_a_failed_admission(
    tmp_path: Path, start_redis: Callable[[], RedisServer]
) -> None:
    redis = start_redis()
    overrides = {"state": {"redis_url": redis.url, "interval_s": 0.2, "ledger": {"timeout_s": 0.1, "retry_s": 0.2}}}
    async with running_webhook(tmp_path, overrides) as hook:
        await _ready(hook, lambda: True)
        results: Counter[str] = Counter()

        async def burst(tag: str, count: int) -> None:
            for i in range(count):
                answer = (await hook.review("mutate", review_of(_gpu_pod(f"{tag}-{i}", **{"nvidia.com/gpumem": 256}))))[
                    "response"
                ]
                results["patched" if "patch" in answer else "denied" if not answer["allowed"] else "allowed"] += 1

        await burst("before", 10)
        redis.kill()
        await burst("during", 10)
        redis.start()
        await asyncio.sleep(1.0)
        await burst("after", 10)
    assert results == {"patched": 30}


def _webhook_process(tmp_path: Path, name: str, redis_url: str, sim: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    config = tmp_path / f"{name}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "server": {"listen": f"127.0.0.1:{port}", "state_dir": str(tmp_path / "state")},
                "logging": {"level": "warning"},
                "state": {"redis_url": redis_url, "interval_s": 0.5, "inventory": {"simulated_file": str(sim)}},
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "hami_webhook.py"), "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        start_new_session=True,
    )
    return proc, port


async def test_two_replicas_sharing_redis_promise_exactly_the_capacity(
    tmp_path: Path, start_redis: Callable[[], RedisServer]
) -> None:
    """400 concurrent admissions over 2 webhook processes for 200 slices: exactly 200 placed."""
    redis = start_redis()
    sim = tmp_path / "slices.yaml"
    # 20 cards of 10 GiB, HAMi's split count 10: 200 slices of 1 GiB.
    sim.write_text(
        yaml.safe_dump(
            {
                "nodes": {
                    f"slice-{n}": {
                        "gpus": [{"model": "NVIDIA L4", "memory_total_mib": 10240, "count": 5, "utilisation_gpu": 0}]
                    }
                    for n in range(4)
                }
            }
        )
    )
    # One certificate for both replicas, made before they start (they would race to create it).
    from hami import certs

    certs.ensure_self_signed(tmp_path / "state", certs.service_sans("hami-webhook", "hami-system"))
    replicas = [_webhook_process(tmp_path, f"r{i}", redis.url, sim) for i in range(2)]
    context = ssl.create_default_context(cafile=str(tmp_path / "state" / "ca.pem"))
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=64)) as session:
            for _, port in replicas:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        async with session.get(f"https://127.0.0.1:{port}/readyz") as response:
                            if response.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    assert time.monotonic() < deadline, "replica never became ready"
                    await asyncio.sleep(0.2)

            async def admit(i: int) -> dict[str, Any]:
                port = replicas[i % 2][1]
                review = review_of(_gpu_pod(f"s-{i}", **{"nvidia.com/gpumem": 1024}))
                async with session.post(f"https://127.0.0.1:{port}/mutate", json=review) as response:
                    assert response.status == 200
                    return (await response.json())["response"]

            answers = await asyncio.gather(*(admit(i) for i in range(400)))
    finally:
        for proc, _ in replicas:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
    placed = [a for a in answers if "patch" in a]
    assert len(placed) == 200, [a.get("status", {}).get("message", "")[:150] for a in answers if "patch" not in a][:20]
    assert all(not a["allowed"] for a in answers if "patch" not in a)
    per_device: Counter[str] = Counter()
    for answer in placed:
        for op in orjson.loads(base64.b64decode(answer["patch"])):
            if op["path"] == "/metadata/annotations":
                for device in op["value"]["hami.io/vgpu-devices-allocated"].strip(";").split(":"):
                    if device:
                        per_device[device.split(",")[0]] += int(device.split(",")[2])
    assert len(per_device) == 20
    assert max(per_device.values()) <= 10240
