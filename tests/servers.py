"""Real servers for integration tests: redis-server, prometheus and agent.py processes.

Each runs on a free 127.0.0.1 port with its own temporary directory and is stopped by its
fixture. A pytest plugin: list it in a conftest (`pytest_plugins = ["tests.servers"]`) or in a
test module to get the fixtures `redis_server`, `start_redis`, `start_prometheus`, `start_agent`.
A missing binary skips the test with the reason (CI installs them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def need_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (apt-get install {name}); CI installs it")
    return path


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.05)
    raise TimeoutError(f"{what} not ready after {timeout_s} s")


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback never goes through a proxy


def http_ok(url: str) -> bool:
    try:
        with _NO_PROXY.open(url, timeout=0.5) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


class Process:
    """A child process with a log file, stopped by SIGTERM then SIGKILL."""

    def __init__(self, name: str, argv: Sequence[str], workdir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.workdir = workdir
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{name}.log"

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.argv, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()

    def kill(self) -> None:
        """Abrupt death (SIGKILL): what a crash or an OOM kill looks like to clients."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def log_tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


class RedisServer(Process):
    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        argv = [need_binary("redis-server"), "--port", str(self.port), "--bind", LOOPBACK, "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(workdir), "--protected-mode", "yes"]
        super().__init__("redis", argv, workdir)

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def ping(self) -> bool:
        with socket.create_connection((LOOPBACK, self.port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")

    def start(self) -> None:
        super().start()
        wait_until(self.ping, 10, f"redis-server on port {self.port}")


class PrometheusServer(Process):
    """Prometheus scraping `targets` (host:port) every `interval_s` seconds."""

    def __init__(self, workdir: Path, targets: Sequence[str], interval_s: float = 1.0) -> None:
        self.port = free_port()
        config = workdir / "prometheus.yml"
        lines = [
            "global:",
            f"  scrape_interval: {round(interval_s * 1000)}ms",
            f"  evaluation_interval: {round(interval_s * 1000)}ms",
            "scrape_configs:",
            "  - job_name: agents",
            "    static_configs:",
            f"      - targets: [{', '.join(repr(t) for t in targets)}]",
        ]
        config.write_text("\n".join(lines) + "\n")
        argv = [
            need_binary("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address={LOOPBACK}:{self.port}",
        ]
        super().__init__("prometheus", argv, workdir)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> None:
        super().start()
        try:
            wait_until(lambda: http_ok(f"{self.url}/-/ready"), 30, f"prometheus on port {self.port}")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.log_tail()}") from exc


class AgentProcess(Process):
    """A real `agent.py` in simulate mode (one node, or the whole fleet when node_name is empty)."""

    def __init__(self, workdir: Path, simulate: Path, node_name: str = "") -> None:
        if not (REPO / "agent.py").exists():
            pytest.skip("agent.py is not in this checkout yet")
        self.port = free_port()
        argv = [
            sys.executable,
            str(REPO / "agent.py"),
            "--listen",
            f"{LOOPBACK}:{self.port}",
            "--simulate",
            str(simulate),
        ]
        if node_name:
            argv += ["--node-name", node_name]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        super().__init__(f"agent-{node_name or 'fleet'}-{self.port}", argv, workdir, env)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def target(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> None:
        super().start()
        try:
            wait_until(lambda: http_ok(f"{self.url}/healthz"), 20, f"agent on port {self.port}")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.log_tail()}") from exc


@contextlib.contextmanager
def _owned(factory_kind: str) -> Iterator[tuple[Path, list[Process]]]:
    started: list[Process] = []
    with tempfile.TemporaryDirectory(prefix=f"hami-{factory_kind}-") as tmp:
        try:
            yield Path(tmp), started
        finally:
            for p in reversed(started):
                p.stop()


@pytest.fixture
def start_redis() -> Iterator[Callable[[], RedisServer]]:
    """Factory: each call starts one more redis-server; all are stopped after the test."""
    with _owned("redis") as (tmp, started):

        def start() -> RedisServer:
            workdir = tmp / str(len(started))
            workdir.mkdir()
            server = RedisServer(workdir)
            started.append(server)
            server.start()
            return server

        yield start


@pytest.fixture
def redis_server(start_redis: Callable[[], RedisServer]) -> RedisServer:
    return start_redis()


@pytest.fixture
def start_prometheus() -> Iterator[Callable[..., PrometheusServer]]:
    """Factory: start_prometheus(targets, interval_s=1.0) -> a ready Prometheus scraping them."""
    with _owned("prometheus") as (tmp, started):

        def start(targets: Sequence[str], interval_s: float = 1.0) -> PrometheusServer:
            workdir = tmp / str(len(started))
            workdir.mkdir()
            server = PrometheusServer(workdir, targets, interval_s)
            started.append(server)
            server.start()
            return server

        yield start


@pytest.fixture
def start_agent() -> Iterator[Callable[..., AgentProcess]]:
    """Factory: start_agent(simulate_file, node_name="") -> a ready agent.py process."""
    with _owned("agent") as (tmp, started):

        def start(simulate: Path | str, node_name: str = "") -> AgentProcess:
            agent = AgentProcess(tmp, Path(simulate), node_name)
            started.append(agent)
            agent.start()
            return agent

        yield start
