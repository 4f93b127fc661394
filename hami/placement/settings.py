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
    max_nodes_scored: int = (
        0  # 0 scores every feasible node; N stops after N (kube-scheduler's percentageOfNodesToScore)
    )
    runners_up: int = 3  # candidates kept in the decision to explain why they lost
    frag_threshold_pct: float = 60.0  # shape mix covers the most popular shapes up to this share of requests
