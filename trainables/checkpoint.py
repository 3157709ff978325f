"""A trial's checkpoint: saved by rank 0 every `checkpoint_every_steps` measured steps and handed to
the reporter with that report; a resumed trial reads it at start and applies it when warm-up ends
(warm-up runs again in the fresh process, then its updates are undone)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainables.contract import CHECKPOINT_FILE
from trainables.reporting import Reporter


def save_state(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any, scheduler: Any,
               measured: int) -> None:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else {},
                "scheduler": scheduler.state_dict() if scheduler is not None else {}, "measured_steps": measured},
               path / CHECKPOINT_FILE)


def read_state(path: str, device: torch.device) -> dict[str, Any]:
    """A checkpoint this loop wrote; tensors only (`weights_only`): nothing is unpickled."""
    return torch.load(Path(path) / CHECKPOINT_FILE, map_location=device, weights_only=True)  # type: ignore[no-any-return]


def apply_state(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any,
                scheduler: Any) -> None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state["scaler"]:
        scaler.load_state_dict(state["scaler"])
    if scheduler is not None and state.get("scheduler"):
        scheduler.load_state_dict(state["scheduler"])


class Checkpointer:
    """Reads a resumed trial's state now (the steps still to run), applies it once, saves new ones."""

    def __init__(self, every: int, resume_from: str | None, device: torch.device, rank: int) -> None:
        self.every, self.rank = every, rank
        self._state = read_state(resume_from, device) if resume_from else None
        self.done_before = int(self._state["measured_steps"]) if self._state is not None else 0

    def restore_into(self, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any, scheduler: Any) -> None:
        if self._state is not None:
            apply_state(self._state, model, optimizer, scaler, scheduler)
            self._state = None

    def due(self, total: int) -> bool:
        """After `total` measured steps (a resumed trial's included; the caller knows more are to come)."""
        return bool(self.every) and total % self.every == 0

    def report(self, reporter: Reporter, metrics: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer,
               scaler: Any, scheduler: Any, total: int) -> None:
        """Every rank reports (a barrier under Ray); rank 0 with the checkpoint."""
        with tempfile.TemporaryDirectory(prefix="ckpt-") as tmp:
            if self.rank == 0:
                save_state(Path(tmp), model, optimizer, scaler, scheduler, total)
            reporter.report(metrics, checkpoint_dir=tmp if self.rank == 0 else None)
