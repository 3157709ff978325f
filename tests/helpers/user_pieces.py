"""Test-only user trainables: the pieces of the open step contract, each done wrong one way."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import IterableDataset

from trainables import BuildContext, Workload
from trainables.registry import build

PARAMS = {"mode": "ok", "hidden": 16}


class _Empty(IterableDataset[Any]):
    def __iter__(self) -> Any:
        return iter(())


def _dict_rows(ctx: BuildContext) -> Workload:
    wl = build("examples.dict_batch_model:build", {"num_rows": 512}, ctx)
    return wl


def bad(params: dict[str, Any], ctx: BuildContext) -> Workload:
    """`mode` picks the mistake: each must fail the trial as `config` with a message saying the fix."""
    mode = params["mode"]
    wl = _dict_rows(ctx)
    model_step = wl.step_fn
    assert model_step is not None
    if mode == "non_scalar":
        wl.step_fn = lambda m, b: F.cross_entropy(m(b["numeric"], b["category"]), b["label"], reduction="none")
    elif mode == "non_tensor":
        wl.step_fn = lambda m, b: {"loss": float(model_step(m, b))}
    elif mode == "no_grad":
        wl.step_fn = lambda m, b: model_step(m, b).detach()
    elif mode == "count_zero":
        wl.count_items = lambda b: 0
    elif mode == "count_tensor":
        wl.count_items = lambda b: b["label"].sum()
    elif mode == "eval_string":
        wl.eval_fn = lambda m, b: {"accuracy": "high"}
    elif mode == "eval_list":
        wl.eval_fn = lambda m, b: {"accuracy": [1.0, 0.5]}
    elif mode == "empty_stream":
        wl.train_dataset = _Empty()
    elif mode == "no_step":
        wl.step_fn = None  # dict batches with the default (x, y) step
        wl.loss_fn = F.cross_entropy
    return wl


def sgd_mlp(params: dict[str, Any], ctx: BuildContext) -> Workload:
    """mlp-tabular with plain SGD (no momentum): an update is exactly -lr x the (clipped) gradient."""
    wl = build("mlp-tabular", {"num_train_rows": 512, "num_val_rows": 64}, ctx)
    wl.optimizer_fn = lambda model, lr: torch.optim.SGD(model.parameters(), lr=lr)
    return wl


class _Slow(nn.Module):
    """Sleeps `delay_s` in every training forward: a configuration whose steps are slow."""

    def __init__(self, inner: nn.Module, delay_s: float) -> None:
        super().__init__()
        self.inner, self.delay_s = inner, delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            time.sleep(self.delay_s)
        return self.inner(x)  # type: ignore[no-any-return]


def slow_steps(params: dict[str, Any], ctx: BuildContext) -> Workload:
    """mlp-tabular whose training steps take at least `delay_s` (params) each."""
    workload = build("mlp-tabular", {"num_train_rows": 1024, "num_val_rows": 128}, ctx)
    workload.model = _Slow(workload.model, float(params["delay_s"]))
    return workload
