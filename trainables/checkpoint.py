"""A trial's checkpoint: saved by rank 0 and read back by a resumed trial.

Rank 0 saves it every `checkpoint_every_steps` measured steps and hands it to the reporter with that report;
a resumed trial reads it at start and applies it when warm-up ends (warm-up runs again in the fresh process,
then its updates are undone)."""

from __future__ import annotations

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


def save_state(path: Path, saved: Saved, measured: int) -> None:
    torch.save({"model": saved.model.state_dict(), "optimizer": saved.optimizer.state_dict(),
                "scaler": saved.scaler.state_dict() if saved.scaler is not None else {},
                "scheduler": saved.scheduler.state_dict() if saved.scheduler is not None else {},
                "measured_steps": measured}, path / CHECKPOINT_FILE)


def read_state(path: str, device: torch.device) -> dict[str, Any]:
    """Read a checkpoint this loop wrote, in a local folder or at a URI.

    A URI's is fetched to this node (`trainables.storage`). Tensors only (`weights_only`): nothing is unpickled."""
    with Storage(path).fetched("") as folder:  # locally the folder itself, as before
        return torch.load(folder / CHECKPOINT_FILE, map_location=device, weights_only=True)  # type: ignore[no-any-return]


def apply_state(state: dict[str, Any], saved: Saved) -> None:
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
        """Every rank reports (a barrier under Ray); rank 0 with the checkpoint."""
        with tempfile.TemporaryDirectory(prefix="ckpt-") as tmp:
            if self.rank == 0:
                save_state(Path(tmp), saved, total)
            reporter.report(metrics, checkpoint_dir=tmp if self.rank == 0 else None)
