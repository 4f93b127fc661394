"""Loading the openb traces (Alibaba, "Beware of Fragmentation", USENIX ATC 2023) into our model.

Capacity model: every GPU has `memory_total_mib = 1000`, so one "MiB" is one milli-GPU and a pod's
`gpu_milli` maps exactly onto memory (all openb shares are whole milli). Cores stay 0 (no SM limit):
gpu_milli is already the whole share, and percent cores could not carry milli precision anyway.
`num_gpu > 1` asks whole GPUs (gpu_milli 1000 each); `gpu_spec` lists acceptable models, separated
by `|` in the data (commas accepted too). CPU-only pods (num_gpu 0) are host-only requests.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from hami.placement.frag import Shape, ShapeMix
from hami.requests import ContainerGpuRequest, GpuRequest
from hami.state.model import Gpu, Node

CARD = 1000  # memory units per GPU: one per milli-GPU


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    models: tuple[str, ...]

    @property
    def gpu_demand_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    def shape(self) -> Shape:
        return Shape(self.num_gpu, self.gpu_milli, self.cpu_milli, self.models)

    def request(self, policy: str) -> GpuRequest:
        containers = ()
        if self.num_gpu > 0:
            containers = (
                ContainerGpuRequest("main", "containers", 0, self.num_gpu, memory_mib=self.gpu_milli, cores=0),
            )
        return GpuRequest(
            containers=containers,
            use_types=self.models,
            node_policy=policy,
            gpu_policy=policy,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
        )


def load_nodes(path: Path) -> list[Node]:
    nodes = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            name, count = row["sn"], int(row["gpu"] or 0)
            gpus = tuple(Gpu(f"{name}-gpu{i}", i, row.get("model") or "", CARD) for i in range(count))
            nodes.append(Node(name, gpus, cpu_milli_free=int(row["cpu_milli"]), memory_mib_free=int(row["memory_mib"])))
    return nodes


def load_pods(path: Path) -> list[TracePod]:
    """Any openb pod list; columns beyond name/cpu/memory/num_gpu/gpu_milli are optional."""
    pods = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            num_gpu = int(row.get("num_gpu") or 0)
            milli = int(row.get("gpu_milli") or 0) if num_gpu else 0
            spec = (row.get("gpu_spec") or "").strip()
            models = tuple(m for m in re.split(r"[|,]", spec) if m)
            pods.append(
                TracePod(
                    row["name"], int(row.get("cpu_milli") or 0), int(row.get("memory_mib") or 0), num_gpu, milli, models
                )
            )
    return pods


def typical_mix(pods: list[TracePod], threshold_pct: float = 95.0, step: int = 1, cpu_pods: bool = True) -> ShapeMix:
    """The study's typical pods as its experiments configure them (`typicalPodsConfig` in
    `scripts/generate_config_and_run.py`: isInvolvedCpuPods true, podPopularityThreshold 95,
    podIncreaseStep 1, gpuResWeight 0): every pod's (CPU, GPU share, GPU count, model) shape by
    popularity, cut at `threshold_pct`. Host-only shapes count all free GPU share as fragment."""
    return ShapeMix.from_shapes((p.shape() for p in pods if cpu_pods or p.num_gpu > 0), threshold_pct, step)
