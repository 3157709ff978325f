"""The measured window: its clock, what it counts, its marks, and what each report says of it.

`MeasuredWindow` owns the state a report needs (items, bytes copied, the summed loss, the previous
report's mark, the sub-window marks); `report()` is the only place that turns it into metrics, with
its collectives in a fixed order: one all_reduce SUM (the all-reduce wait, `CommTimer`, among its figures), one all_reduce MAX, the spread's two (final
report only, with enough marks) and telemetry's all_gather. Every rank calls it at the same points.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from trainables import contract
from trainables.instruments import Instruments
from trainables.loop_errors import DivergedError
from trainables.telemetry import StepTimer, Telemetry, combine_ranks


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce(values: list[float], device: torch.device, op: str = "sum") -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if world()[1] > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()


def kept_marks(marks: list[tuple[float, int, int]]) -> list[tuple[float, int, int]]:
    """Merge the marks taken before an extension of the plan, which are denser.

    They are merged so every sub-window spans about as many steps as the last."""
    if len(marks) < 2:
        return list(marks)
    width = marks[-1][2] - marks[-2][2]
    kept = [marks[0]]
    for m in marks[1:]:
        if m[2] - kept[-1][2] >= width or m is marks[-1]:
            kept.append(m)
    return kept


def spread(marks: list[tuple[float, int, int]], device: torch.device) -> float | None:
    """Return the throughput's coefficient of variation (%) over sub-windows of equal steps.

    Items are summed over ranks, each span the slowest rank's; absent with fewer than 3."""
    if len(marks) < 4:
        return None
    kept = kept_marks(marks)
    if len(kept) < 4:
        return None
    pairs = list(zip(kept, kept[1:], strict=False))
    spans = all_reduce([b[0] - a[0] for a, b in pairs], device, op="max")
    items = all_reduce([float(b[1] - a[1]) for a, b in pairs], device)
    rates = [i / s for i, s in zip(items, spans, strict=True) if s > 0]
    if len(rates) < 3 or statistics.fmean(rates) <= 0:
        return None
    return 100.0 * statistics.stdev(rates) / statistics.fmean(rates)


def telemetry_metrics(telemetry: Telemetry | None, elapsed: float, since_last: bool, world_size: int) -> dict[str, Any]:
    """This window's telemetry, combined over ranks (every rank calls this at the same points)."""
    if telemetry is None:
        return {}
    mine = telemetry.rank_summary(elapsed, since_last)
    if world_size == 1:
        return combine_ranks([mine])
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, mine)
    return combine_ranks(gathered)


class MeasuredWindow:
    """Times the measured window and counts what happens in it (this rank), for the reports."""

    def __init__(self, device: torch.device, inst: Instruments, unit: str, world_size: int,
                 small_batches_per_step: int) -> None:
        self.device, self.telemetry, self.unit, self.world = device, inst.telemetry, unit, world_size
        self.comm = inst.comm  # DDP: the all-reduce wait backward did not hide
        self.noise, self.small_per_step = inst.noise, small_batches_per_step  # the noise scale's small batch: ranks or micro-batches
        self.timer = StepTimer(device)
        self.items = 0  # counted in the measured window
        self.copied = 0  # host->device bytes in the measured window (CUDA only: on a CPU nothing is copied)
        self.loss_sum = torch.zeros((), dtype=torch.float32, device=device)
        self.loss_count = 0
        self.marks: list[tuple[float, int, int]] = []  # (elapsed, items, steps) at each mark: the throughput's spread
        self.sub_every = 1
        self.report_every = 1
        self.warm_t0 = 0.0  # the timer's clock when the timed warm-up began (step 1)
        self.warm_end = 0.0  # perf_counter when the measured window began
        self.warm_steps_s: float | None = None  # warm-up's timed steps, max over ranks (None: fewer than 2 steps)
        self._mark = (0.0, 0, 0, 0.0, 0)  # (elapsed, steps, items, data wait, bytes copied) at the previous report

    @property
    def measuring(self) -> bool:
        return self.timer.measuring

    @property
    def steps(self) -> int:
        return self.timer.steps

    def calibration_starts(self) -> None:
        """Step 1 begins: step 0 (allocations, loader start-up, compilation) is not representative."""
        self.warm_t0 = self.timer.now(sync=True)

    def warm_span(self) -> float:
        """Seconds of the timed warm-up steps so far (this rank, from step 1 on)."""
        return self.timer.now(sync=True) - self.warm_t0

    def start(self, sub_every: int, report_every: int, warm_steps_s: float | None) -> None:
        self.sub_every, self.report_every, self.warm_steps_s = sub_every, report_every, warm_steps_s
        if self.telemetry is not None:  # before the clock: resetting the memory peaks collects garbage
            self.telemetry.start()
        self.timer.start()
        self.warm_end = time.perf_counter()
        self.marks.append((0.0, 0, 0))

    def replan(self, sub_every: int) -> None:
        """The plan grew: ~as many marks still (denser earlier ones are merged by `kept_marks`)."""
        self.sub_every = max(self.sub_every, sub_every)

    def sub_windows(self) -> int:
        """Sub-windows the spread would have now (after merging)."""
        return len(kept_marks(self.marks)) - 1

    def count(self, items: int, copied: int, loss: torch.Tensor, micros: int) -> None:
        """One micro-batch of the measured window."""
        self.items += items
        self.copied += copied
        self.loss_sum += loss.detach().float() / micros

    def step_done(self) -> bool:
        """An optimizer step of the window ended; True when it took a sub-window mark."""
        self.loss_count += 1
        self.timer.step_done()
        if self.timer.steps % self.sub_every:
            return False
        self.marks.append((self.timer.elapsed_s(), self.items, self.timer.steps))
        return True

    def report_due(self) -> bool:
        return self.timer.steps % self.report_every == 0

    def report(self, steps_reported: int, final: bool = False) -> dict[str, Any]:
        """Return one window per report: the steps since the previous report, or the whole measured window.

        An interim report covers the steps since the previous report (throughput, step time, data wait, telemetry
        and energy alike); the final one the whole measured window. loss/train is the mean over the steps since the
        previous report."""
        timer, unit, world_size = self.timer, self.unit, self.world
        elapsed = timer.elapsed_s()
        if final and self.telemetry is not None:
            self.telemetry.stop()
        t0, steps0, items0, wait0, bytes0 = (0.0, 0, 0, 0.0, 0) if final else self._mark
        self._mark = (elapsed, timer.steps, self.items, timer.data_wait_s, self.copied)
        span, steps = elapsed - t0, timer.steps - steps0
        noise_sums = self.noise.window_sums() if self.noise is not None else [0.0, 0.0, 0.0]
        comm_s = self.comm.window_s() if self.comm is not None else 0.0
        summed = all_reduce([float(self.items - items0), (timer.data_wait_s - wait0) / max(span, 1e-12),
                             self.loss_sum.item(), float(self.loss_count), *noise_sums,
                             float(self.copied - bytes0), comm_s / max(span, 1e-12)], self.device)
        (max_span,) = all_reduce([span], self.device, op="max")
        cv = spread(self.marks, self.device) if final else None
        window_items, wait_share, losses, counts, small_sq, big_sq, noise_steps, window_bytes, comm_share = summed
        train_loss = losses / max(counts, 1.0)
        if not math.isfinite(train_loss):
            raise DivergedError(f"training loss became {train_loss} by measured step {timer.steps}")
        self.loss_sum, self.loss_count = torch.zeros_like(self.loss_sum), 0
        measured = telemetry_metrics(self.telemetry, span, since_last=not final, world_size=world_size)
        if contract.CPU_WORKER_PCT in measured and contract.CPU_LOADERS_PCT in measured:  # cores busy, all ranks
            measured[contract.CPU_CORES_USED] = world_size * (measured[contract.CPU_WORKER_PCT]
                                                              + measured[contract.CPU_LOADERS_PCT]) / 100.0
        if contract.ENERGY_TOTAL_J in measured and window_items > 0:
            measured[contract.energy_key(unit)] = 1000.0 * measured[contract.ENERGY_TOTAL_J] / window_items
        if self.device.type == "cuda" and window_bytes > 0:  # mean per rank, per second of the window
            measured[contract.H2D_GB_PER_S] = window_bytes / world_size / max(max_span, 1e-12) / 1e9
        if self.noise is not None and steps > 0:
            # every rank's big norm is the same; the small ones are averaged over ranks
            b_big = window_items / steps  # items per optimizer step, all ranks
            b_small = b_big / self.small_per_step
            per = max(noise_steps / world_size, 0.0)
            b_simple = self.noise.update(small_sq / max(noise_steps, 1.0), big_sq / max(noise_steps, 1.0), per,
                                         b_small, b_big)
            if b_simple is not None:
                measured[contract.GRAD_NOISE_SCALE] = b_simple
        if cv is not None:
            measured[contract.throughput_cv_key(unit)] = cv
        if self.comm is not None:  # mean over ranks, as the data wait
            measured[contract.ALLREDUCE_WAIT_PCT] = 100.0 * comm_share / world_size
        if final:
            measured[contract.WINDOW_S] = max_span
        return measured | {
            contract.throughput_key(unit): window_items / max_span,
            contract.per_worker_throughput_key(unit): window_items / max_span / world_size,
            contract.LOSS_TRAIN: train_loss,
            contract.STEP_TIME_MS: 1000.0 * max_span / max(steps, 1),
            contract.DATA_WAIT_PCT: 100.0 * wait_share / world_size,
            contract.STEPS: steps_reported,
            contract.WORLD_SIZE: world_size,
            contract.FINAL: 0,
        }
