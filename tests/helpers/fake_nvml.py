"""A fake `pynvml` module: NVML is the one boundary we fake (no GPU here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    uuid: str
    util: float
    mem_used: int = 10 * 1024**3
    mem_total: int = 80 * 1024**3
    power_mw: int = 300_000
    energy_mj: int = 1_000_000
    gpm: bool = True
    processes: int = 1  # compute processes on the GPU (the rank's own among them)
    failing: set[str] = field(default_factory=set)  # NVML functions that raise NVMLError now


class FakeNvml:
    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    nvmlClocksEventReasonGpuIdle = 1
    nvmlClocksEventReasonSwPowerCap = 4
    nvmlClocksEventReasonHwThermalSlowdown = 64

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.reasons = 4 | 1

    def _gpu(self, h: int, fn: str) -> FakeGpu:
        gpu = self.gpus[h]
        if fn in gpu.failing:
            raise NVMLError(f"{fn}: GPU is lost")
        return gpu

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetHandleByPciBusId(self, bus: bytes) -> int:
        raise NVMLError("not found")

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.gpus[h].uuid

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"580.65"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=self._gpu(h, "util").util, memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        g = self._gpu(h, "memory")
        return SimpleNamespace(used=g.mem_used, total=g.mem_total, free=g.mem_total - g.mem_used)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._gpu(h, "power").power_mw

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 60 + self._gpu(h, "temperature").util // 10

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return 1980

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        g = self._gpu(h, "energy")
        g.energy_mj += 300_000  # 300 J between samples
        return g.energy_mj

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self.reasons

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        g = self._gpu(h, "processes")
        return [SimpleNamespace(pid=1000 + i, usedGpuMemory=1024**3) for i in range(g.processes)]

    def nvmlGpmQueryDeviceSupport(self, h: int) -> Any:
        return SimpleNamespace(isSupportedDevice=int(self.gpus[h].gpm))

    def nvmlGpmSampleAlloc(self) -> Any:
        return SimpleNamespace(taken=False)

    def nvmlGpmSampleGet(self, h: int, sample: Any) -> Any:
        sample.taken, sample.gpu = True, h
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        pass

    def c_nvmlGpmMetricsGet_t(self) -> Any:
        return SimpleNamespace(metrics=[SimpleNamespace(metricId=0, value=0.0, nvmlReturn=0) for _ in range(4)])

    def nvmlGpmMetricsGet(self, req: Any) -> Any:
        assert req.sample1.taken and req.sample2.taken and req.numMetrics == 2
        util = self.gpus[req.sample2.gpu].util
        values = {self.NVML_GPM_METRIC_SM_UTIL: util * 0.9, self.NVML_GPM_METRIC_ANY_TENSOR_UTIL: util * 0.5}
        for m in req.metrics[: req.numMetrics]:
            m.value = values[m.metricId]
        return req
