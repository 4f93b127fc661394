"""agent.py's settings: one frozen dataclass of plain fields, filled from flags (or YAML by name)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hami.node.health import HealthSettings


@dataclass(frozen=True, slots=True)
class AgentSettings:
    listen: str = "127.0.0.1:9401"  # HOST:PORT to serve on ([v6]:PORT for IPv6)
    node_name: str = ""  # NVML: name to report (default $NODE_NAME, else host name); simulated: serve only it
    simulate: str = ""  # simulation file (config/sim/*.yaml); "" reads the real GPUs through NVML
    fleet_size: int = 0  # > 0: generate this many simulated nodes from fleet_template (scale tests)
    fleet_template: str = ""  # simulation file whose nodes the generated fleet cycles through ("" : simulate)
    fleet_prefix: str = "node-"  # generated nodes are named <prefix><zero-padded index>
    seed: int = 0  # seeds the simulated jitter: the same seed and clock replay the same readings
    sim_time_s: float = -1.0  # >= 0 freezes the simulation clock at this instant (reproducible runs)
    interval_s: float = 1.0  # the backend is read at most once per interval, however often scraped
    health: HealthSettings = field(default_factory=HealthSettings)  # when a card is reported unhealthy
