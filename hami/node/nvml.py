"""The NVML backend: a real node's GPUs through pynvml (package nvidia-ml-py).

Every NVML call is guarded by NVML's own error type: a call that fails (Not Supported on a
consumer card, a transient error) leaves its field absent and is listed in `errors`; only
failing to enumerate the devices fails the whole read. NVML calls block, so reads run in a
worker thread and a stuck driver cannot freeze the agent's event loop (/healthz still answers).

The module is injected (`nvml=`) so the mapping can be tested without a GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

from hami.node.backend import BackendError, NoDriverError
from hami.node.health import HealthSettings, verdict
from hami.node.schema import EccCounts, GpuStatus, NodeStatus, ProcessUsage

T = TypeVar("T")
_MIB = 1024 * 1024
_MW_PER_W = 1000.0


class NvmlBackend:
    """Implements Backend. Call `start()` once (nvmlInit) before the first read."""

    backend_name = "nvml"

    def __init__(
        self,
        node_name: str,
        *,
        nvml: Any = None,
        health: HealthSettings = HealthSettings(),  # noqa: B008 - frozen, safe to share
    ) -> None:
        self.node_name = node_name
        self._nvml: Any = nvml if nvml is not None else importlib.import_module("pynvml")
        self._health = health

    def start(self) -> None:
        """nvmlInit. Raises NoDriverError when this machine has no usable driver, BackendError otherwise."""
        n = self._nvml
        try:
            n.nvmlInit()
        except (n.NVMLError_LibraryNotFound, n.NVMLError_DriverNotLoaded) as exc:
            raise NoDriverError(f"no NVIDIA driver: {exc}") from exc
        except n.NVMLError as exc:
            raise BackendError(f"nvmlInit: {exc}") from exc

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):  # shutting down anyway; nothing to recover
            self._nvml.nvmlShutdown()

    async def read(self) -> NodeStatus:
        return await asyncio.to_thread(self.read_sync)

    def read_sync(self) -> NodeStatus:
        n = self._nvml
        errors: list[str] = []
        try:
            count = n.nvmlDeviceGetCount()
        except n.NVMLError as exc:
            raise BackendError(f"{self.node_name}: nvmlDeviceGetCount: {exc}") from exc
        driver = self._call(errors, "driver_version", n.nvmlSystemGetDriverVersion)
        gpus = [gpu for i in range(count) if (gpu := self._gpu(i, errors)) is not None]
        return NodeStatus(
            node=self.node_name,
            observed_at=time.time(),
            backend=self.backend_name,
            gpus=tuple(gpus),
            driver_version=driver or "",
            errors=tuple(errors),
        )

    def _call(self, errors: list[str], what: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            errors.append(f"{what}: {exc}")
            return None

    def _gpu(self, i: int, errors: list[str]) -> GpuStatus | None:
        n = self._nvml
        handle = self._call(errors, f"gpu{i}.handle", n.nvmlDeviceGetHandleByIndex, i)
        if handle is None:
            return None  # without a handle nothing, not even its UUID, can be said about the card
        uuid = self._call(errors, f"gpu{i}.uuid", n.nvmlDeviceGetUUID, handle)
        if uuid is None:
            return None  # the collector keys cards by UUID; an anonymous card cannot be placed on
        model = self._call(errors, f"gpu{i}.name", n.nvmlDeviceGetName, handle) or "unknown"
        memory = self._call(errors, f"gpu{i}.memory", n.nvmlDeviceGetMemoryInfo, handle)
        utilisation = self._call(errors, f"gpu{i}.utilisation", n.nvmlDeviceGetUtilizationRates, handle)
        temperature = self._temperature(i, handle, errors)
        power_mw = self._call(errors, f"gpu{i}.power", n.nvmlDeviceGetPowerUsage, handle)
        limit_mw = self._call(errors, f"gpu{i}.power_limit", n.nvmlDeviceGetEnforcedPowerLimit, handle)
        ecc = self._ecc(i, handle, errors)
        processes = self._processes(i, handle, errors)
        healthy, reason = verdict(
            ecc=ecc, temperature_c=temperature, memory_readable=memory is not None, settings=self._health
        )
        return GpuStatus(
            uuid=uuid,
            index=i,
            model=model,
            memory_total_mib=memory.total // _MIB if memory else 0,
            memory_used_mib=memory.used // _MIB if memory else 0,
            memory_free_mib=memory.free // _MIB if memory else 0,
            utilisation_gpu=float(utilisation.gpu) if utilisation else None,
            utilisation_memory=float(utilisation.memory) if utilisation else None,
            temperature_c=temperature,
            power_w=power_mw / _MW_PER_W if power_mw is not None else None,
            power_limit_w=limit_mw / _MW_PER_W if limit_mw is not None else None,
            ecc=ecc,
            processes=processes,
            healthy=healthy,
            health_reason=reason,
        )

    def _temperature(self, i: int, handle: Any, errors: list[str]) -> float | None:
        n = self._nvml
        # nvmlDeviceGetTemperatureV is the current API; drivers before it answer Function Not
        # Found, and older pynvml lacks it: then the deprecated call, which every driver has.
        newer = getattr(n, "nvmlDeviceGetTemperatureV", None)
        if newer is not None:
            try:
                return float(newer(handle, n.NVML_TEMPERATURE_GPU))
            except n.NVMLError:
                pass
        value = self._call(errors, f"gpu{i}.temperature", n.nvmlDeviceGetTemperature, handle, n.NVML_TEMPERATURE_GPU)
        return None if value is None else float(value)

    def _ecc(self, i: int, handle: Any, errors: list[str]) -> EccCounts | None:
        n = self._nvml
        mode = self._call(errors, f"gpu{i}.ecc_mode", n.nvmlDeviceGetEccMode, handle)
        if mode is None or mode[0] != n.NVML_FEATURE_ENABLED:
            return None  # ECC off (or unknown): counters would be meaningless
        counts: list[int] = []
        for counter in (n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC):
            for kind in (n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
                value = self._call(errors, f"gpu{i}.ecc", n.nvmlDeviceGetTotalEccErrors, handle, kind, counter)
                if value is None:
                    return None  # a partial set would read as "0 errors" where we do not know
                counts.append(int(value))
        return EccCounts(
            volatile_corrected=counts[0],
            volatile_uncorrected=counts[1],
            aggregate_corrected=counts[2],
            aggregate_uncorrected=counts[3],
        )

    def _processes(self, i: int, handle: Any, errors: list[str]) -> tuple[ProcessUsage, ...]:
        n = self._nvml
        used: dict[int, int] = {}
        # A process can be both compute and graphics; count its memory once.
        for what, fn in (
            ("compute_processes", n.nvmlDeviceGetComputeRunningProcesses),
            ("graphics_processes", n.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            for proc in self._call(errors, f"gpu{i}.{what}", fn, handle) or ():
                # usedGpuMemory is None where the driver cannot tell (e.g. Windows WDDM).
                mib = (proc.usedGpuMemory or 0) // _MIB
                used[proc.pid] = max(used.get(proc.pid, 0), mib)
        return tuple(ProcessUsage(pid=pid, used_memory_mib=mib) for pid, mib in sorted(used.items()))
