"""Background sampling of a worker's own GPU (NVML) and CPU (psutil), off the hot path.

One sampler per rank, started after warm-up, stopped before validation. Every NVML call has
its own guard: a field that fails is absent from that sample (never 0), the others go on.
NVML numbers GPUs differently from CUDA, so the worker's GPU is found by UUID (PCI bus id as
a fallback), never by index.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainables.contract import (
    CPU_LOADERS_PCT,
    CPU_WORKER_PCT,
    ENERGY_TOTAL_J,
    GPU_MEM_PEAK_GIB,
    GPU_OTHER_PROCS,
    GPU_POWER_MEAN_W,
    GPU_SM_ACTIVE_PCT,
    GPU_SM_CLOCK_MEAN_MHZ,
    GPU_TEMP_MAX_C,
    GPU_TENSOR_ACTIVE_PCT,
    GPU_UTIL_MEAN_PCT,
    GPU_UTIL_P10_PCT,
)

logger = logging.getLogger(__name__)
_GIB = 1024**3
_IGNORED_CLOCK_REASONS = ("GpuIdle", "ApplicationsClocksSetting", "UserDefinedClocks", "None")


@dataclass(frozen=True)
class GpuIdentity:
    uuid: str | None
    pci_bus_id: str | None = None  # "DDDDDDDD:BB:DD.F", as NVML writes it

    @staticmethod
    def of(device: Any) -> GpuIdentity:
        import torch

        props = torch.cuda.get_device_properties(device)
        uuid = str(getattr(props, "uuid", "")) or None
        pci = None
        bus, dev = getattr(props, "pci_bus_id", None), getattr(props, "pci_device_id", None)
        if bus is not None and dev is not None:
            pci = f"{getattr(props, 'pci_domain_id', 0):08X}:{bus:02X}:{dev:02X}.0"
        return GpuIdentity(uuid, pci)


def _norm_uuid(u: Any) -> str:
    u = u.decode() if isinstance(u, bytes) else str(u)
    return u.lower().removeprefix("gpu-")


def load_nvml() -> Any | None:
    """The `pynvml` module (from nvidia-ml-py), initialised; None where NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, driver errors
        logger.info("NVML unavailable (%s); GPU metrics will be absent", exc)
        return None


class NvmlDevice:
    """Reads one GPU through NVML; `read()` returns only the fields that could be read."""

    def __init__(self, nvml: Any, identity: GpuIdentity) -> None:
        self.nvml = nvml
        self.handle = self._find(identity)
        self.gpm = self._gpm_supported()
        self._gpm_prev: Any = None
        self.facts = {"device/driver": self._call(lambda: _str(nvml.nvmlSystemGetDriverVersion()))}

    def _find(self, identity: GpuIdentity) -> Any:
        nvml = self.nvml
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            if identity.uuid and _norm_uuid(nvml.nvmlDeviceGetUUID(h)) == _norm_uuid(identity.uuid):
                return h
        if identity.pci_bus_id:
            return nvml.nvmlDeviceGetHandleByPciBusId(identity.pci_bus_id.encode())
        raise LookupError(f"no NVML device has UUID {identity.uuid}")

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self.nvml.NVMLError as exc:
            logger.debug("NVML call failed: %s", exc)
            return None

    def _gpm_supported(self) -> bool:
        support = self._call(lambda: self.nvml.nvmlGpmQueryDeviceSupport(self.handle))
        return bool(support is not None and support.isSupportedDevice)

    def read(self) -> dict[str, float | int]:
        n, h, call = self.nvml, self.handle, self._call
        out: dict[str, Any] = {}
        util = call(lambda: n.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            out["util"] = float(util.gpu)
        mem = call(lambda: n.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            out["mem_used_gib"], out["mem_total_gib"] = mem.used / _GIB, mem.total / _GIB
        out["power_w"] = _scale(call(lambda: n.nvmlDeviceGetPowerUsage(h)), 1e-3)
        out["temp_c"] = call(lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
        out["sm_clock_mhz"] = call(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
        out["energy_j"] = _scale(call(lambda: n.nvmlDeviceGetTotalEnergyConsumption(h)), 1e-3)
        out["clock_reasons"] = call(lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h))
        procs = call(lambda: n.nvmlDeviceGetComputeRunningProcesses(h))
        if procs is not None:  # the rank is one of them; NVML's pids are the host's, so count, never match
            out["gpu_other_procs"] = float(max(0, len(procs) - 1))
        if self.gpm:
            out.update(self._gpm())
        return {k: v for k, v in out.items() if v is not None}

    def _gpm(self) -> dict[str, float]:
        """SM and tensor activity between this sample and the previous one (Hopper+)."""
        n = self.nvml
        sample = self._call(n.nvmlGpmSampleAlloc)
        if sample is None:
            return {}
        if self._call(lambda: n.nvmlGpmSampleGet(self.handle, sample)) is None:
            self._call(lambda: n.nvmlGpmSampleFree(sample))  # allocated, never used: NVML memory otherwise
            return {}
        prev, self._gpm_prev = self._gpm_prev, sample
        if prev is None:
            return {}
        req = n.c_nvmlGpmMetricsGet_t()
        req.version, req.numMetrics, req.sample1, req.sample2 = n.NVML_GPM_METRICS_GET_VERSION, 2, prev, sample
        req.metrics[0].metricId = n.NVML_GPM_METRIC_SM_UTIL
        req.metrics[1].metricId = n.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        got = self._call(lambda: n.nvmlGpmMetricsGet(req))
        self._call(lambda: n.nvmlGpmSampleFree(prev))
        if got is None:
            return {}
        names = ("sm_active", "tensor_active")
        return {names[i]: float(got.metrics[i].value) for i in range(2) if got.metrics[i].nvmlReturn == 0}

    def close(self) -> None:
        """Free the GPM sample kept for the next delta."""
        prev, self._gpm_prev = self._gpm_prev, None
        if prev is not None:
            self._call(lambda: self.nvml.nvmlGpmSampleFree(prev))

    def clock_reason_names(self, mask: int) -> list[str]:
        """Return the clock-event reasons in `mask` that limit performance, one name per bit.

        NVML names some bits twice (UserDefinedClocks is ApplicationsClocksSetting): a bit any of whose names is not
        a throttle (idle, clocks the user set) is never reported, whatever alias it is met under."""
        aliases: dict[int, set[str]] = {}
        for attr in dir(self.nvml):
            if attr.startswith("nvmlClocksEventReason") and attr != "nvmlClocksEventReasonAll":
                bit = getattr(self.nvml, attr)
                if isinstance(bit, int) and bit > 0 and bit & (bit - 1) == 0:  # one bit: not a combination
                    aliases.setdefault(bit, set()).add(attr.removeprefix("nvmlClocksEventReason"))
        return sorted(min(names) for bit, names in aliases.items()
                      if mask & bit and not names & set(_IGNORED_CLOCK_REASONS))


def _scale(v: Any, k: float) -> float | None:
    return None if v is None else float(v) * k


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class CpuReader:
    """Reads CPU use of this worker process and of its children (dataloader workers), in % of a core.

    And, as counters for contention (`node_busy_s`, `own_cpu_s`), the CPU seconds every process of the node has
    used (steal included: a hypervisor's other guests) and those this process and its children have."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self.proc = psutil.Process()
        self._known: dict[int, Any] = {}
        self._gone_s = 0.0  # CPU seconds of children seen alive that have ended since (reaped or not)
        self._last: dict[int, float] = {}
        self._reaped0: float | None = None  # this process's children_* when the reader first counted
        self.proc.cpu_percent(None)

    def read(self) -> dict[str, float]:
        worker = self.proc.cpu_percent(None)
        loaders = 0.0
        try:
            children = self.proc.children(recursive=True)
        except self._psutil.Error:
            children = []
        for child in children:
            known = self._known.setdefault(child.pid, child)
            try:
                loaders += known.cpu_percent(None)  # 0.0 on the first call for a new process
            except self._psutil.Error:
                self._known.pop(child.pid, None)
        return {"cpu_worker": worker, "cpu_loaders": loaders, **self._counters(children)}

    def _counters(self, children: list[Any]) -> dict[str, float]:
        node = self._psutil.cpu_times()
        busy = sum(float(getattr(node, f, 0.0)) for f in ("user", "nice", "system", "irq", "softirq", "steal"))
        mine = self.proc.cpu_times()
        reaped = mine.children_user + mine.children_system  # children that ended and were waited for
        if self._reaped0 is None:
            self._reaped0 = reaped
        seen: dict[int, float] = {}
        for child in children:
            try:
                t = child.cpu_times()
                seen[child.pid] = t.user + t.system
            except self._psutil.Error:
                pass
        self._gone_s += sum(v for pid, v in self._last.items() if pid not in seen)  # ended since: kept
        self._last = seen
        # An ended child is counted once: in `_gone_s` from when it is gone, in children_* from when it is reaped
        # (with its last seconds): the larger of the two since the reader started, never their sum
        ended = max(reaped - self._reaped0, self._gone_s)
        return {"node_busy_s": busy, "own_cpu_s": mine.user + mine.system + self._reaped0 + ended + sum(seen.values()),
                "node_cores": float(self._psutil.cpu_count() or 0)}


class Sampler:
    """Samples readers every `period_s` on a daemon thread; keeps (time, fields) pairs."""

    def __init__(self, readers: list[Any], period_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.readers = readers
        self.period_s = period_s
        self.clock = clock
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def sample_once(self) -> None:
        fields: dict[str, float] = {}
        for reader in self.readers:
            try:
                fields.update(reader.read())
            except Exception as exc:  # noqa: BLE001 - a reader must never kill training
                logger.debug("telemetry reader %s failed: %s", type(reader).__name__, exc)
        with self._lock:
            self.samples.append((self.clock(), fields))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample_once()

    def start(self) -> None:
        self.sample_once()  # baseline: energy counter, CPU-time reference
        self._thread = threading.Thread(target=self._run, name="telemetry-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.period_s + 1)
        self.sample_once()

    def window(self, since: int = 0) -> list[dict[str, float]]:
        """The samples from `since` on, each with its time as `t` (the sampler's clock, seconds)."""
        with self._lock:
            return [{**f, "t": t} for t, f in self.samples[since:]]


def summarize(samples: list[dict[str, float]]) -> dict[str, float]:
    """One rank's summary of a window of samples; fields never sampled stay absent."""

    def values(key: str) -> list[float]:
        return [s[key] for s in samples if key in s and math.isfinite(s[key])]

    out: dict[str, float] = {}
    util = sorted(values("util"))
    if util:
        out[GPU_UTIL_MEAN_PCT] = sum(util) / len(util)
        out[GPU_UTIL_P10_PCT] = util[int(0.1 * (len(util) - 1))]
    for key, name, agg in (
        ("mem_used_gib", GPU_MEM_PEAK_GIB, max), ("power_w", GPU_POWER_MEAN_W, _mean),
        ("temp_c", GPU_TEMP_MAX_C, max), ("sm_clock_mhz", GPU_SM_CLOCK_MEAN_MHZ, _mean),
        ("sm_active", GPU_SM_ACTIVE_PCT, _mean), ("tensor_active", GPU_TENSOR_ACTIVE_PCT, _mean),
        ("cpu_worker", CPU_WORKER_PCT, _mean), ("cpu_loaders", CPU_LOADERS_PCT, _mean),
    ):
        vs = values(key)
        if vs:
            out[name] = float(agg(vs))
    energy = values("energy_j")
    if len(energy) >= 2:
        out[ENERGY_TOTAL_J] = energy[-1] - energy[0]
    out.update(_counter_deltas(samples))
    others = values("gpu_other_procs")
    if others:
        out[GPU_OTHER_PROCS] = max(others)
    return out


def _counter_deltas(samples: list[dict[str, float]]) -> dict[str, float]:
    """The window's CPU counters (`CpuReader`), for `trainables.telemetry.combine_ranks` to set against the other
    ranks on the same node: the node's busy and this rank's own CPU seconds, per second of the window."""
    have = [s for s in samples if "node_busy_s" in s and "own_cpu_s" in s and "t" in s]
    if len(have) < 2 or have[-1]["t"] <= have[0]["t"]:
        return {}
    span = have[-1]["t"] - have[0]["t"]
    return {"_node_busy_cores": (have[-1]["node_busy_s"] - have[0]["node_busy_s"]) / span,
            "_own_cores": (have[-1]["own_cpu_s"] - have[0]["own_cpu_s"]) / span,
            "_node_cores": have[-1].get("node_cores", 0.0)}


def _mean(vs: list[float]) -> float:
    return sum(vs) / len(vs)
