"""Placement settings: plain values the lead's config loader maps from YAML by field name."""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("binpack", "spread", "frag", "fgd", "latency", "random", "bestfit")


@dataclass(frozen=True, slots=True)
class PlacementSettings:
    default_policy: str = "binpack"  # policy when the pod names none; one of POLICIES
    max_temperature_c: float = 85.0  # hotter devices are filtered as unhealthy
    max_ecc_uncorrected: int = 0  # more uncorrected ECC errors than this: unhealthy
    separate_workloads: bool = True  # never put training and inference on one device
    # A workload type that implies a utilisation bound (percent) when the pod sets none itself.
    workload_max_util: dict[str, float] = field(default_factory=lambda: {"latency-sensitive": 30.0})
    max_pods_per_gpu: int = 10  # HAMi's default device split count
    degradation: str = "conservative"  # conservative: stale/unknown-util excluded; aggressive: ranked lower
    # binpack/spread: nodes the best-first search may check before it settles for what it found (or
    # denies); -1 adaptive like kube-scheduler's percentageOfNodesToScore, 0 every node, N that many.
    max_nodes_scored: int = -1
    runners_up: int = 3  # candidates kept in the decision to explain why they lost
    # Seconds between two syncs of the index's applied reservations with the ledger's overlay on the
    # request path; O(overlay) each, so not on every admission. This replica's own reservations are
    # applied at once; the sync only brings expiries and releases (late = conservative) and other
    # replicas' reservations (Redis' check stays the authority; a refused reservation syncs at once).
    overlay_sync_s: float = 0.5
    frag_threshold_pct: float = 95.0  # typical-shape mix: most popular shapes up to this share (the study ran 95)


def nodes_to_check(settings: PlacementSettings, cluster: int) -> int:
    """The check budget for a cluster of `cluster` nodes; 0 means no limit.

    Adaptive (-1) is kube-scheduler's formula: max(100, N·(50 − N/125)%), the percentage never
    below 5%, so it grows sublinearly at first and as 5% of N beyond ~5,600 nodes.
    """
    if settings.max_nodes_scored >= 0:
        return settings.max_nodes_scored
    pct = max(5.0, 50.0 - cluster / 125)
    return max(100, int(cluster * pct / 100))
