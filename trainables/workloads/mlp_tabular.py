"""`mlp-tabular`: a tiny MLP on a synthetic in-memory regression table; fast, for tests and demos."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from trainables.workloads.base import BuildContext, Workload
from trainables.workloads.declared import MlpTabularParams as Params

UNIT = "samples"


def build(params: Params, ctx: BuildContext) -> Workload:
    gen = torch.Generator().manual_seed(ctx.seed)
    n = params.num_train_rows + params.num_val_rows
    x = torch.randn(n, params.num_features, generator=gen)
    w = torch.randn(params.num_features, 1, generator=gen)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(n, 1, generator=gen)
    cut = params.num_train_rows
    model = nn.Sequential(
        nn.Linear(params.num_features, params.hidden), nn.GELU(), nn.Linear(params.hidden, 1)
    )
    return Workload(
        model=model,
        train_dataset=TensorDataset(x[:cut], y[:cut]),
        val_dataset=TensorDataset(x[cut:], y[cut:]),
        loss_fn=F.mse_loss,
        unit="samples",
    )
