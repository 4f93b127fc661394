"""agent.py as a real process on a loopback port, spoken to over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami.node.schema import NodeStatus, parse_status

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = str(ROOT / "config" / "sim" / "cluster.yaml")
DCGM = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
)
SHORT = aiohttp.ClientTimeout(total=0.5)
LONG = aiohttp.ClientTimeout(total=10)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def agent(*args: str) -> Iterator[str]:
    """Run agent.py on a free loopback port until the block ends; yields its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "agent.py"), "--listen", f"127.0.0.1:{port}", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"agent.py exited {proc.returncode}: {proc.stderr.read().decode()}")  # type: ignore[union-attr]
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def single() -> Iterator[str]:
    # A huge interval: every request after the first must be served from the one read.
    with agent("--simulate", CLUSTER, "--node-name", "gpu-b", "--interval", "3600") as base:
        yield base


@pytest.fixture(scope="module")
def fleet() -> Iterator[str]:
    with agent("--simulate", CLUSTER, "--interval", "0.2") as base:
        yield base


async def get_status(session: aiohttp.ClientSession, url: str) -> NodeStatus:
    async with session.get(url, timeout=LONG) as resp:
        assert resp.status == 200, await resp.text()
        return parse_status(orjson.loads(await resp.read()))


async def get_metrics(session: aiohttp.ClientSession, url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    async with session.get(url, timeout=LONG) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


async def post_faults(session: aiohttp.ClientSession, url: str, body: object) -> aiohttp.ClientResponse:
    async with session.post(url, data=orjson.dumps(body), timeout=LONG) as resp:
        await resp.read()
        return resp


def reads_total(metrics: dict[str, list[tuple[dict[str, str], float]]]) -> float:
    return metrics["hami_agent_reads_total"][0][1]


async def test_single_node_status_follows_the_schema(single: str) -> None:
    async with aiohttp.ClientSession() as session:
        status = await get_status(session, f"{single}/status")
    assert (status.node, status.backend) == ("gpu-b", "simulated")
    assert [g.model for g in status.gpus] == ["Tesla T4", "Tesla T4"]
    assert status.gpus[1].memory_used_mib == 13824  # the unaccounted process


async def test_metrics_carry_dcgm_names_and_labels_matching_status(single: str) -> None:
    async with aiohttp.ClientSession() as session:
        metrics = await get_metrics(session, f"{single}/metrics")
        status = await get_status(session, f"{single}/status")
    assert set(DCGM) <= set(metrics)
    for name in DCGM:
        for labels, _ in metrics[name]:
            assert labels["Hostname"] == "gpu-b" and labels["device"] == f"nvidia{labels['gpu']}"
            assert labels["modelName"] == "Tesla T4" and labels["UUID"].startswith("GPU-")
    used = {labels["UUID"]: value for labels, value in metrics["DCGM_FI_DEV_FB_USED"]}
    assert used == {g.uuid: g.memory_used_mib for g in status.gpus}
    assert {kind["kind"] for kind, _ in metrics["hami_agent_read_errors_total"]} == {"read", "call"}


async def test_the_backend_is_read_at_most_once_per_interval(single: str) -> None:
    async with aiohttp.ClientSession() as session:
        await get_status(session, f"{single}/status")
        await asyncio.gather(*(get_status(session, f"{single}/status") for _ in range(20)))
        await asyncio.gather(*(get_metrics(session, f"{single}/metrics") for _ in range(5)))
        assert reads_total(await get_metrics(session, f"{single}/metrics")) == 1


async def test_healthz_and_unknown_routes(single: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{single}/healthz", timeout=LONG) as resp:
            assert resp.status == 200 and (await resp.json())["ok"] is True
        async with session.get(f"{single}/nodes/gpu-a/status", timeout=LONG) as resp:
            assert resp.status == 404  # single-node mode has no fleet routes


async def test_fleet_lists_and_serves_each_node(fleet: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{fleet}/nodes", timeout=LONG) as resp:
            names = (await resp.json())["nodes"]
        assert names == ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
        for name in names:
            assert (await get_status(session, f"{fleet}/nodes/{name}/status")).node == name
        metrics = await get_metrics(session, f"{fleet}/nodes/gpu-c/metrics")
        assert {labels["Hostname"] for labels, _ in metrics["DCGM_FI_DEV_GPU_TEMP"]} == {"gpu-c"}
        assert len(metrics["DCGM_FI_DEV_GPU_TEMP"]) == 8
        async with session.get(f"{fleet}/nodes/nope/status", timeout=LONG) as resp:
            assert resp.status == 404
        async with session.get(f"{fleet}/status", timeout=LONG) as resp:
            assert resp.status == 404


async def test_runtime_nvml_error_fails_status_and_counts_until_cleared(fleet: str) -> None:
    url = f"{fleet}/nodes/gpu-d"
    async with aiohttp.ClientSession() as session:
        assert (await post_faults(session, f"{url}/faults", {"nvml_error": True})).status == 200
        async with session.get(f"{url}/status", timeout=LONG) as resp:
            assert resp.status == 503 and "NVML" in (await resp.json())["error"]
        metrics = await get_metrics(session, f"{url}/metrics")
        assert "DCGM_FI_DEV_GPU_UTIL" not in metrics  # no stale numbers while reads fail
        errors = {labels["kind"]: value for labels, value in metrics["hami_agent_read_errors_total"]}
        assert errors["read"] >= 1
        assert metrics["hami_agent_read_ok"][0][1] == 0
        await post_faults(session, f"{url}/faults", {"clear": True})
        assert (await get_status(session, f"{url}/status")).node == "gpu-d"


async def test_runtime_slow_fault_makes_status_slow(fleet: str) -> None:
    url = f"{fleet}/nodes/gpu-a"
    async with aiohttp.ClientSession() as session:
        await post_faults(session, f"{url}/faults", {"slow_s": 2})
        with pytest.raises(TimeoutError):
            async with session.get(f"{url}/status", timeout=SHORT):
                pass
        await post_faults(session, f"{url}/faults", {"clear": True})
        assert (await get_status(session, f"{url}/status")).node == "gpu-a"


async def test_runtime_hang_holds_status_but_not_the_agent_until_cleared(fleet: str) -> None:
    url = f"{fleet}/nodes/gpu-c"
    async with aiohttp.ClientSession() as session:
        await post_faults(session, f"{url}/faults", {"hang": True})
        for _ in range(2):
            with pytest.raises(TimeoutError):
                async with session.get(f"{url}/status", timeout=SHORT):
                    pass
        async with session.get(f"{fleet}/healthz", timeout=SHORT) as resp:
            assert resp.status == 200
        assert (await get_status(session, f"{fleet}/nodes/gpu-b/status")).node == "gpu-b"  # others unaffected
        await post_faults(session, f"{url}/faults", {"clear": True})
        assert len((await get_status(session, f"{url}/status")).gpus) == 8


async def test_runtime_ecc_fault_shows_in_status_and_metrics(fleet: str) -> None:
    url = f"{fleet}/nodes/gpu-a"
    async with aiohttp.ClientSession() as session:
        await post_faults(session, f"{url}/faults", {"ecc_uncorrected": 3, "gpu": 2})
        status = await get_status(session, f"{url}/status")
        metrics = await get_metrics(session, f"{url}/metrics")
        await post_faults(session, f"{url}/faults", {"clear": True})
    hit = status.gpus[2]
    assert hit.ecc is not None and hit.ecc.volatile_uncorrected == 3 and not hit.healthy
    assert all(g.healthy for g in status.gpus if g.index != 2)
    dbe = {labels["gpu"]: value for labels, value in metrics["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]}
    assert dbe == {"0": 0, "1": 0, "2": 3, "3": 0}


async def test_bad_fault_requests_are_refused(fleet: str) -> None:
    async with aiohttp.ClientSession() as session:
        assert (await post_faults(session, f"{fleet}/nodes/gpu-b/faults", {"bogus": 1})).status == 400
        assert (await post_faults(session, f"{fleet}/nodes/gpu-b/faults", [1])).status == 400
        assert (await post_faults(session, f"{fleet}/nodes/nope/faults", {"hang": True})).status == 404
        async with session.get(f"{fleet}/nodes/gpu-b/faults", timeout=LONG) as resp:
            assert (await resp.json())["runtime"]["hang"] is False


async def _gpus(base: str) -> list[tuple[object, ...]]:
    async with aiohttp.ClientSession() as session:
        status = await get_status(session, f"{base}/status")
    return [(g.uuid, g.utilisation_gpu, g.temperature_c, g.power_w, g.memory_used_mib) for g in status.gpus]


async def test_same_seed_and_clock_replay_the_same_readings() -> None:
    common = ("--simulate", CLUSTER, "--node-name", "gpu-c", "--sim-time", "42")
    with (
        agent(*common, "--seed", "5") as one,
        agent(*common, "--seed", "5") as two,
        agent(*common, "--seed", "6") as other,
    ):
        first, second, third = await _gpus(one), await _gpus(two), await _gpus(other)
    assert first == second
    assert first != third
    assert [g[0] for g in first] == [g[0] for g in third]  # identities do not depend on the seed


async def test_generated_fleet_serves_ten_thousand_nodes_lazily() -> None:
    with agent("--fleet-size", "10000", "--fleet-template", CLUSTER) as base:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/nodes", timeout=LONG) as resp:
                listing = await resp.json()
            status = await get_status(session, f"{base}/nodes/node-09999/status")
            async with session.get(f"{base}/nodes/node-10000/status", timeout=LONG) as resp:
                assert resp.status == 404
    assert listing["count"] == 10_000 and listing["nodes"][-1] == "node-09999"
    assert status.node == "node-09999" and len(status.gpus) == 1  # template 9999 % 4: gpu-d


def run_agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "agent.py"), "--listen", f"127.0.0.1:{free_port()}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_without_a_driver_and_without_simulate_it_exits_with_one_line() -> None:
    done = run_agent()
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "driver" in lines[0].lower() and "--simulate" in lines[0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--simulate", CLUSTER, "--node-name", "gpu-z"), "gpu-z"),
        (("--simulate", "/nonexistent.yaml"), "nonexistent"),
        (("--fleet-size", "3"), "--fleet-template"),
    ],
)
def test_bad_settings_exit_2_with_one_line(args: tuple[str, ...], fragment: str) -> None:
    done = run_agent(*args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0]
