"""Validation, periodic evaluation and the time-to-target clock of one trial."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from trainables import contract
from trainables.batches import checked_count, checked_eval, loss_of, move_to_device
from trainables.build import Built
from trainables.contract import TrialConfig
from trainables.loop_errors import WorkloadError
from trainables.telemetry import StepTimer
from trainables.window import all_reduce, world

Loader = Callable[[], Any]  # -> a DataLoader over this rank's validation shard


@torch.no_grad()
def validate(t: Built, loader: Loader) -> dict[str, float]:
    """Compute `loss/val` and the workload's `eval/<name>` metrics over the whole validation set.

    Each is the item-weighted mean over every rank's shard, so a token-mean loss stays a token mean. On the bare
    model: DDP's forward may broadcast buffers (BatchNorm), and ranks whose shards differ in batches would then
    pair mismatched collectives."""
    model, wl, prec, device, pin = t.m.model, t.m.wl, t.prec, t.device, t.pin
    step, count = t.m.step_fn, t.m.count
    _, world_size = world()
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    extra: dict[str, torch.Tensor] = {}
    extra_items: dict[str, int] = {}
    count_sum = 0
    channels_last = device.type == "cuda" and wl.channels_last
    for batch, counted in _batches(loader, t.m.sharded and world_size > 1, device):
        n = checked_count(count, batch) if counted else 0
        moved = move_to_device(batch, device, pin, channels_last)
        with prec.autocast():
            total += loss_of(step(model, moved), training=False).double() * n
            values = checked_eval(wl.eval_fn(model, moved)) if wl.eval_fn is not None else {}
        if wl.eval_fn is not None and count_sum and set(values) != set(extra):
            raise WorkloadError(f"eval_fn returned {sorted(values)} for one batch and {sorted(extra)} for another: "
                                "return the same names for every batch")
        for name, value in values.items():
            v = value.detach().double().reshape(()) if isinstance(value, torch.Tensor) else float(value)
            extra[name] = extra.get(name, torch.zeros((), dtype=torch.float64, device=device)) + v * n
            extra_items[name] = extra_items.get(name, 0) + n  # each name's own weight
        count_sum += n
    model.train()
    names = sorted(extra)
    if world_size > 1:  # a rank whose shard was empty has no names: agree on them before summing
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, names)
        names = sorted({n for g in gathered for n in g})
    sums = all_reduce([total.item(), float(count_sum), *[extra[n].item() if n in extra else 0.0 for n in names],
                       *[float(extra_items.get(n, 0)) for n in names]], device)
    if sums[1] == 0:
        raise WorkloadError("the validation set gave no batches on any rank: give a non-empty val_dataset")
    out = {contract.LOSS_VAL: sums[0] / sums[1]}
    k = len(names)
    out.update({f"{contract.EVAL_PREFIX}{n}": v / w for n, v, w in zip(names, sums[2:2 + k], sums[2 + k:], strict=True)
                if w > 0})
    return out


def _batches(loader: Loader, lockstep: bool, device: torch.device) -> Iterator[tuple[Any, bool]]:
    """This rank's validation batches, each with whether it counts. In `lockstep` (a sharded model, whose forward
    gathers parameters from every rank) ranks agree before each batch whether any has one left, and a rank whose
    shard ran out runs its last batch again, uncounted, so every rank calls forward equally often."""
    last = None
    for batch in loader():
        if lockstep:
            all_reduce([1.0], device, op="max")
        last = batch
        yield batch, True
    while lockstep and all_reduce([0.0], device, op="max")[0]:
        if last is None:
            raise WorkloadError("this rank's validation shard is empty while another rank's is not: a sharded "
                                "model needs a batch on every rank (a larger val_dataset)")
        yield last, False


class Evaluator:
    """Periodic evaluation every `eval_every_steps` optimizer steps (warm-up included), and the target.

    The target's clock counts from the first step, evaluations included. `run()` validates (a collective) and
    reads the target from the all-reduced value, so every rank decides alike."""

    def __init__(self, cfg: TrialConfig, timer: StepTimer, validate_now: Callable[[], dict[str, float]]) -> None:
        self.cfg, self.timer, self._validate = cfg, timer, validate_now
        self.evals, self.eval_s = 0, 0.0
        self.best: float | None = None  # the best value of the target metric so far
        self.reached: tuple[float, int] | None = None  # (seconds, step) when the target was met
        self.last: dict[str, float] | None = None
        self._t0 = 0.0

    def start_clock(self) -> None:
        """The first step begins (a synchronised read, only where evaluations will read the clock)."""
        if self.cfg.eval_every_steps:
            self._t0 = self.timer.now(sync=True)

    def due(self, step: int) -> bool:
        return bool(self.cfg.eval_every_steps) and step % self.cfg.eval_every_steps == 0

    def run(self, step: int) -> dict[str, Any]:
        """Evaluate now (outside the measured window's time) and return what the report after it carries.

        With report_evals: the values and the time-to-target clock, the curve ASHA compares."""
        cfg = self.cfg
        with self.timer.paused() as t_eval:
            self.last = self._validate()
            now = self.timer.now(sync=True)
        self.evals, self.eval_s = self.evals + 1, self.eval_s + (now - t_eval)
        value = self.last.get(cfg.target_metric) if cfg.target_metric else None
        if value is not None and math.isfinite(value):
            better = self.best is None or (cfg.target_max is not None and value < self.best) or (
                cfg.target_min is not None and value > self.best)
            self.best = value if better else self.best
        if cfg.target_met(value):  # all ranks hold the same all-reduced value: all stop here
            self.reached = (now - self._t0, step)
        return {**self.last, contract.ELAPSED_S: now - self._t0} if cfg.report_evals else {}

    def final_validation(self) -> dict[str, float]:
        """The final validation: the evaluation that met the target, when one did, else a new one."""
        return dict(self.last) if self.reached is not None and self.last is not None else self._validate()

    def figures(self) -> dict[str, Any]:
        """How many evaluations ran, their time, the best target value and when the target was met."""
        if not self.cfg.eval_every_steps:
            return {}
        out: dict[str, Any] = {contract.EVALS: self.evals, contract.EVAL_TOTAL_S: self.eval_s}
        if self.best is not None:
            out[contract.TARGET_BEST] = self.best
        if self.reached is not None:
            out[contract.TIME_TO_TARGET_S], out[contract.STEPS_TO_TARGET] = self.reached
        return out
