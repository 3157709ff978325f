"""A model fed dict batches, with its own step, optimizer groups and an accuracy metric.

The step between the minimal `(x, y)` workload (custom_trainable.py) and a Hugging Face model
(hf_causal_lm.py): the dataset yields dicts of several inputs, `step_fn` says how the model
consumes one and returns the loss, `optimizer_fn` puts norms and biases in a group without
weight decay (as most transformer recipes do), and `eval_fn` adds `eval/accuracy`, usable as a
constraint (`objective: {constraints: [{metric: eval/accuracy, min: 0.9}]}`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from trainables import BuildContext, Workload

PARAMS = {"hidden": 64, "dropout": 0.1, "weight_decay": 0.01, "num_rows": 2048, "num_categories": 8}


class Rows(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, numeric: torch.Tensor, category: torch.Tensor, label: torch.Tensor) -> None:
        self.numeric, self.category, self.label = numeric, category, label

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"numeric": self.numeric[i], "category": self.category[i], "label": self.label[i]}


class Classifier(nn.Module):
    def __init__(self, num_numeric: int, num_categories: int, hidden: int, dropout: float, num_classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(num_categories, hidden)
        self.proj = nn.Linear(num_numeric, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Sequential(nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, num_classes))

    def forward(self, numeric: torch.Tensor, category: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.proj(numeric) + self.embed(category)))  # type: ignore[no-any-return]


def step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["numeric"], batch["category"]), batch["label"])


def accuracy(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"accuracy": (model(batch["numeric"], batch["category"]).argmax(-1) == batch["label"]).float().mean()}


def build(params: dict[str, Any], ctx: BuildContext) -> Workload:
    gen = torch.Generator().manual_seed(ctx.seed)  # same data on every rank; the loop shards it
    n, cats = params["num_rows"], params["num_categories"]
    numeric = torch.randn(n, 6, generator=gen)
    category = torch.randint(cats, (n,), generator=gen)
    label = ((numeric[:, 0] > 0).long() + 2 * (category % 2)).long()  # depends on both inputs
    cut = n * 7 // 8
    torch.manual_seed(ctx.seed)
    model = Classifier(6, cats, params["hidden"], params["dropout"], num_classes=4)

    def optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
        decay = [p for name, p in model.named_parameters() if p.dim() >= 2 and "embed" not in name]
        no_decay = [p for name, p in model.named_parameters() if p.dim() < 2 or "embed" in name]  # norms, biases
        return torch.optim.AdamW([{"params": decay, "weight_decay": params["weight_decay"]},
                                  {"params": no_decay, "weight_decay": 0.0}], lr=lr)

    return Workload(
        model=model,
        train_dataset=Rows(numeric[:cut], category[:cut], label[:cut]),
        val_dataset=Rows(numeric[cut:], category[cut:], label[cut:]),
        step_fn=step,
        optimizer_fn=optimizer,
        eval_fn=accuracy,
    )
