"""Settings of the live-state layer: one frozen dataclass per component, plain field types.

The lead's config loader maps the YAML section `state:` onto `StateSettings` by field name.
Every field has a default, so the embedded defaults run on a laptop with nothing else installed
(simulated inventory read in-process, no Redis, no Prometheus, no Kubernetes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

CONSERVATIVE = "conservative"
AGGRESSIVE = "aggressive"


@dataclass(frozen=True, slots=True)
class AgentSettings:
    timeout_s: float = 0.5  # one agent's /status answer must arrive within this, else the read fails
    concurrency: int = 32  # agents queried at the same time (semaphore)
    fail_max: int = 3  # consecutive failures that open a node's circuit breaker
    reset_timeout_s: float = 10.0  # seconds an open breaker waits before one trial call (half-open)


@dataclass(frozen=True, slots=True)
class PrometheusSettings:
    url: str = ""  # e.g. http://prometheus:9090; empty: no Prometheus, the agents' NVML sample is used
    query: str = "avg_over_time(DCGM_FI_DEV_GPU_UTIL[1m])"  # one instant query for all devices
    uuid_label: str = "UUID"  # the label of the query's result that names the device
    timeout_s: float = 1.0  # HTTP timeout of the query (it runs in a worker thread)


@dataclass(frozen=True, slots=True)
class CacheSettings:
    l1_ttl_s: float = 2.0  # in-process entries; never longer than the L2 entry they came from
    l2_ttl_s: float = 5.0  # Redis entries shared by all replicas
    namespace: str = "hami-webhook:cache"  # Redis key prefix
    timeout_s: float = 0.1  # one Redis cache round trip; slower counts as Redis down


@dataclass(frozen=True, slots=True)
class LedgerSettings:
    # One Redis reservation round trip (the only network call a request makes). A timeout refuses
    # that attempt (the decision re-places); only a run of timeouts switches to the in-process ledger.
    timeout_s: float = 0.25
    # How often the local view of all replicas' reservations is re-read from Redis: O(live reservations)
    # each time, and only a hint (Redis' own check decides), so not too often.
    refresh_s: float = 1.0
    retry_s: float = 1.0  # while Redis is down, how often the background task tries it again
    ttl_s: float = 60.0  # default life of a reservation nobody released (pod never bound)
    max_connections: int = 64  # Redis connections of one replica; a burst beyond waits for one
    prefix: str = "{hami-ledger}"  # Redis key prefix; the hash tag keeps all keys in one cluster slot


@dataclass(frozen=True, slots=True)
class InventorySettings:
    source: str = "simulated"  # simulated | static | kubernetes
    simulated_file: str = "config/sim/cluster.yaml"  # read in-process through hami.node.simulated.load_fleet
    simulated_seed: int = 0
    simulated_fleet_size: int = 0  # >0: that many nodes cycling through the file's nodes (scale tests, benches)
    agents: dict[str, str] = field(default_factory=dict)  # static: node name -> agent base URL (http://h:p)
    fleet_url: str = ""  # static: one fleet agent serving /nodes/{name}/status ...
    fleet_nodes: tuple[str, ...] = ()  # ... for these node names


@dataclass(frozen=True, slots=True)
class KubeSettings:
    kubeconfig: str = ""  # empty: in-cluster config, else this kubeconfig file
    node_selector: str = "nvidia.com/gpu.present=true"  # label selector of the GPU nodes to watch
    agent_namespace: str = "hami-system"  # where the node agents' pods run
    agent_selector: str = "app.kubernetes.io/name=hami-node-agent"  # label selector of the agents' pods
    agent_port: int = 9400  # the agents' HTTP port (/status, /metrics)
    watch_timeout_s: int = 300  # server-side timeout of one watch request; it is then resumed
    backoff_initial_s: float = 0.5  # first reconnect delay after a broken watch, doubled each failure
    backoff_max_s: float = 30.0  # reconnect delay cap


@dataclass(frozen=True, slots=True)
class StateSettings:
    interval_s: float = 1.0  # collector refresh period (watch events also trigger a refresh)
    degradation: str = CONSERVATIVE  # conservative: unknown nodes excluded; aggressive: last state kept
    max_stale_s: float = 30.0  # aggressive mode: last known state is used this long, then UNKNOWN
    redis_url: str = ""  # e.g. redis://redis:6379/0; empty: L1 cache and in-process ledger only
    agents: AgentSettings = field(default_factory=AgentSettings)
    prometheus: PrometheusSettings = field(default_factory=PrometheusSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    ledger: LedgerSettings = field(default_factory=LedgerSettings)
    inventory: InventorySettings = field(default_factory=InventorySettings)
    kube: KubeSettings = field(default_factory=KubeSettings)
