"""Step timing with warm-up excluded, and the share of time spent waiting for data."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from trainables.contract import (
    CPU_OTHER_CORES,
    ENERGY_TOTAL_J,
    H2D_COPY_PCT,
    MEM_ALLOC_RETRIES,
    MEM_HEADROOM_GIB,
    MEM_MAX_ALLOCATED_GIB,
    MEM_MAX_RESERVED_GIB,
    MEM_PEAK_RSS_GIB,
    MEM_TOTAL_GIB,
)
from trainables.metrics import METRICS


class StepTimer:
    """Times the measured window only; `synchronize()` brackets it on CUDA, nowhere else.

    Data wait is the wall time blocked in ``next(batches)``: with enough loader workers it
    is near zero, and when the input pipeline cannot keep up it dominates.
    """

    def __init__(self, device: torch.device, clock: Callable[[], float] = time.perf_counter) -> None:
        self._device = device
        self._clock = clock
        self._t0: float | None = None
        self.data_wait_s = 0.0
        self.paused_s = 0.0  # measured-window time spent outside training (evaluations, handing reports on)
        self.report_wait_s = 0.0  # the part of it spent handing reports on (the time box counts it)
        self.steps = 0

    def now(self, sync: bool = False) -> float:
        """Return the timer's clock: host time, after the device's queued work when `sync`.

        CUDA steps are asynchronous: without `sync` a step looks as fast as the host can queue it."""
        if sync:
            self._sync()
        return self._clock()

    @property
    def measuring(self) -> bool:
        return self._t0 is not None

    def _sync(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def start(self) -> None:
        self._sync()
        self._t0 = self._clock()

    @contextlib.contextmanager
    def data_wait(self) -> Iterator[None]:
        t = self._clock()
        yield
        if self.measuring:
            self.data_wait_s += self._clock() - t

    @contextlib.contextmanager
    def paused(self, report: bool = False) -> Iterator[float]:
        """Leave the time spent inside out of `elapsed_s`: it is not training time.

        Synchronised at both ends. `report`: handing a report on, which the window's time box still counts
        (`box_s`)."""
        self._sync()
        t = self._clock()
        yield t
        self._sync()
        if self.measuring:
            spent = self._clock() - t
            self.paused_s += spent
            if report:
                self.report_wait_s += spent

    def step_done(self) -> None:
        if self.measuring:
            self.steps += 1

    def elapsed_s(self) -> float:
        """Training seconds since `start()` (paused spans left out), after the device finished queued work."""
        assert self._t0 is not None, "StepTimer.start() was not called"
        self._sync()
        return self._clock() - self._t0 - self.paused_s

    def box_s(self) -> float:
        """Return what the window has cost against its time box.

        Training and the handing on of reports (a report path that waits must not stretch a boxed trial),
        evaluations left out as before."""
        return self.elapsed_s() + self.report_wait_s


# --- per-trial telemetry: sampler + memory + copy time, combined over ranks -------------

# How a rank's summary value combines over ranks.
_COMBINE: dict[str, str] = {m.key: m.ranks for m in METRICS if m.ranks}  # declared in trainables.metrics


def combine_ranks(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine per-rank summaries; a key missing on any rank is absent (never a partial mean)."""
    out: dict[str, Any] = {}
    for key, how in _COMBINE.items():
        vals = [s[key] for s in summaries if key in s]
        if not vals or len(vals) != len(summaries):
            continue
        out[key] = {"mean": sum(vals) / len(vals), "max": max(vals), "min": min(vals), "sum": sum(vals)}[how]
    other = other_cores(summaries)
    if other is not None:
        out[CPU_OTHER_CORES] = other
    reasons = sorted({r for s in summaries for r in s.get("gpu/clock_reasons", "").split(",") if r})
    if any("gpu/clock_reasons" in s for s in summaries):
        out["gpu/clock_reasons"] = ",".join(reasons) or "none"
    return out


def other_cores(summaries: list[dict[str, Any]]) -> float | None:
    """Return the cores that processes outside the trial kept busy on its busiest node over the window.

    Each node's busy cores (every rank there reads the same counter: their mean) less what the trial's ranks
    there and their loader workers used. None when a rank could not measure it (telemetry off, a window of one
    sample)."""
    if not summaries or any("_node_busy_cores" not in s for s in summaries):
        return None
    nodes: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        nodes.setdefault(str(s.get("_node", "")), []).append(s)
    return max(max(0.0, sum(r["_node_busy_cores"] for r in ranks) / len(ranks) - sum(r["_own_cores"] for r in ranks))
               for ranks in nodes.values())


def reset_peak_rss() -> bool:
    """Reset this process's peak resident memory (`VmHWM`) to what it holds now; False where Linux does not let it.

    First collects garbage (a warm worker's previous trial: its model and optimizer in reference cycles) and hands
    the C heap's free pages back (glibc's `malloc_trim`): memory an earlier step or trial freed but the heap kept
    would otherwise count as held, and its reuse would never raise the peak."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def read_peak_rss_gib() -> float | None:
    """This process's peak resident memory since its last reset (`VmHWM`), in GiB; None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024**2  # kB
    except OSError:
        pass
    return None


class Telemetry:
    """Everything measured about one rank besides step time: sampler, memory, copy time."""

    def __init__(self, device: torch.device, period_s: float) -> None:
        from trainables.sampler import CpuReader, GpuIdentity, NvmlDevice, Sampler, load_nvml

        self.device = device
        self.node = socket.gethostname()
        self.facts: dict[str, str] = {}
        readers: list[Any] = [CpuReader()]
        self.gpu: NvmlDevice | None = None
        if device.type == "cuda":
            nvml = load_nvml()
            if nvml is not None:
                try:
                    self.gpu = NvmlDevice(nvml, GpuIdentity.of(device))
                    readers.append(self.gpu)
                    self.facts.update({k: v for k, v in self.gpu.facts.items() if v})
                except (LookupError, nvml.NVMLError) as exc:
                    logging.getLogger(__name__).warning("no NVML handle for %s: %s", device, exc)
        self.sampler = Sampler(readers, period_s)
        self._mark = 0
        self._copy_events: list[tuple[Any, Any]] = []
        self._copy_s = 0.0
        self._copy_since_last = 0.0
        self._retries0 = 0
        self._rss_reset = False

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._retries0 = int(torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0))
        self._rss_reset = reset_peak_rss()
        self.sampler.start()

    def stop(self) -> None:
        self.sampler.stop()
        if self.gpu is not None:
            self.gpu.close()

    @contextlib.contextmanager
    def h2d_copy(self, measuring: bool) -> Iterator[None]:
        """Times host->device copies with CUDA events: no host sync on the hot path."""
        if not measuring or self.device.type != "cuda":
            yield
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self._copy_events.append((start, end))

    def rank_summary(self, elapsed_s: float, since_last: bool) -> dict[str, Any]:
        """Return this rank's figures since the last call, or over the whole measured window.

        Since the last call with `since_last` (an interim report), else over the whole measured window (the final
        report); `elapsed_s` is that window's length. Memory peaks are the peaks so far."""
        from trainables.sampler import summarize

        start = self._mark if since_last else 0
        samples = self.sampler.window(start)
        self._mark = len(self.sampler.samples)
        out: dict[str, Any] = summarize(samples)
        out["_node"] = self.node  # for the ranks' node-wide counters (`other_cores`)
        if since_last and start > 0:  # a counter's delta runs from the previous window's last sample,
            # so consecutive windows add up to the whole (their means stay over their own samples)
            counters = summarize(self.sampler.window(start - 1))
            if ENERGY_TOTAL_J in counters:
                out[ENERGY_TOTAL_J] = counters[ENERGY_TOTAL_J]
        if self.gpu is not None:
            masks = [int(s["clock_reasons"]) for s in samples if "clock_reasons" in s]
            if masks:
                union = 0
                for m in masks:
                    union |= m
                out["gpu/clock_reasons"] = ",".join(self.gpu.clock_reason_names(union))
        peak_rss = read_peak_rss_gib() if self._rss_reset else None
        if peak_rss is not None:
            out[MEM_PEAK_RSS_GIB] = peak_rss
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory / 1024**3
            reserved = torch.cuda.max_memory_reserved(self.device) / 1024**3
            out[MEM_MAX_ALLOCATED_GIB] = torch.cuda.max_memory_allocated(self.device) / 1024**3
            out[MEM_MAX_RESERVED_GIB] = reserved
            out[MEM_TOTAL_GIB] = total
            out[MEM_HEADROOM_GIB] = total - reserved
            out[MEM_ALLOC_RETRIES] = int(torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)) - \
                self._retries0
            # Over the same window as `elapsed_s` (since the last call, or all of it), like data
            # wait. The caller synchronized: the events are done.
            copied = sum(a.elapsed_time(b) for a, b in self._copy_events) / 1000.0
            self._copy_events.clear()
            self._copy_s += copied
            self._copy_since_last += copied
            if elapsed_s > 0:
                out[H2D_COPY_PCT] = 100.0 * (self._copy_since_last if since_last else self._copy_s) / elapsed_s
            self._copy_since_last = 0.0
        return out
