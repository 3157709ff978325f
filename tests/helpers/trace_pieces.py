"""Trainables with a known bottleneck, for the trace's tests (tests/loop/test_trace.py): a model whose gradient
all-reduce is far heavier than its compute, and a dataset whose every sample takes a while to read."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from trainables import BuildContext, Workload


class _Fat(nn.Module):
    """A tiny linear model that also carries `size` parameters it barely uses: the gradient DDP all-reduces
    is that big (dense), its compute a few flops."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.head = nn.Linear(8, 1)
        self.big = nn.Parameter(torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x) + self.big[:1] * 0.0


def _rows(ctx: BuildContext, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(n, 8, generator=gen)
    return x, x.sum(dim=1, keepdim=True)


def fat_gradient(params: dict[str, Any], ctx: BuildContext) -> Workload:
    x, y = _rows(ctx, 1024)
    return Workload(model=_Fat(int(params.get("size", 8_000_000))), train_dataset=TensorDataset(x, y),
                    val_dataset=TensorDataset(x[:64], y[:64]), loss_fn=F.mse_loss,
                    optimizer_fn=lambda model, lr: torch.optim.SGD(model.parameters(), lr=lr))  # a cheap step


class _Slow(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, sleep_s: float) -> None:
        self.x, self.y, self.sleep_s = x, y, sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


def slow_rows(params: dict[str, Any], ctx: BuildContext) -> Workload:
    x, y = _rows(ctx, 1024)
    return Workload(model=nn.Linear(8, 1), train_dataset=_Slow(x, y, float(params.get("sleep_s", 0.001))),
                    val_dataset=TensorDataset(x[:64], y[:64]), loss_fn=F.mse_loss)
