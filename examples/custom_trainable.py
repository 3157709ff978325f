"""A complete user-defined trainable, used by `examples/custom.yaml`.

A trainable is any function ``(params: dict, ctx: BuildContext) -> Workload``, named in a
spec as ``package.module:function``. The shared loop does the training, timing and reporting;
the function only says what the model, the data and the loss are. The module must be
importable on the Ray workers: from the directory you run `sweeps run` in (added to the
workers' PYTHONPATH for a local cluster), via `ray job submit --working-dir .`, or installed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from trainables import BuildContext, Workload


def build(params: dict[str, Any], ctx: BuildContext) -> Workload:
    num_rows = int(params.get("num_rows", 2048))
    num_classes = int(params.get("num_classes", 4))
    gen = torch.Generator().manual_seed(ctx.seed)  # same seed -> same data on every rank
    centers = 3 * torch.randn(num_classes, 8, generator=gen)
    y = torch.randint(num_classes, (num_rows,), generator=gen)
    x = centers[y] + torch.randn(num_rows, 8, generator=gen)
    cut = num_rows * 7 // 8
    return Workload(
        model=nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, num_classes)),
        train_dataset=TensorDataset(x[:cut], y[:cut]),
        val_dataset=TensorDataset(x[cut:], y[cut:]),
        loss_fn=F.cross_entropy,
        unit="samples",
    )


def not_a_workload(params: dict[str, Any], ctx: BuildContext) -> Any:
    """What a mistake looks like: the sweep reports the trial as `config` with the reason."""
    return nn.Linear(8, 4)
