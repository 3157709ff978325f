"""The structure every workload returns, registered or user-defined."""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
import time
from collections.abc import Callable, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

from trainables.contract import THROUGHPUT_UNITS
from trainables.loop_errors import WorkloadError


@dataclass(frozen=True)
class BuildContext:
    """What a workload builder may use: where to cache data, the seed, who is asking."""

    data_dir: str
    seed: int
    rank: int = 0
    world_size: int = 1


@dataclass
class Workload:
    """A model, its data and how one step computes a loss; the shared loop does the rest.

    The minimal workload gives ``(input, target)`` datasets and ``loss_fn(output, target)``. Any
    other batch shape (dicts, Hugging Face ``BatchEncoding``, dataclasses, nested tuples) needs
    ``step_fn(model, batch) -> loss`` instead, where the loss is a scalar tensor, an object with
    ``.loss`` or a mapping with ``"loss"``; validation runs the same function under ``no_grad``.

    Optional pieces, each with the default the loop uses without it:

    - ``count_items(batch) -> int``: the items trained on in a batch, in ``unit`` (e.g. non-padding
      tokens); default: the leading dimension of the batch's first tensor x ``items_per_sample``.
      Throughput, energy per 1k items and MFU use it; ``loss/val`` and ``eval/*`` are weighted by it.
    - ``collate_fn``: the DataLoader's (e.g. padding variable-length sequences).
    - ``optimizer_fn(model, lr) -> Optimizer``: default AdamW (fused on CUDA, but for ``cpu_offload``, whose shards
      step in host memory: a fused one of yours is refused there); ``lr`` is the trial's.
    - ``eval_fn(model, batch) -> dict[str, number]``: extra validation metrics, averaged over the
      whole validation set like ``loss/val`` and logged as ``eval/<name>``.
    - ``blocks``: the dotted name in ``model`` of the ``nn.ModuleList`` holding its repeated blocks, which
      activation checkpointing and FSDP2 wrap one by one; default: the largest ``ModuleList`` whose children
      are all of one class (``trainables.sharding.find_blocks``).

    Datasets are map-style (with ``__len__``; the loop shards and shuffles them) or an
    ``IterableDataset``, which shards itself by ``BuildContext.rank`` and loader worker.
    """

    model: nn.Module
    train_dataset: Dataset[Any]
    val_dataset: Dataset[Any]
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    unit: str = "samples"
    items_per_sample: int = 1
    flops_per_item: float | None = None  # training FLOPs (fwd+bwd) per unit item, for MFU
    channels_last: bool = False  # use channels_last memory format on GPU
    step_fn: Callable[[nn.Module, Any], Any] | None = None
    count_items: Callable[[Any], int] | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    optimizer_fn: Callable[[nn.Module, float], torch.optim.Optimizer] | None = None
    eval_fn: Callable[[nn.Module, Any], dict[str, Any]] | None = None
    blocks: str | None = None

    def check(self, name: str) -> None:
        problems = []
        if not isinstance(self.model, nn.Module):
            problems.append(f"model is {type(self.model).__name__}, not torch.nn.Module")
        for field in ("train_dataset", "val_dataset"):
            ds = getattr(self, field)
            if isinstance(ds, IterableDataset):
                continue
            if not isinstance(ds, Sized) or len(ds) == 0:
                problems.append(f"{field} must be a non-empty map-style Dataset with __len__, or an IterableDataset")
        if self.loss_fn is None and self.step_fn is None:
            problems.append("give loss_fn(output, target) for (input, target) batches, or step_fn(model, batch) -> loss")
        for field in ("loss_fn", "step_fn", "count_items", "collate_fn", "optimizer_fn", "eval_fn"):
            value = getattr(self, field)
            if value is not None and not callable(value):
                problems.append(f"{field} must be callable, got {type(value).__name__}")
        if self.unit not in THROUGHPUT_UNITS:
            problems.append(f"unit {self.unit!r} is not one of {list(THROUGHPUT_UNITS)}")
        if not isinstance(self.items_per_sample, int) or self.items_per_sample < 1:
            problems.append(f"items_per_sample must be an int >= 1, got {self.items_per_sample!r}")
        if problems:
            raise WorkloadError(f"workload {name!r} is malformed: " + "; ".join(problems))


_PREP_LOCK = threading.Lock()
_prep_s = 0.0  # seconds this process spent in `ensure_cached` making data or waiting while another process made it
_prep_calls = 0  # calls of `ensure_cached`, found made or not
_prep_depth = 0  # nesting of the calls that are making data (a `write` may call it again): the outer one counts


def prepared() -> tuple[float, int]:
    """Return this process's totals so far: (seconds making data, calls).

    Making data is work a node does once, which no later trial with the same data repeats. The loop reports a
    trial's share as `time/data_prep_s`, and only where its workload keeps its data through `ensure_cached` (else
    it cannot tell)."""
    with _PREP_LOCK:
        return _prep_s, _prep_calls


def ensure_cached(root: Path, write: Callable[[Path], None]) -> Path:
    """Create `root` once per node by calling `write(tmp_dir)`, safe when ranks or trials race.

    The first process to take the lock writes into a temporary folder and renames it into
    place; the others wait on the lock and then reuse the result. Time spent beyond finding it
    made counts in `prepared` (a call inside another's `write` counts once, in the outer).
    """
    global _prep_s, _prep_calls, _prep_depth
    with _PREP_LOCK:
        _prep_calls += 1
    if (root / "DONE").exists():
        return root
    t0 = time.perf_counter()
    _prep_depth += 1
    try:
        return _make_once(root, write)
    finally:
        _prep_depth -= 1
        if _prep_depth == 0:
            with _PREP_LOCK:
                _prep_s += time.perf_counter() - t0


def _make_once(root: Path, write: Callable[[Path], None]) -> Path:
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
