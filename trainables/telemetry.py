"""Step timing with warm-up excluded, and the share of time spent waiting for data."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch


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
        self.steps = 0

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

    def step_done(self) -> None:
        if self.measuring:
            self.steps += 1

    def elapsed_s(self) -> float:
        """Seconds since `start()`, after the device has finished queued work."""
        assert self._t0 is not None, "StepTimer.start() was not called"
        self._sync()
        return self._clock() - self._t0
