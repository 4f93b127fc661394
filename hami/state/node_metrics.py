"""Per-node gauges, made at scrape time from the collectors' own state.

Kept as gauge children, set after every sweep, they cost about 17 MB and 30,000 `labels().set()`
calls per sweep at 10,000 nodes, for figures the collector holds anyway. A custom collector (the
registry calls its `collect()` on each scrape: prometheus_client's way to export state kept
elsewhere) builds them from the current snapshot and breakers instead, once per scrape.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as RegistryCollector

if TYPE_CHECKING:
    from hami.state.collector import Collector

BREAKER_CLOSED, BREAKER_HALF_OPEN, BREAKER_OPEN = 0, 1, 2
BREAKER_LEVEL = {"closed": BREAKER_CLOSED, "half-open": BREAKER_HALF_OPEN, "open": BREAKER_OPEN}


class NodeGauges(RegistryCollector):
    """The per-node gauges of every live state collector (one in a server; tests make several)."""

    def __init__(self) -> None:
        self._sources: weakref.WeakSet[Collector] = weakref.WeakSet()

    def watch(self, collector: Collector) -> None:
        self._sources.add(collector)

    def collect(self) -> Iterator[Metric]:
        breaker = GaugeMetricFamily(
            "hami_webhook_node_breaker_state",
            "Circuit breaker of a node's agent: 0 closed, 1 half-open, 2 open",
            labels=["node"],
        )
        promised = GaugeMetricFamily(
            "hami_webhook_gpu_memory_promised_mib", "GPU memory promised to bound pods on a node (MiB)", labels=["node"]
        )
        used = GaugeMetricFamily(
            "hami_webhook_gpu_memory_used_mib", "GPU memory really in use on a node per NVML (MiB)", labels=["node"]
        )
        for source in list(self._sources):
            for name, cb in list(source.breakers.items()):
                breaker.add_metric([name], BREAKER_LEVEL.get(cb.current_state, BREAKER_OPEN))
            for node in source.snapshot.nodes:
                promised.add_metric([node.name], sum(g.memory_promised_mib for g in node.gpus))
                used.add_metric([node.name], sum(g.memory_used_mib for g in node.gpus))
        yield breaker
        yield promised
        yield used

    def describe(self) -> Iterator[Metric]:
        # Without describe() the registry would call collect() at registration to learn the names.
        return iter(())


NODE_GAUGES = NodeGauges()
REGISTRY.register(NODE_GAUGES)
