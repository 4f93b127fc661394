"""The cluster as the placement engine sees it: immutable values, no I/O.

The background collector builds a new `Snapshot` every refresh; the request path only reads it.
Memory is always MiB, cores always percent of one device (HAMi's unit), utilisation percent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType


class Freshness(StrEnum):
    """How much a node's state can be trusted (the degradation modes act on this)."""

    FRESH = "fresh"  # answered within the last refresh
    STALE = "stale"  # last known state, kept by the aggressive degradation mode
    UNKNOWN = "unknown"  # never answered, or breaker open under the conservative mode


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU and everything placement needs to know about it."""

    uuid: str
    index: int
    model: str
    memory_total_mib: int
    memory_used_mib: int = 0  # really in use, per NVML
    memory_promised_mib: int = 0  # promised to bound pods (pod watch), excluding reservations
    cores_promised: int = 0  # sum of gpucores percent promised to bound pods
    pods: int = 0  # pods sharing this device
    utilisation: float | None = None  # percent, from Prometheus; None when unknown
    temperature_c: float | None = None
    ecc_uncorrected: int | None = None  # None when ECC is off or unreadable
    healthy: bool = True  # the agent's own verdict (NVML errors, XID, ...)
    workload_types: frozenset[str] = frozenset()  # e.g. {"training"} of pods already on it

    @property
    def effective_free_mib(self) -> int:
        """Free memory that can be promised: total minus the larger of promised and really used.

        Taking the max is the point of the whole project: a card can look free by what was
        promised while an unaccounted process already filled it (the opening incident).
        """
        return max(0, self.memory_total_mib - max(self.memory_promised_mib, self.memory_used_mib))


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpus: tuple[Gpu, ...]
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    freshness: Freshness = Freshness.FRESH
    observed_at: float = 0.0  # unix time of the agent answer this state came from
    reason: str = ""  # why the node is stale/unknown (breaker open, timeout, ...)
    # Free host CPU and memory; None where the webhook does not track them (kube-scheduler does).
    # The trace replay sets them, since the study's protocol requires CPU and memory to fit.
    cpu_milli_free: int | None = None
    memory_mib_free: int | None = None

    def gpu(self, uuid: str) -> Gpu | None:
        """The card with this UUID: a scan, not a dict, for a node's handful of cards."""
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        return None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent view of the cluster. Replaced whole, never mutated."""

    nodes: tuple[Node, ...]
    taken_at: float = 0.0
    utilisation_known: bool = True  # False while Prometheus is unreachable
    version: int = 0  # increases with every snapshot the collector publishes
    _by_name: Mapping[str, Node] = field(default_factory=lambda: MappingProxyType({}), repr=False, compare=False)
    # Derived once here, in the background: validation reads it on every admission.
    largest_card_mib: int = field(default=0, init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", MappingProxyType({n.name: n for n in self.nodes}))
        largest = max((g.memory_total_mib for n in self.nodes for g in n.gpus), default=0)
        object.__setattr__(self, "largest_card_mib", largest)

    def node(self, name: str) -> Node | None:
        return self._by_name.get(name)


EMPTY_SNAPSHOT = Snapshot(nodes=(), taken_at=0.0, version=0)


@dataclass(frozen=True, slots=True)
class NamespaceUsage:
    """GPU resources counted against a namespace's quota. Memory in MiB, cores in percent of one device."""

    memory_mib: int = 0
    cores: int = 0
    gpus: int = 0

    def __add__(self, other: NamespaceUsage) -> NamespaceUsage:
        return NamespaceUsage(self.memory_mib + other.memory_mib, self.cores + other.cores, self.gpus + other.gpus)

    def __sub__(self, other: NamespaceUsage) -> NamespaceUsage:
        return NamespaceUsage(self.memory_mib - other.memory_mib, self.cores - other.cores, self.gpus - other.gpus)


def quota_usage(memory_mib: int, cores: int) -> NamespaceUsage:
    """What one device share counts against a quota (see `quota_cores`)."""
    return NamespaceUsage(memory_mib, quota_cores(cores), 1)


def quota_cores(cores: int) -> int:
    """A share with no SM limit uses the whole device's compute, so it counts as 100% cores
    against a quota (the validation rule's reading of HAMi's default)."""
    return cores if cores > 0 else 100


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """What is promised on one device beyond the snapshot: the ledger's pending reservations.

    Placement adds this overlay to the snapshot's figures, so a burst of admissions between two
    snapshots cannot promise the same memory twice.
    """

    memory_mib: int = 0
    cores: int = 0
    pods: int = 0
    workload_types: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ReservationItem:
    """One device's share of a pod's reservation. `capacity_mib`/`capacity_cores` are what the
    deciding replica saw as promisable on that device (total minus max(promised, used)); the
    ledger refuses a reservation that would push its own sum past them."""

    node: str
    uuid: str
    memory_mib: int
    cores: int
    capacity_mib: int
    capacity_cores: int = 100
    workload_type: str = ""
