"""Failure drills: real agents, Redis and Prometheus, one fault per phase, a steady stream of decisions.

For each degradation mode a collector + Redis ledger pair replays GPU-pod admissions while the
drill breaks things: an agent killed, an agent slow (2 s), an agent flapping, NVML errors, Redis
killed, Prometheus killed, then everything restored. Per phase and mode it reports admissions
answered, errors, p99 latency, breaker states, and how many decisions used a stale node or were
made while some node was excluded. Both modes run side by side on the same faults.

Admissions go through the real decision code (`DecisionAdmission`): per mode a `Runtime` adopts
the drill's collector and ledger, and `hami.decide.Decider` answers real AdmissionRequests, so
validation, the placement engine, the ledger reservation and the patch all run as in `serve`.
Every `pinned_every`-th pod asks for the faulted node by hostname: only those can show what each
degradation mode does with a node it cannot see (the rest fit elsewhere, fresh nodes rank first).
`--stand-in` swaps in the old first-fit stand-in (`first_fit_admission`) for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import structlog

from hami import config as config_mod
from hami.admission import decode_review
from hami.decide import Decider
from hami.runtime import Runtime
from hami.state.collector import Collector, StateLayer
from hami.state.inventory import static_inventory
from hami.state.ledger import InProcessLedger, Ledger, RedisLedger
from hami.state.model import Freshness, ReservationItem, Snapshot
from hami.state.promql import PromUtilisation
from hami.state.settings import (
    AGGRESSIVE,
    CONSERVATIVE,
    AgentSettings,
    InventorySettings,
    LedgerSettings,
    PrometheusSettings,
    StateSettings,
)

log = structlog.get_logger(__name__)
REPO = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"
PHASES = (
    "baseline",
    "agent_down",
    "agent_slow",
    "agent_flapping",
    "nvml_errors",
    "redis_killed",
    "prometheus_killed",
    "recovery",
)


@dataclass(frozen=True, slots=True)
class DrillSettings:
    simulate: str = "config/sim/cluster.yaml"  # simulated inventory; one agent process per node
    phase_s: float = 3.0  # length of each phase
    rate_per_s: float = 40.0  # admissions per second, per degradation mode
    memory_mib: int = 1024  # what each drill pod asks on one device
    reservation_ttl_s: float = 2.0  # short, so the drill never runs out of room
    modes: tuple[str, ...] = (CONSERVATIVE, AGGRESSIVE)
    redis: bool = True  # start a redis-server (else the in-process ledger)
    prometheus: bool = True  # start a Prometheus scraping the agents
    interval_s: float = 0.5  # collector refresh
    agent_timeout_s: float = 0.5
    fail_max: int = 3
    reset_timeout_s: float = 2.0
    max_stale_s: float = 10.0
    pinned_every: int = 4  # every Nth pod asks for the faulted node by hostname (0: none)
    stand_in: bool = False  # admit with the first-fit stand-in instead of the real decision path


@dataclass(frozen=True, slots=True)
class Outcome:
    admitted: bool
    node: str = ""
    freshness: Freshness | None = None
    reason: str = ""
    error: bool = False  # what the webhook would have answered with a 500 (result "error")


Admission = Callable[[Collector, Ledger, int], Awaitable[Outcome]]


def _first_fit(snapshot: Snapshot, ledger: Ledger, need_mib: int) -> tuple[str, ReservationItem, Freshness] | None:
    overlay = ledger.overlay()
    for node in snapshot.nodes:
        if node.freshness is Freshness.UNKNOWN:
            continue
        for gpu in node.gpus:
            pending = overlay.get(gpu.uuid)
            free = gpu.effective_free_mib - (pending.memory_mib if pending else 0)
            if gpu.healthy and free >= need_mib:
                item = ReservationItem(node.name, gpu.uuid, need_mib, 0, capacity_mib=gpu.effective_free_mib)
                return node.name, item, node.freshness
    return None


def first_fit_admission(memory_mib: int, ttl_s: float) -> Admission:
    """The stand-in decision: first device with room, reserved; one retry on a refused reserve."""

    async def admit(collector: Collector, ledger: Ledger, seq: int) -> Outcome:
        for _ in range(2):  # a refusal means another decision took the room: place again on the fresh overlay
            found = _first_fit(collector.snapshot, ledger, memory_mib)
            if found is None:
                return Outcome(False, reason="no device with room")
            node, item, freshness = found
            result = await ledger.reserve(f"drill/pod-{seq}", [item], ttl_s)
            if result.ok:
                return Outcome(True, node, freshness)
        return Outcome(False, reason=result.reason)

    return admit


# ---- the real decision path ----------------------------------------------------------------------


def drill_review(seq: int, memory_mib: int, node: str = "") -> dict[str, Any]:
    """An AdmissionReview for a new GPU pod, as kube-apiserver sends it (unique name per `seq`)."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "cuda",
                "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                "resources": {"limits": {"nvidia.com/gpumem": str(memory_mib)}},
            }
        ]
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"drill-{seq}", "namespace": "drill"}, "spec": spec}
    request = {
        "uid": f"drill-{seq}",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "name": pod["metadata"]["name"],
        "namespace": "drill",
        "operation": "CREATE",
        "userInfo": {"username": "drill", "groups": ["system:authenticated"]},
        "object": pod,
        "dryRun": False,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


class DecisionAdmission:
    """The real path: one Runtime per collector (per degradation mode), answering through Decider."""

    def __init__(self, settings: DrillSettings) -> None:
        self.s = settings
        self.deciders: dict[int, Decider] = {}  # id(collector) -> its mode's decider
        self.calls: dict[int, int] = {}  # id(collector) -> admissions so far (the pinning count is per mode)
        self.pin_node = ""  # the faulted node, which every pinned_every-th pod asks for

    def attach(self, collector: Collector, ledger: Ledger, pin_node: str) -> None:
        """Decide on this collector's snapshots with a config whose state section is the collector's.

        placement.degradation is set to the same mode: Runtime builds its index from the state's
        mode, but Decider passes config.placement to place(), whose filters read their own copy."""
        state = asdict(collector.settings)
        overrides = {"state": state, "placement": {"degradation": state["degradation"]}}
        config = config_mod.load(None, environ={}, overrides=overrides)
        runtime = Runtime(config)
        runtime.adopt(StateLayer(collector, ledger, None))  # the drill closes the layer itself
        self.deciders[id(collector)] = Decider(runtime)
        self.pin_node = pin_node

    async def __call__(self, collector: Collector, ledger: Ledger, seq: int) -> Outcome:
        every, n = self.s.pinned_every, self.calls.get(id(collector), 0)
        self.calls[id(collector)] = n + 1
        node = self.pin_node if every > 0 and n % every == 0 else ""
        request = decode_review(orjson.dumps(drill_review(seq, self.s.memory_mib, node)))
        outcome = await self.deciders[id(collector)].decide(request, "mutate")
        if outcome.result == "error":
            return Outcome(False, reason=outcome.verdict.message, error=True)
        decision = outcome.fields.get("decision") or {}
        if outcome.result != "patched" or not decision.get("node"):
            return Outcome(False, reason=outcome.verdict.message)
        freshness = Freshness.STALE if decision.get("stale") else Freshness.FRESH
        return Outcome(True, str(decision["node"]), freshness)


# ---- processes --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


async def _wait_port(port: int, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                _, writer = await asyncio.open_connection(LOOPBACK, port)
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.05)


class Proc:
    def __init__(self, name: str, argv: list[str], port: int, workdir: Path) -> None:
        self.name, self.argv, self.port, self.workdir = name, argv, port, workdir
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self, timeout_s: float = 30.0) -> None:
        with (self.workdir / f"{self.name}.log").open("ab") as out:
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            # Popen returns once the child is forked; the wait for readiness below is async.
            self.proc = subprocess.Popen(  # noqa: ASYNC220
                self.argv, cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT, env=env
            )
        await _wait_port(self.port, timeout_s)

    def kill(self) -> None:
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
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


def _node_names(simulate: Path) -> list[str]:
    from hami.node.simulated import load_fleet

    return list(load_fleet(simulate))


def _prometheus_config(workdir: Path, targets: Sequence[str]) -> Path:
    path = workdir / "prometheus.yml"
    path.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: agents\n"
        f"    static_configs:\n      - targets: [{', '.join(repr(t) for t in targets)}]\n"
    )
    return path


# ---- the drill --------------------------------------------------------------------------------


@dataclass
class PhaseStats:
    phase: str
    mode: str
    answered: int = 0
    admitted: int = 0
    denied: int = 0  # answered with a denial (no fit, conflict): an answer, not an error
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    stale_used: int = 0
    while_excluded: int = 0
    fallback_reserves: int = 0
    breakers: dict[str, str] = field(default_factory=dict)
    freshness: dict[str, str] = field(default_factory=dict)
    utilisation_known: bool = True

    def p99_ms(self) -> float:
        if not self.latencies_ms:
            return 0.0
        ordered = sorted(self.latencies_ms)
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        del doc["latencies_ms"]
        doc["p99_ms"] = self.p99_ms()
        return doc


class Drill:
    def __init__(self, settings: DrillSettings, admission: Admission | None = None) -> None:
        self.s = settings
        if admission is None:
            stand_in = settings.stand_in
            admission = first_fit_admission(settings.memory_mib, settings.reservation_ttl_s) if stand_in else None
        self.admission: Admission = admission or DecisionAdmission(settings)
        self.tmp = Path(tempfile.mkdtemp(prefix="hami-drill-"))
        self.simulate = (
            (REPO / settings.simulate) if not Path(settings.simulate).is_absolute() else Path(settings.simulate)
        )
        self.agents: dict[str, Proc] = {}
        self.redis: Proc | None = None
        self.prom: Proc | None = None
        self.stacks: dict[str, tuple[Collector, Ledger]] = {}
        self._flapper: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        for name in _node_names(self.simulate):
            port = _free_port()
            argv = [sys.executable, str(REPO / "agent.py"), "--listen", f"{LOOPBACK}:{port}"]
            argv += ["--simulate", str(self.simulate), "--node-name", name]
            self.agents[name] = Proc(f"agent-{name}", argv, port, self.tmp)
        starts = [a.start() for a in self.agents.values()]
        if self.s.redis and shutil.which("redis-server"):
            port = _free_port()
            argv = ["redis-server", "--port", str(port), "--bind", LOOPBACK, "--save", "", "--appendonly", "no"]
            self.redis = Proc("redis", argv, port, self.tmp)
            starts.append(self.redis.start())
        if self.s.prometheus and shutil.which("prometheus"):
            port = _free_port()
            config = _prometheus_config(self.tmp, [f"{LOOPBACK}:{a.port}" for a in self.agents.values()])
            argv = ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={self.tmp / 'tsdb'}"]
            argv.append(f"--web.listen-address={LOOPBACK}:{port}")
            self.prom = Proc("prometheus", argv, port, self.tmp)
            starts.append(self.prom.start())
        await asyncio.gather(*starts)
        for mode in self.s.modes:
            settings = StateSettings(
                interval_s=self.s.interval_s,
                degradation=mode,
                max_stale_s=self.s.max_stale_s,
                agents=AgentSettings(self.s.agent_timeout_s, 16, self.s.fail_max, self.s.reset_timeout_s),
                prometheus=PrometheusSettings(url=self.prom.url if self.prom else ""),
                inventory=InventorySettings(source="static", agents={n: a.url for n, a in self.agents.items()}),
            )
            ledger: Ledger
            # Pods never bind in the drill: a short TTL is what frees their reservations.
            ledger_settings = LedgerSettings(
                timeout_s=0.1, prefix=f"{{drill-{mode}}}", retry_s=0.5, ttl_s=self.s.reservation_ttl_s
            )
            if self.redis is not None:
                ledger = RedisLedger(f"redis://{LOOPBACK}:{self.redis.port}/0", ledger_settings)
            else:
                ledger = InProcessLedger(ledger_settings)
            prom = PromUtilisation(settings.prometheus) if self.prom else None
            collector = Collector(settings, static_inventory(settings), utilisation=prom, ledger=ledger)
            await ledger.start()
            await collector.start()
            await collector.wait_ready()
            self.stacks[mode] = (collector, ledger)
            if isinstance(self.admission, DecisionAdmission):
                self.admission.attach(collector, ledger, self.victim)

    async def _fault(self, node: str, body: dict[str, Any]) -> None:
        agent = self.agents[node]
        if agent.proc is None or self._session is None:
            return
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self._session.post(f"{agent.url}/faults", json=body) as response:
                await response.read()

    async def _flap(self, node: str) -> None:
        broken = False
        while True:
            broken = not broken
            await self._fault(node, {"clear": True, "nvml_error": broken})
            await asyncio.sleep(0.4)

    async def _restore(self) -> None:
        if self._flapper is not None:
            self._flapper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flapper
            self._flapper = None
        restarts = [
            p.start() for p in [*self.agents.values(), self.redis, self.prom] if p is not None and p.proc is None
        ]
        await asyncio.gather(*restarts)
        await asyncio.gather(*(self._fault(n, {"clear": True}) for n in self.agents))

    @property
    def victim(self) -> str:
        """The node each fault hits (the others keep serving)."""
        return next(iter(self.agents), "")

    async def _inject(self, phase: str) -> None:
        victim = self.victim
        if phase == "agent_down":
            self.agents[victim].kill()
        elif phase == "agent_slow":
            await self._fault(victim, {"slow_s": 2})
        elif phase == "agent_flapping":
            self._flapper = asyncio.create_task(self._flap(victim))
        elif phase == "nvml_errors":
            await self._fault(victim, {"nvml_error": True})
        elif phase == "redis_killed" and self.redis is not None:
            self.redis.kill()
        elif phase == "prometheus_killed" and self.prom is not None:
            self.prom.kill()

    async def _one(self, stats: PhaseStats, collector: Collector, ledger: Ledger, seq: int) -> None:
        snapshot = collector.snapshot
        excluded = any(n.freshness is Freshness.UNKNOWN for n in snapshot.nodes)
        started = time.perf_counter()
        try:
            outcome = await self.admission(collector, ledger, seq)
        except Exception as exc:  # the drill counts what the real path would have turned into a 500
            stats.errors += 1
            log.warning("drill.admission_failed", error=repr(exc))
            return
        if outcome.error:
            stats.errors += 1
            log.warning("drill.admission_error", reason=outcome.reason)
            return
        stats.latencies_ms.append((time.perf_counter() - started) * 1000)
        stats.answered += 1
        stats.admitted += outcome.admitted
        stats.denied += not outcome.admitted
        stats.stale_used += outcome.freshness is Freshness.STALE
        stats.while_excluded += excluded
        stats.fallback_reserves += bool(getattr(ledger, "up", True) is False)

    async def run_phase(self, phase: str, seq0: int) -> list[PhaseStats]:
        await self._restore()
        await self._inject(phase)
        stats = {mode: PhaseStats(phase, mode) for mode in self.stacks}
        tasks: list[asyncio.Task[None]] = []
        period = 1.0 / self.s.rate_per_s
        deadline = time.monotonic() + self.s.phase_s
        seq = seq0
        while time.monotonic() < deadline:
            for mode, (collector, ledger) in self.stacks.items():
                tasks.append(asyncio.create_task(self._one(stats[mode], collector, ledger, seq)))
                seq += 1
            await asyncio.sleep(period)
        await asyncio.gather(*tasks)
        for mode, (collector, _) in self.stacks.items():
            st = stats[mode]
            st.breakers = {n: b.current_state for n, b in sorted(collector.breakers.items())}
            st.freshness = {n.name: n.freshness.value for n in collector.snapshot.nodes}
            st.utilisation_known = collector.snapshot.utilisation_known
        return list(stats.values())

    async def run(self) -> list[PhaseStats]:
        results: list[PhaseStats] = []
        for i, phase in enumerate(PHASES):
            results += await self.run_phase(phase, i * 1_000_000)
        return results

    async def close(self) -> None:
        if self._flapper is not None:
            self._flapper.cancel()
        for collector, ledger in self.stacks.values():
            await collector.close()
            await ledger.close()
            await collector.inventory.close()
        if self._session is not None:
            await self._session.close()
        for p in [*self.agents.values(), self.redis, self.prom]:
            if p is not None:
                p.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


async def run_drill(settings: DrillSettings = DrillSettings(), admission: Admission | None = None) -> list[PhaseStats]:
    """Start everything, run every phase, stop everything; the stats per phase and mode."""
    drill = Drill(settings, admission)
    try:
        await drill.start()
        return await drill.run()
    finally:
        await drill.close()


def render(results: Sequence[PhaseStats]) -> str:
    head = f"{'phase':<18} {'mode':<12} {'answered':>8} {'admitted':>8} {'denied':>6} {'errors':>6} {'p99 ms':>8}"
    head += f" {'stale':>6} {'excl':>6}"
    lines = [head + "  breakers open / freshness not fresh"]
    for r in results:
        opened = ",".join(n for n, s in r.breakers.items() if s != "closed") or "-"
        degraded = ",".join(f"{n}={f}" for n, f in r.freshness.items() if f != "fresh") or "-"
        util = "" if r.utilisation_known else "  utilisation unknown"
        lines.append(
            f"{r.phase:<18} {r.mode:<12} {r.answered:>8} {r.admitted:>8} {r.denied:>6} {r.errors:>6} "
            f"{r.p99_ms():>8.2f} {r.stale_used:>6} {r.while_excluded:>6}  {opened} / {degraded}{util}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    defaults = DrillSettings()
    parser = argparse.ArgumentParser(prog="drill", description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", default=defaults.simulate, metavar="FILE")
    parser.add_argument("--phase-s", type=float, default=defaults.phase_s)
    parser.add_argument("--rate", type=float, default=defaults.rate_per_s, help="admissions per second per mode")
    parser.add_argument("--mode", action="append", choices=(CONSERVATIVE, AGGRESSIVE), help="default: both")
    parser.add_argument("--no-redis", action="store_true")
    parser.add_argument("--no-prometheus", action="store_true")
    parser.add_argument("--stand-in", action="store_true", help="first-fit stand-in instead of the real decisions")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    rest = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(rest[1:] if rest[:1] == ["--"] else rest)  # `hami_webhook.py drill -- ARGS`
    if not structlog.is_configured():  # logs to stderr, so --json output stays parseable
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    settings = replace(
        defaults,
        simulate=args.simulate,
        phase_s=args.phase_s,
        rate_per_s=args.rate,
        modes=tuple(args.mode) if args.mode else defaults.modes,
        redis=not args.no_redis,
        prometheus=not args.no_prometheus,
        stand_in=args.stand_in,
    )
    results = asyncio.run(run_drill(settings))
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
