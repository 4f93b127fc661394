"""The simulated backend: nodes described in YAML, read as if through NVML.

A reading is a pure function of (node spec, seed, simulated time, active faults), so a fleet
replays identically from the same seed and clock. The only mutable state is each node's
runtime faults (the drills switch them over HTTP). A generated fleet of thousands of nodes is
built lazily, node by node, on first access, and needs no background task at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from hami.node.backend import BackendError
from hami.node.faults import Faults, FaultState
from hami.node.health import HealthSettings, verdict
from hami.node.schema import EccCounts, GpuStatus, NodeStatus
from hami.node.simspec import GpuSpec, NodeSpec, load_specs

Clock = Callable[[], float]  # simulated seconds since the simulation started
_HANG_POLL_S = 0.05  # how often a hung read looks whether its fault was cleared
_NOTHING: frozenset[str] = frozenset()
_NO_ECC_ERRORS = EccCounts(0, 0, 0, 0)  # frozen: the one record every healthy card shares


class SimClock:
    """Simulated time: seconds since construction, or a fixed instant (tests, reproducible demos)."""

    __slots__ = ("_frozen", "_start")

    def __init__(self, frozen_at: float | None = None) -> None:
        self._start = time.monotonic()
        self._frozen = frozen_at

    def __call__(self) -> float:
        return self._frozen if self._frozen is not None else time.monotonic() - self._start


_METRICS = ("util", "mem", "temp", "power")  # one noise draw each per card and period


_UNPACK = struct.Struct(">" + "Q" * len(_METRICS)).unpack
_TWO_TO_MINUS_63 = 2.0**-63


def _draws(seed: int, node: str, index: int, bucket: int) -> tuple[float, ...]:
    """Deterministic draws in [-1, 1), one per metric in _METRICS order, from one hash (stable
    across processes, unlike hash()). A tuple, not a dict: a fleet sweep draws for every card."""
    digest = hashlib.blake2b(f"{seed}|{node}|{index}|{bucket}".encode(), digest_size=8 * len(_METRICS)).digest()
    # A list comprehension, not a generator: this runs for every card of every sweep. Scaling by
    # 2**-63 is exact, so the draws are the same as v / 2**63.
    return tuple([v * _TWO_TO_MINUS_63 - 1.0 for v in _UNPACK(digest)])


def gpu_uuid(node: str, index: int) -> str:
    """A card's identity depends on where it sits, not on the jitter seed, so the collector and
    the webhook's in-process default see the same UUIDs whatever seed an agent runs with."""
    digest = hashlib.blake2b(f"{node}/{index}".encode(), digest_size=16).digest()
    return f"GPU-{uuid.UUID(bytes=digest)}"


class SimulatedNode:
    """One simulated node; implements Backend."""

    __slots__ = ("_clock", "_health", "_uuids", "faults", "node_name", "seed", "spec")

    backend_name = "simulated"

    def __init__(
        self,
        spec: NodeSpec,
        *,
        seed: int = 0,
        clock: Clock | None = None,
        health: HealthSettings = HealthSettings(),  # noqa: B008 - frozen, safe to share
    ) -> None:
        self.spec = spec
        self.node_name = spec.name
        self.seed = seed
        self.faults = FaultState(spec.faults)
        self._clock: Clock = clock or SimClock()
        self._health = health
        self._uuids: tuple[str, ...] | None = None

    def active_faults(self) -> tuple[Faults, ...]:
        return self.faults.active(self._clock())

    async def read(self) -> NodeStatus:
        # Yield first: a collector reading thousands of in-process nodes must not hold the event
        # loop (and the admissions waiting on it) for the whole sweep.
        await asyncio.sleep(0)
        active = self.active_faults()
        slow_s = max((f.slow_s for f in active), default=0.0)
        if slow_s > 0:
            await asyncio.sleep(slow_s)
        # A hang lasts as long as some fault says so: a drill clears it over HTTP, a scheduled
        # one ends with its window. Polling keeps this free of per-node tasks and events.
        while any(f.hang for f in self.active_faults()):  # noqa: ASYNC110 - see above
            await asyncio.sleep(_HANG_POLL_S)
        active = self.active_faults()
        if any(f.nvml_error for f in active):
            raise BackendError(f"{self.node_name}: NVML error: Unknown Error (injected fault)")
        return self.sample(self._clock(), active)

    def sample(self, t: float, active: tuple[Faults, ...] | None = None) -> NodeStatus:
        """The node's state at simulated time `t` under `active` faults (those of `t` when None). Pure."""
        if active is None:
            active = self.faults.active(t)
        unsupported = frozenset(call for f in active for call in f.unsupported) if active else _NOTHING
        errors = [f"gpu{i}.{call}: Not Supported" for i in range(len(self.spec.gpus)) for call in sorted(unsupported)]
        # A card spec's curves at `t`, evaluated once per node: `count: 8` repeats one spec object,
        # and a fleet sweep samples every card of every node.
        curves: dict[int, tuple[float, float, float, float, float | None]] = {}
        gpus = tuple(self._gpu(i, g, t, active, unsupported, curves) for i, g in enumerate(self.spec.gpus))
        return NodeStatus(
            node=self.node_name,
            observed_at=time.time(),
            backend=self.backend_name,
            gpus=gpus,
            driver_version=self.spec.driver_version,
            errors=tuple(errors),
        )

    def _uuid(self, index: int) -> str:
        if self._uuids is None:  # computed once per node, on its first read
            self._uuids = tuple(gpu_uuid(self.node_name, k) for k in range(len(self.spec.gpus)))
        return self._uuids[index]

    def _gpu(
        self,
        i: int,
        g: GpuSpec,
        t: float,
        active: tuple[Faults, ...],
        unsupported: frozenset[str],
        curves: dict[int, tuple[float, float, float, float, float | None]],
    ) -> GpuStatus:
        jitter = self.spec.jitter
        n_util, n_mem, n_temp, n_power = _draws(self.seed, self.node_name, i, int(t // jitter.period_s))
        hitting = [f for f in active if f.hits(i)] if active else ()
        at_t = curves.get(id(g))
        if at_t is None:
            at_t = curves[id(g)] = (
                g.memory_used_mib.at(t) if g.memory_used_mib else sum(p.used_memory_mib for p in g.processes),
                g.utilisation_gpu.at(t),
                g.utilisation_memory.at(t),
                g.temperature_c.at(t),
                g.power_w.at(t) if g.power_w is not None else None,
            )
        used_raw, util_gpu_at, util_mem_at, temperature_at, power_at = at_t
        total = g.memory_total_mib
        # Clamped inline (min of max): this runs for every card of every sweep of the fleet.
        used = int(min(total, max(0, used_raw)))
        util_gpu = min(100, max(0, util_gpu_at + n_util * jitter.utilisation))
        util_mem = min(100, max(0, util_mem_at + n_mem * jitter.utilisation))
        spike = sum(f.temp_spike_c for f in hitting) if hitting else 0
        temperature = temperature_at + spike + n_temp * jitter.temperature_c
        power: float | None = None
        if power_at is not None:
            power = power_at
        elif g.power_limit_w is not None:
            # No power curve: a card idles near a fifth of its limit and approaches it at full load.
            power = g.power_limit_w * (0.2 + 0.7 * util_gpu / 100)
        if power is not None:
            power = max(0.0, power + n_power * jitter.power_w)

        ecc = None
        if g.ecc and "ecc" not in unsupported:
            if hitting:
                corrected = sum(f.ecc_corrected for f in hitting)
                uncorrected = sum(f.ecc_uncorrected for f in hitting)
                ecc = EccCounts(corrected, uncorrected, corrected, uncorrected)
            else:
                ecc = _NO_ECC_ERRORS
        temperature_c = None if "temperature" in unsupported else round(temperature, 1)
        healthy, reason = verdict(ecc=ecc, temperature_c=temperature_c, memory_readable=True, settings=self._health)
        return GpuStatus(
            uuid=g.uuid or self._uuid(i),
            index=i,
            model=g.model,
            memory_total_mib=total,
            memory_used_mib=used,
            memory_free_mib=total - used,
            utilisation_gpu=None if "utilisation" in unsupported else round(util_gpu, 1),
            utilisation_memory=None if "utilisation" in unsupported else round(util_mem, 1),
            temperature_c=temperature_c,
            power_w=None if power is None or "power" in unsupported else round(power, 1),
            power_limit_w=None if "power" in unsupported else g.power_limit_w,
            ecc=ecc,
            processes=() if "processes" in unsupported else g.processes,
            healthy=healthy,
            health_reason=reason,
        )


def load_fleet(
    path: str | Path,
    seed: int = 0,
    *,
    clock: Clock | None = None,
    health: HealthSettings = HealthSettings(),  # noqa: B008 - frozen, safe to share
) -> dict[str, SimulatedNode]:
    """Every node of a simulation file, by name, sharing one clock. Raises SpecError on a bad file."""
    clock = clock or SimClock()
    return {s.name: SimulatedNode(s, seed=seed, clock=clock, health=health) for s in load_specs(path)}


class GeneratedFleet(Mapping[str, SimulatedNode]):
    """`size` nodes named `<prefix><i>` cycling through the template nodes, built on first access.

    Scale tests serve 10,000 nodes of 8 cards from one process: nothing per node exists until it
    is asked for, and then only a small object sharing the template's (immutable) card specs.
    """

    def __init__(
        self,
        templates: tuple[NodeSpec, ...],
        size: int,
        *,
        seed: int = 0,
        prefix: str = "node-",
        clock: Clock | None = None,
        health: HealthSettings = HealthSettings(),  # noqa: B008 - frozen, safe to share
    ) -> None:
        if not templates:
            raise ValueError("a generated fleet needs at least one template node")
        self._templates = templates
        self._size = size
        self._seed = seed
        self._prefix = prefix
        self._width = max(5, len(str(max(size - 1, 0))))
        self._clock = clock or SimClock()
        self._health = health
        self._built: dict[str, SimulatedNode] = {}

    def _index(self, name: str) -> int | None:
        digits = name[len(self._prefix) :]
        if not name.startswith(self._prefix) or len(digits) != self._width or not digits.isdigit():
            return None
        index = int(digits)
        return index if index < self._size else None

    def __getitem__(self, name: str) -> SimulatedNode:
        node = self._built.get(name)
        if node is None:
            index = self._index(name)
            if index is None:
                raise KeyError(name)
            spec = replace(self._templates[index % len(self._templates)], name=name)
            node = self._built[name] = SimulatedNode(spec, seed=self._seed, clock=self._clock, health=self._health)
        return node

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._index(name) is not None

    def __iter__(self) -> Iterator[str]:
        return (f"{self._prefix}{i:0{self._width}d}" for i in range(self._size))

    def __len__(self) -> int:
        return self._size


def generate_fleet(
    template_path: str | Path,
    size: int,
    seed: int = 0,
    *,
    prefix: str = "node-",
    clock: Clock | None = None,
    health: HealthSettings = HealthSettings(),  # noqa: B008 - frozen, safe to share
) -> GeneratedFleet:
    return GeneratedFleet(load_specs(template_path), size, seed=seed, prefix=prefix, clock=clock, health=health)
