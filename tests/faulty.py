"""Test-only trainables that fail on purpose (fault hooks at the workload boundary)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainables import BuildContext, Workload
from trainables.registry import build


class _OomAbove(nn.Module):
    """Raises the same exception type as a real CUDA OOM once a batch exceeds `limit`; with
    `nan_batch`, a batch of exactly that size makes the loss NaN (a diverging configuration)."""

    def __init__(self, inner: nn.Module, limit: int, nan_batch: int | None = None) -> None:
        super().__init__()
        self.inner, self.limit, self.nan_batch = inner, limit, nan_batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.00 GiB (injected: batch {x.shape[0]} > {self.limit})")
        out = self.inner(x)
        return out * float("nan") if x.shape[0] == self.nan_batch else out  # type: ignore[no-any-return]


def oom_above_32(params: dict[str, Any], ctx: BuildContext) -> Workload:
    workload = build("mlp-tabular", {"num_train_rows": 1024, "num_val_rows": 256}, ctx)
    workload.model = _OomAbove(workload.model, 32)
    return workload


def nan_at_16_oom_above_32(params: dict[str, Any], ctx: BuildContext) -> Workload:
    workload = build("mlp-tabular", {"num_train_rows": 1024, "num_val_rows": 256}, ctx)
    workload.model = _OomAbove(workload.model, 32, nan_batch=16)
    return workload
