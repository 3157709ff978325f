"""A test-only trainable that declares tokens but counts samples (a mistake the registry refuses)."""

from __future__ import annotations

from typing import Any

from trainables import BuildContext, Workload
from trainables.registry import build

UNIT = "tokens"


def build_samples(params: dict[str, Any], ctx: BuildContext) -> Workload:
    return build("mlp-tabular", {"num_train_rows": 256, "num_val_rows": 64}, ctx)
