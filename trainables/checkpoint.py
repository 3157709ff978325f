"""A trial's checkpoint: saved by rank 0 (a sharded model: by every rank) and read back by a resumed trial.

Rank 0 saves it every `checkpoint_every_steps` measured steps and hands it to the reporter with that report;
a resumed trial reads it at start and applies it when warm-up ends (warm-up runs again in the fresh process,
then its updates are undone). A model FSDP2 shards is saved with `torch.distributed.checkpoint` (DCP): each
rank writes its own shard files under `shards/` (rank 0 the metadata too) and hands its folder on, the reporter
puts them together (Ray Train: every rank's files into the one checkpoint); rank 0's `CHECKPOINT_FILE` holds the
rest (scaler, schedule, measured steps) and says the model is in `shards/`. DCP reshards at load."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainables.contract import CHECKPOINT_FILE
from trainables.reporting import Reporter
from trainables.storage import Storage


@dataclass(frozen=True)
class Saved:
    """What a checkpoint holds of a trial: the model, the optimizer, the GradScaler and the LR schedule."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any
    scheduler: Any
    sharded: bool = False  # FSDP2 holds the model: every rank saves its shard with DCP


SHARDS = "shards"  # a sharded model's DCP folder, beside CHECKPOINT_FILE
_FETCHED_SHARDS = "sweeps-shards-"  # a URI checkpoint's shards, copied to this node until they are loaded


def save_state(path: Path, saved: Saved, measured: int, rank: int = 0) -> None:
    """Write the checkpoint into `path`.

    Rank 0's file, and with a sharded model every rank's shard (all ranks call it then: DCP's save is a
    collective)."""
    rest = {"scaler": saved.scaler.state_dict() if saved.scaler is not None else {},
            "scheduler": saved.scheduler.state_dict() if saved.scheduler is not None else {},
            "measured_steps": measured}
    if saved.sharded:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(saved.model, saved.optimizer)
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=path / SHARDS)
        if rank == 0:
            torch.save({**rest, SHARDS: True}, path / CHECKPOINT_FILE)
        return
    torch.save({"model": saved.model.state_dict(), "optimizer": saved.optimizer.state_dict(), **rest},
               path / CHECKPOINT_FILE)


def read_state(path: str, device: torch.device) -> dict[str, Any]:
    """Read a checkpoint this loop wrote, in a local folder or at a URI; tensors only: nothing is unpickled.

    A URI's is fetched to this node (`trainables.storage`). A sharded model's state stays in its DCP folder
    until `apply_state` (the folder's path in place of `SHARDS`'s flag): a URI's shards are copied to a
    temporary folder of this node, which `apply_state` removes once it has loaded them."""
    where = Storage(path)
    with where.fetched("") as folder:  # locally the folder itself, as before
        state: dict[str, Any] = torch.load(folder / CHECKPOINT_FILE, map_location=device, weights_only=True)
        if state.get(SHARDS):
            if where.is_local:
                state[SHARDS] = str(Path(folder) / SHARDS)
            else:
                kept = tempfile.mkdtemp(prefix=_FETCHED_SHARDS)
                shutil.copytree(Path(folder) / SHARDS, kept, dirs_exist_ok=True)
                state[SHARDS] = kept
    return state


def apply_state(state: dict[str, Any], saved: Saved) -> None:
    """Load `state` into the trial's model, optimizer, scaler and schedule (a sharded model: every rank calls it)."""
    if state.get(SHARDS):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_sd, optim_sd = get_state_dict(saved.model, saved.optimizer)
        loaded: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd}
        dcp.load(loaded, checkpoint_id=state[SHARDS])  # in place, each rank its own shard
        if Path(state[SHARDS]).name.startswith(_FETCHED_SHARDS):  # a URI's, copied here: nothing left behind
            shutil.rmtree(state[SHARDS], ignore_errors=True)
        set_state_dict(saved.model, saved.optimizer, model_state_dict=loaded["model"],
                       optim_state_dict=loaded["optimizer"])
    else:
        saved.model.load_state_dict(state["model"])
        saved.optimizer.load_state_dict(state["optimizer"])
    if saved.scaler is not None and state["scaler"]:
        saved.scaler.load_state_dict(state["scaler"])
    if saved.scheduler is not None and state.get("scheduler"):
        saved.scheduler.load_state_dict(state["scheduler"])


class Checkpointer:
    """Reads a resumed trial's state now (the steps still to run), applies it once, saves new ones."""

    def __init__(self, every: int, resume_from: str | None, device: torch.device, rank: int) -> None:
        self.every, self.rank = every, rank
        self._state = read_state(resume_from, device) if resume_from else None
        self.done_before = int(self._state["measured_steps"]) if self._state is not None else 0

    def restore_into(self, saved: Saved) -> None:
        if self._state is not None:
            apply_state(self._state, saved)
            self._state = None

    def due(self, total: int) -> bool:
        """After `total` measured steps (a resumed trial's included; the caller knows more are to come)."""
        return bool(self.every) and total % self.every == 0

    def report(self, reporter: Reporter, metrics: dict[str, Any], saved: Saved, total: int) -> None:
        """Report on every rank (a barrier under Ray); rank 0 with the checkpoint.

        A sharded model: every rank with its shard."""
        with tempfile.TemporaryDirectory(prefix="ckpt-") as tmp:
            saves = self.rank == 0 or saved.sharded
            if saves:
                save_state(Path(tmp), saved, total, self.rank)
            reporter.report(metrics, checkpoint_dir=tmp if saves else None)
