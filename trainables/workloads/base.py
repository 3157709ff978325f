"""The structure every workload returns, registered or user-defined."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from trainables.contract import THROUGHPUT_UNITS
from trainables.errors import WorkloadError


@dataclass(frozen=True)
class BuildContext:
    """What a workload builder may use: where to cache data, the seed, who is asking."""

    data_dir: str
    seed: int
    rank: int = 0
    world_size: int = 1


@dataclass
class Workload:
    """A model, its data and its loss; the shared loop does the rest.

    Datasets yield ``(input, target)`` pairs. ``items_per_sample`` converts samples into
    the throughput unit (e.g. tokens per sequence).
    """

    model: nn.Module
    train_dataset: Dataset[Any]
    val_dataset: Dataset[Any]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    unit: str = "samples"
    items_per_sample: int = 1
    flops_per_item: float | None = None  # training FLOPs (fwd+bwd) per unit item, for MFU
    channels_last: bool = False  # use channels_last memory format on GPU

    def check(self, name: str) -> None:
        problems = []
        if not isinstance(self.model, nn.Module):
            problems.append(f"model is {type(self.model).__name__}, not torch.nn.Module")
        for field in ("train_dataset", "val_dataset"):
            ds = getattr(self, field)
            if not isinstance(ds, Sized) or len(ds) == 0:
                problems.append(f"{field} must be a non-empty map-style Dataset with __len__")
        if not callable(self.loss_fn):
            problems.append("loss_fn must be callable(output, target) -> scalar tensor")
        if self.unit not in THROUGHPUT_UNITS:
            problems.append(f"unit {self.unit!r} is not one of {list(THROUGHPUT_UNITS)}")
        if problems:
            raise WorkloadError(f"workload {name!r} is malformed: " + "; ".join(problems))


def ensure_cached(root: Path, write: Callable[[Path], None]) -> Path:
    """Create `root` once per node by calling `write(tmp_dir)`, safe when ranks or trials race.

    The first process to take the lock writes into a temporary folder and renames it into
    place; the others wait on the lock and then reuse the result.
    """
    if (root / "DONE").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "DONE").exists():
            tmp = root.with_name(f"{root.name}.tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            write(tmp)
            (tmp / "DONE").touch()
            shutil.rmtree(root, ignore_errors=True)
            tmp.rename(root)
    return root
