"""What the DDP comm hook reads: the gradient noise scale and the all-reduce's unhidden wait.

The gradient noise scale (McCandlish et al. 2018, app. A) and the gradient all-reduce's wait that backward
did not hide, both at almost no cost.

A gradient estimated from B items has expected squared norm E|g_B|^2 = |G|^2 + tr(Sigma)/B, where G
is the true gradient and Sigma the per-item gradient covariance. Two batch sizes give two such
equations and the unbiased estimators

    |G|^2     = (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
    tr(Sigma) = (|g_small|^2 - |g_big|^2) / (1/B_small - 1/B_big)

and the "simple" noise scale B_simple = tr(Sigma) / |G|^2: the batch size past which a larger batch
stops buying proportionally fewer steps. Under DDP both norms are free: each rank holds a
small-batch gradient before the all-reduce and the large-batch one after it (a DDP comm hook reads
both; Crowson's k-diffusion `gns.py` and AdaptDL do the same). On one rank with gradient
accumulation, the first micro-batch's gradient is the small one and the accumulated step the big one.

The estimators are noisy per step, so both are smoothed (an EMA per optimizer step, bias-corrected)
before the ratio is taken. A loss scale (fp16's GradScaler) multiplies both norms alike and cancels
in the ratio; a step whose gradients are not finite is skipped. Batch sizes are in the workload's
counted unit (samples or tokens), so the noise scale is too.

**All-reduce wait** (`CommTimer`). DDP launches a bucket's all-reduce from the hook as soon as
backward has produced that bucket's gradients, so the communication overlaps the rest of backward;
the last bucket is ready when backward's compute ends, and `backward()` returns once every bucket's
all-reduce has finished. The time from the last bucket's hook to the end of `backward()` is
therefore the communication backward did not hide: the wait `time/allreduce_wait_pct` reports (a
rank that waits for a slower peer waits here too: a straggler looks like communication). On a CPU
both ends are host clocks; on a GPU, where the host runs ahead, both are CUDA events on the
compute stream (after `backward()` the stream waits for the all-reduced gradients), read at the
next report, where the loop synchronises anyway. Timing a no-sync step against a synced one would
measure the same, but needs extra steps that do not update the model alike on every rank.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


def estimates(small_sq: float, big_sq: float, b_small: float, b_big: float) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) from mean squared gradient norms at two batch sizes (b_big > b_small)."""
    if not b_big > b_small > 0:
        raise ValueError(f"need b_big > b_small > 0, got {b_big}, {b_small}")
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


@dataclass
class NoiseScale:
    """Smoothed gradient noise scale from squared gradient norms per optimizer step.

    It accumulates squared norms per optimizer step on the device (no host sync), and turns each report window
    into smoothed estimates on the host.

    `beta` is the EMA decay per optimizer step; a window of n steps counts as n steps at its mean."""

    device: torch.device
    beta: float = 0.99
    _small_parts: list[torch.Tensor] = field(default_factory=list)
    _big_parts: list[torch.Tensor] = field(default_factory=list)
    _steps: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = field(default_factory=list)  # this window's
    _ema_g2: float = 0.0
    _ema_trace: float = 0.0
    _weight: float = 0.0  # 1 - beta^steps: the EMA's bias correction

    # --- per step: list appends only (no tensor work, no host sync); the window does the rest --
    def add_small(self, sq: torch.Tensor) -> None:
        self._small_parts.append(sq.detach())

    def add_big(self, sq: torch.Tensor) -> None:
        self._big_parts.append(sq.detach())

    def commit(self, keep: bool) -> None:
        """End of an optimizer step: keep its norms (measured window) or drop them (warm-up)."""
        small, big = self._small_parts, self._big_parts
        self._small_parts, self._big_parts = [], []
        if keep and small and big:
            self._steps.append((small, big))

    # --- per report window -------------------------------------------------------------------
    def window_sums(self) -> list[float]:
        """Return this rank's [sum small, sum big, valid steps] since the last call (the caller all-reduces).

        A step whose norms are not finite (fp16 overflow) is left out."""
        steps, self._steps = self._steps, []
        if not steps:
            return [0.0, 0.0, 0.0]
        small = torch.stack([torch.stack(s).double().sum() for s, _ in steps])
        big = torch.stack([torch.stack(b).double().sum() for _, b in steps])
        ok = torch.isfinite(small) & torch.isfinite(big)
        return torch.stack([small[ok].sum(), big[ok].sum(), ok.double().sum()]).tolist()  # type: ignore[no-any-return]

    def update(self, small_mean: float, big_mean: float, steps: float, b_small: float, b_big: float) -> float | None:
        """Fold one window (mean squared norms over `steps` valid steps) into the EMA.

        Returns the smoothed B_simple, or None while it cannot be estimated (no steps yet, or |G|^2 not positive)."""
        if steps > 0 and b_big > b_small > 0 and math.isfinite(small_mean) and math.isfinite(big_mean):
            g2, trace = estimates(small_mean, big_mean, b_small, b_big)
            decay = self.beta ** steps
            self._ema_g2 = decay * self._ema_g2 + (1 - decay) * g2
            self._ema_trace = decay * self._ema_trace + (1 - decay) * trace
            self._weight = 1 - (1 - self._weight) * decay
        if self._weight <= 0:
            return None
        g2, trace = self._ema_g2 / self._weight, self._ema_trace / self._weight
        return trace / g2 if g2 > 0 and trace > 0 else None


class CommTimer:
    """The all-reduce wait backward did not hide, per optimizer step.

    The wait runs from the last gradient bucket's all-reduce launch to the end of `backward()` (module doc); it is
    kept per step without a host sync and summed per report window."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._ready: Any = None  # the latest bucket's launch: perf_counter, or a CUDA event
        self._steps: list[Any] = []  # this window's waits: seconds, or (start, end) CUDA events

    def bucket_ready(self) -> None:
        """From the comm hook, as a bucket's all-reduce is launched."""
        if self.cuda:
            self._ready = torch.cuda.Event(enable_timing=True)
            self._ready.record()
        else:
            self._ready = time.perf_counter()

    def backward_done(self, keep: bool) -> None:
        """After the backward that synchronised gradients: keep this step's wait (measured window) or drop it."""
        ready, self._ready = self._ready, None
        if ready is None or not keep:
            return
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._steps.append((ready, end))
        else:
            self._steps.append(time.perf_counter() - ready)

    def window_s(self) -> float:
        """Seconds waited since the last call (this rank); on a GPU this waits for the last step's event."""
        steps, self._steps = self._steps, []
        if not self.cuda:
            return float(sum(steps))
        if steps:
            steps[-1][1].synchronize()
        return sum(a.elapsed_time(b) for a, b in steps) / 1000.0


@dataclass
class HookState:
    """What the comm hook feeds: the noise scale and the all-reduce timer, either may be off."""

    world: int
    noise: NoiseScale | None = None
    comm: CommTimer | None = None


def _sq(t: torch.Tensor) -> torch.Tensor:
    f = t.float() if t.dtype != torch.float32 and t.dtype != torch.float64 else t
    return torch.dot(f.reshape(-1), f.reshape(-1))


def ddp_hook(state: HookState, bucket):  # type: ignore[no-untyped-def]
    """DDP's default all-reduce (average over ranks), reading the bucket's squared norms and launch time.

    It reads the bucket's squared norm before (this rank's small-batch gradient) and after (the global one), and
    when it was launched. Unannotated `bucket` and return: DDP compares real annotations with
    `dist.GradBucket`/`Future`, and this module's are strings."""
    noise, buf = state.noise, bucket.buffer()
    if noise is not None:
        noise.add_small(_sq(buf))
    buf.div_(state.world)
    if state.comm is not None:
        state.comm.bucket_ready()
    fut = dist.all_reduce(buf, async_op=True).get_future()
    if noise is None:
        return fut.then(lambda f: f.value()[0])

    def after(f: torch.futures.Future[Any]) -> torch.Tensor:
        out: torch.Tensor = f.value()[0]
        noise.add_big(_sq(out))
        return out

    return fut.then(after)


def grads_sq(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Squared global norm of the parameters' current gradients (one rank, no communication)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float64)
    norms = list(torch._foreach_norm(grads))
    if len({n.dtype for n in norms}) > 1:  # parameters of several dtypes: stack in fp32
        norms = [n.float() for n in norms]
    return torch.linalg.vector_norm(torch.stack(norms)).square()
