"""Test-only trainables that fail on purpose (fault hooks at the workload boundary)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info

from trainables import BuildContext, Workload, memory_model
from trainables.registry import build


def _counted() -> int:
    """Return 1 for a forward the faults count, 0 for the build's second measuring forward.

    The faults' steps were set when the build measured once (`memory_model.measuring_pass`): they count that
    one forward as they always did."""
    return int(memory_model.measuring_pass < 2)


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


class _RankHangs(nn.Module):
    """On rank `rank`, the `at`-th forward never returns: its DDP peers wait in the all-reduce."""

    def __init__(self, inner: nn.Module, rank: int, hang_rank: int, at: int) -> None:
        super().__init__()
        self.inner, self.hangs, self.at, self.calls = inner, rank == hang_rank, at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += _counted()
        if self.hangs and self.calls == self.at:
            time.sleep(3600)
        return self.inner(x)  # type: ignore[no-any-return]


def rank1_hangs(params: dict[str, Any], ctx: BuildContext) -> Workload:
    workload = build("mlp-tabular", {"num_train_rows": 1024, "num_val_rows": 256}, ctx)
    workload.model = _RankHangs(workload.model, ctx.rank, hang_rank=1, at=4)
    return workload


class _LoaderFault(Dataset):  # type: ignore[type-arg]
    """Wraps a dataset; inside a loader worker process, item `at` kills the worker or hangs."""

    def __init__(self, inner: Any, how: str, at: int = 8) -> None:
        self.inner, self.how, self.at = inner, how, at

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        if i == self.at and get_worker_info() is not None:
            if self.how == "die":
                os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer or a full /dev/shm does
            time.sleep(3600)
        return self.inner[i]


def loader_dies(params: dict[str, Any], ctx: BuildContext) -> Workload:
    workload = build("mlp-tabular", {"num_train_rows": 256, "num_val_rows": 64}, ctx)
    workload.train_dataset = _LoaderFault(workload.train_dataset, "die")
    return workload


def loader_hangs(params: dict[str, Any], ctx: BuildContext) -> Workload:
    workload = build("mlp-tabular", {"num_train_rows": 256, "num_val_rows": 64}, ctx)
    workload.train_dataset = _LoaderFault(workload.train_dataset, "hang")
    return workload


class _CrashOnce(nn.Module):
    """Rank 1's process exits hard at its `at`-th forward, once per marker file (a crashed worker)."""

    def __init__(self, inner: nn.Module, rank: int, at: int, marker: str) -> None:
        super().__init__()
        self.inner, self.rank, self.at, self.marker, self.calls = inner, rank, at, marker, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += _counted()
        if self.rank == 1 and self.calls == self.at and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)
        return self.inner(x)  # type: ignore[no-any-return]


def crash_once(params: dict[str, Any], ctx: BuildContext) -> Workload:
    """mlp-tabular whose rank 1 dies once, at its 15th forward (after the checkpoint at measured step 10)."""
    workload = build("mlp-tabular", {"num_train_rows": 1024, "num_val_rows": 256}, ctx)
    workload.model = _CrashOnce(workload.model, ctx.rank, at=15, marker=str(params["marker"]))
    return workload


class _DiskFullWhile(nn.Module):
    """Rank 0's `at`-th forward writes to /dev/full while the file `flag` exists: the kernel answers
    ENOSPC, as it does to any write on a full disk (a cache, a log, a checkpoint)."""

    def __init__(self, inner: nn.Module, rank: int, at: int, flag: str) -> None:
        super().__init__()
        self.inner, self.rank, self.at, self.flag, self.calls = inner, rank, at, flag, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += _counted()
        if self.rank == 0 and self.calls == self.at and os.path.exists(self.flag):
            fd = os.open("/dev/full", os.O_WRONLY)
            try:
                os.write(fd, b"\0" * 4096)
            finally:
                os.close(fd)
        return self.inner(x)  # type: ignore[no-any-return]


def disk_full_while(params: dict[str, Any], ctx: BuildContext) -> Workload:
    """mlp-tabular whose rank 0 hits a full disk at its 15th forward (after the checkpoint at measured
    step 10) for as long as the file `params["flag"]` exists."""
    workload = build("mlp-tabular", {"num_train_rows": 1024, "num_val_rows": 256}, ctx)
    workload.model = _DiskFullWhile(workload.model, ctx.rank, at=15, flag=str(params["flag"]))
    return workload


def crash_hang_or_disk_full(params: dict[str, Any], ctx: BuildContext) -> Workload:
    """`params["fault"]`: "crash" is `crash_once` (marker `params["marker"]`), "hang" is `rank1_hangs`,
    "disk" is `disk_full_while` (flag `params["flag"]`): three faults in one sweep, one trial each."""
    if params["fault"] == "hang":
        return rank1_hangs(params, ctx)
    if params["fault"] == "disk":
        return disk_full_while(params, ctx)
    return crash_once(params, ctx)


class _Raises(nn.Module):
    """Every rank raises `error` at its first forward (a symmetric failure: nobody waits in a collective)."""

    def __init__(self, inner: nn.Module, error: BaseException) -> None:
        super().__init__()
        self.inner, self.error = inner, error

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise self.error


class _Dies(nn.Module):
    """Rank 1's process exits at its 2nd forward (a crash: its peers are left in the all-reduce)."""

    def __init__(self, inner: nn.Module, rank: int) -> None:
        super().__init__()
        self.inner, self.rank, self.calls = inner, rank, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += _counted()
        if self.rank == 1 and self.calls == 2:
            os._exit(1)
        return self.inner(x)  # type: ignore[no-any-return]


WARM_PARAMS = {"num_train_rows": 1024, "num_val_rows": 256}


def warm_modes(params: dict[str, Any], ctx: BuildContext) -> Workload:
    """For the warm-group tests, by `params["mode"]`: "same*" the same seeded mlp-tabular trial (so its
    loss/val must not depend on what the group ran before), "other" a different model, "oom" every
    rank out of memory (the group is kept), "config" a bad param (kept), "crash" rank 1 dies (retired)."""
    mode = str(params["mode"])
    if mode == "config":
        return build("mlp-tabular", {**WARM_PARAMS, "hidden": 0}, ctx)
    workload = build("mlp-tabular", {**WARM_PARAMS, "hidden": 32 if mode == "other" else 64}, ctx)
    if mode == "oom":
        workload.model = _Raises(workload.model, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB (injected)"))
    elif mode == "crash":
        workload.model = _Dies(workload.model, ctx.rank)
    return workload


class _OomOnRank1Above(nn.Module):
    """An injected memory limit on one rank only: rank 1 runs out of memory above `limit` samples,
    rank 0 never does (so without the probe's agreement rank 0 would wait for rank 1 forever)."""

    def __init__(self, inner: nn.Module, rank: int, limit: int) -> None:
        super().__init__()
        self.inner, self.rank, self.limit = inner, rank, limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rank == 1 and x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected: batch {x.shape[0]} > {self.limit})")
        return self.inner(x)  # type: ignore[no-any-return]


def oom_on_rank1_above(params: dict[str, Any], ctx: BuildContext) -> Workload:
    workload = build("mlp-tabular", {"num_train_rows": 4096, "num_val_rows": 256}, ctx)
    workload.model = _OomOnRank1Above(workload.model, ctx.rank, int(params["limit"]))
    return workload


class _Gate(nn.Module):
    """Every rank's `at`-th training forward (grad enabled: not validation's) leaves a file
    `arrived-<token>` in `folder` (a token per gate: a warm group builds one per trial) and waits there
    until `folder/open` or its own `folder/open-<token>` exists: a test holds its trials mid-training
    (each on its CPUs, none finished) until it has done what it must do while they train."""

    def __init__(self, inner: nn.Module, at: int, folder: str) -> None:
        super().__init__()
        self.inner, self.at, self.folder, self.calls = inner, at, folder, 0
        self.me = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += torch.is_grad_enabled() and _counted()
        if self.calls == self.at and torch.is_grad_enabled():
            open(os.path.join(self.folder, f"arrived-{self.me}"), "w").close()
            while not any(os.path.exists(os.path.join(self.folder, f)) for f in ("open", f"open-{self.me}")):
                time.sleep(0.05)
        return self.inner(x)  # type: ignore[no-any-return]


def gated(params: dict[str, Any], ctx: BuildContext) -> Workload:
    """mlp-tabular (its params, but for these two) whose every rank waits at the training step of its
    `params["at"]`-th training forward until the file `params["gate"]/open` (or its own: see `_Gate`)
    exists. Keep `at` within the 3 measured steps a time-boxed trial always plans (after warm-up)."""
    workload = build("mlp-tabular", {k: v for k, v in params.items() if k not in ("at", "gate")}, ctx)
    # Rank 0 counts the training FLOPs of a workload that does not declare them with one forward of
    # its own before training (trainables.build.count_flops; not in a probe, which these tests do not
    # run): the same step is one call later there. (Ranks gated at different steps would leave one
    # waiting in the other's all-reduce.)
    counts = ctx.rank == 0 and workload.flops_per_item is None
    workload.model = _Gate(workload.model, int(params["at"]) + counts, str(params["gate"]))
    return workload
