"""The NVML backend's mapping, against a stand-in for the pynvml module.

There is no GPU on the machines that run these tests, so `FakeNvml` below is a TEST DOUBLE of
the driver: it has the names and signatures of the pynvml functions the backend calls, and it
raises pynvml's own exception classes (those need no driver), so the error handling under test
is the real one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from hami.node.backend import BackendError, NoDriverError
from hami.node.nvml import NvmlBackend
from hami.node.schema import parse_status

MIB = 1024 * 1024


@dataclass
class FakeCard:
    uuid: str
    name: str = "NVIDIA A100-SXM4-40GB"
    total_mib: int = 40960
    used_mib: int = 1024
    util: tuple[int, int] = (37, 12)
    temp: int = 55
    power_mw: int = 123_456
    limit_mw: int = 400_000
    ecc_enabled: bool = True
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (error type, counter) -> count
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    failing: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code


class FakeNvml:
    """TEST DOUBLE of the pynvml module (no GPU here): same function names, pynvml's own errors."""

    NVMLError = pynvml.NVMLError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = pynvml.NVMLError_DriverNotLoaded
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_FEATURE_DISABLED = pynvml.NVML_FEATURE_DISABLED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = pynvml.NVML_AGGREGATE_ECC
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED

    def __init__(self, cards: list[FakeCard], *, has_temperature_v: bool = True, init_error: int = 0) -> None:
        self.cards = cards
        self.init_error = init_error
        self.calls: list[str] = []
        if has_temperature_v:
            self.nvmlDeviceGetTemperatureV = self._temperature_v

    def _card(self, fn: str, handle: FakeCard) -> FakeCard:
        self.calls.append(fn)
        if fn in handle.failing:
            raise pynvml.NVMLError(handle.failing[fn])
        return handle

    def nvmlInit(self) -> None:
        if self.init_error:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeCard:
        return self._card("nvmlDeviceGetHandleByIndex", self.cards[index])

    def nvmlDeviceGetUUID(self, handle: FakeCard) -> str:
        return self._card("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: FakeCard) -> str:
        return self._card("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeCard) -> SimpleNamespace:
        c = self._card("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(total=c.total_mib * MIB, used=c.used_mib * MIB, free=(c.total_mib - c.used_mib) * MIB)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeCard) -> SimpleNamespace:
        c = self._card("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=c.util[0], memory=c.util[1])

    def _temperature_v(self, handle: FakeCard, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._card("nvmlDeviceGetTemperatureV", handle).temp

    def nvmlDeviceGetTemperature(self, handle: FakeCard, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._card("nvmlDeviceGetTemperature", handle).temp

    def nvmlDeviceGetPowerUsage(self, handle: FakeCard) -> int:
        return self._card("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeCard) -> int:
        return self._card("nvmlDeviceGetEnforcedPowerLimit", handle).limit_mw

    def nvmlDeviceGetEccMode(self, handle: FakeCard) -> list[int]:
        c = self._card("nvmlDeviceGetEccMode", handle)
        state = pynvml.NVML_FEATURE_ENABLED if c.ecc_enabled else pynvml.NVML_FEATURE_DISABLED
        return [state, state]

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeCard, error_type: int, counter_type: int) -> int:
        return self._card("nvmlDeviceGetTotalEccErrors", handle).ecc.get((error_type, counter_type), 0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeCard) -> list[SimpleNamespace]:
        c = self._card("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in c.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeCard) -> list[SimpleNamespace]:
        c = self._card("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in c.graphics]


NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


def _backend(fake: Any) -> NvmlBackend:
    backend = NvmlBackend("node-1", nvml=fake)
    backend.start()
    return backend


def test_the_double_covers_every_pynvml_name_the_backend_uses() -> None:
    # Keeps the double honest: each name it stands in for exists in the real module.
    for name in dir(FakeNvml([FakeCard("GPU-1")])):
        if name.startswith(("nvml", "NVML")):
            assert hasattr(pynvml, name), name


async def test_a_full_read_maps_units_and_fields() -> None:
    card = FakeCard(
        "GPU-1",
        ecc={
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): 4,
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): 9,
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): 1,
        },
        compute=[(100, 512 * MIB), (200, None)],
        graphics=[(100, 512 * MIB), (300, 64 * MIB)],
    )
    status = await _backend(FakeNvml([card, FakeCard("GPU-2", used_mib=0)])).read()
    assert (status.node, status.backend, status.driver_version, status.errors) == ("node-1", "nvml", "550.54.15", ())
    gpu = status.gpus[0]
    assert (gpu.uuid, gpu.index, gpu.model) == ("GPU-1", 0, "NVIDIA A100-SXM4-40GB")
    assert (gpu.memory_total_mib, gpu.memory_used_mib, gpu.memory_free_mib) == (40960, 1024, 39936)
    assert (gpu.utilisation_gpu, gpu.utilisation_memory, gpu.temperature_c) == (37.0, 12.0, 55.0)
    assert (gpu.power_w, gpu.power_limit_w) == (pytest.approx(123.456), 400.0)
    assert gpu.ecc is not None
    assert (gpu.ecc.volatile_corrected, gpu.ecc.volatile_uncorrected) == (4, 0)
    assert (gpu.ecc.aggregate_corrected, gpu.ecc.aggregate_uncorrected) == (9, 1)
    # pid 100 is both compute and graphics: counted once; unknown memory reads as 0.
    assert [(p.pid, p.used_memory_mib) for p in gpu.processes] == [(100, 512), (200, 0), (300, 64)]
    assert gpu.healthy  # aggregate (old, retired) errors alone do not condemn a card
    assert status.gpus[1].index == 1
    assert parse_status(status.to_json()) == status


async def test_not_supported_calls_leave_their_fields_absent_and_are_recorded() -> None:
    card = FakeCard(
        "GPU-1",
        failing={
            "nvmlDeviceGetPowerUsage": NOT_SUPPORTED,
            "nvmlDeviceGetUtilizationRates": NOT_SUPPORTED,
            "nvmlDeviceGetTotalEccErrors": NOT_SUPPORTED,
        },
    )
    status = await _backend(FakeNvml([card])).read()
    gpu = status.gpus[0]
    assert gpu.power_w is None and gpu.utilisation_gpu is None and gpu.ecc is None
    assert gpu.power_limit_w == 400.0 and gpu.temperature_c == 55.0
    assert "gpu0.power: Not Supported" in status.errors
    assert "gpu0.utilisation: Not Supported" in status.errors
    assert any(e.startswith("gpu0.ecc:") for e in status.errors)


async def test_ecc_off_gives_no_counters_and_no_error() -> None:
    fake = FakeNvml([FakeCard("GPU-1", ecc_enabled=False)])
    status = await _backend(fake).read()
    assert status.gpus[0].ecc is None and status.errors == ()
    assert "nvmlDeviceGetTotalEccErrors" not in fake.calls


async def test_volatile_uncorrected_ecc_makes_a_card_unhealthy() -> None:
    card = FakeCard("GPU-1", ecc={(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 2})
    gpu = (await _backend(FakeNvml([card])).read()).gpus[0]
    assert not gpu.healthy and "ECC" in gpu.health_reason


@pytest.mark.parametrize("has_v", [True, False])
async def test_temperature_falls_back_to_the_old_call(has_v: bool) -> None:
    failing = {"nvmlDeviceGetTemperatureV": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND} if has_v else {}
    fake = FakeNvml([FakeCard("GPU-1", temp=71, failing=failing)], has_temperature_v=has_v)
    status = await _backend(fake).read()
    assert status.gpus[0].temperature_c == 71.0 and status.errors == ()
    assert "nvmlDeviceGetTemperature" in fake.calls


async def test_the_newer_temperature_call_is_preferred() -> None:
    fake = FakeNvml([FakeCard("GPU-1")])
    await _backend(fake).read()
    assert "nvmlDeviceGetTemperatureV" in fake.calls and "nvmlDeviceGetTemperature" not in fake.calls


async def test_a_lost_card_without_uuid_is_left_out_and_recorded() -> None:
    lost = FakeCard("GPU-2", failing={"nvmlDeviceGetUUID": pynvml.NVML_ERROR_GPU_IS_LOST})
    status = await _backend(FakeNvml([FakeCard("GPU-1"), lost])).read()
    assert [g.uuid for g in status.gpus] == ["GPU-1"]
    assert status.errors == ("gpu1.uuid: GPU is lost",)


async def test_unreadable_memory_makes_a_card_unhealthy() -> None:
    card = FakeCard("GPU-1", failing={"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_UNKNOWN})
    gpu = (await _backend(FakeNvml([card])).read()).gpus[0]
    assert not gpu.healthy and gpu.memory_total_mib == 0


async def test_failing_to_count_devices_fails_the_read() -> None:
    def broken_count() -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    fake = FakeNvml([])
    fake.nvmlDeviceGetCount = broken_count  # type: ignore[method-assign]
    with pytest.raises(BackendError, match="nvmlDeviceGetCount"):
        await _backend(fake).read()


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_driver_is_its_own_error(code: int) -> None:
    with pytest.raises(NoDriverError):
        NvmlBackend("n", nvml=FakeNvml([], init_error=code)).start()


def test_other_init_failures_are_backend_errors() -> None:
    with pytest.raises(BackendError) as caught:
        NvmlBackend("n", nvml=FakeNvml([], init_error=pynvml.NVML_ERROR_NO_PERMISSION)).start()
    assert not isinstance(caught.value, NoDriverError)


def test_the_real_module_reports_no_driver_on_this_machine() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on a GPU machine
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NoDriverError):
        NvmlBackend("n").start()
