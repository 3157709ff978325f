"""The loop's knobs, declared once: name, type, default, the rule a value must meet, help text and the
`torchrun` flag, as the fields of one dataclass. Everything else derives from it: the trial's config
(`TrialConfig` extends `LoopKnobs`), the spec's `space` vocabulary and its checks (`sweeps.spec`), the
params each trial logs, and the flags of `python -m trainables.launch`. Adding a knob touches its
declaration here, the code that uses it, and its test.

Torch-free: the service reads it without importing model code.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

LR_SCHEDULES: tuple[str, ...] = ("constant", "cosine")
# Precision vocabulary (Lightning-style names). "32" is strict fp32 with TF32 off.
PRECISIONS: tuple[str, ...] = ("32", "tf32", "16-mixed", "bf16-mixed")


@dataclass(frozen=True)
class Knob:
    """What a loop knob is, beyond its name, type and default."""

    help: str
    minimum: float | None = None  # numbers: at least this (None: an int >= 1, a float > 0)
    choices: tuple[str, ...] | None = None  # text: one of these
    note: str = ""  # said after the rule, in the spec's error: "an integer >= 1 (per worker)"
    group: str = "loop"  # "loop" or "optim": the spec's error lists them apart
    implicit: bool = True  # a spec that does not name it holds it at its default in its space (and logs it)
    flag: bool = True  # a `trainables.launch` flag (False: the launcher sets it itself)
    speed: bool = True  # it changes a step's speed (False: the optimizer's numbers only; twins are not told apart by it)

    def rule(self, kind: type) -> str:
        """What values are allowed, in words."""
        if self.choices is not None:
            said = f"one of {list(self.choices)}"
        elif kind is bool:
            said = "true or false"
        elif kind is str:
            said = "text"
        elif kind is int:
            said = f"an integer >= {int(self.minimum if self.minimum is not None else 1)}"
        else:
            said = f"a number >= {self.minimum:g}" if self.minimum is not None else "a number > 0"
        return f"{said} ({self.note})" if self.note else said

    def allows(self, kind: type, value: Any) -> bool:
        """Whether `value` is one this knob of type `kind` may take."""
        if kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return False
            return value >= self.minimum if self.minimum is not None else value > 0
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return False
        if isinstance(value, int) and not isinstance(value, bool):
            return value >= (self.minimum if self.minimum is not None else 1)
        return self.choices is None or value in self.choices


def knob(default: Any, help: str, **meta: Any) -> Any:  # noqa: A002 - the field's help text
    return field(default=default, metadata={"knob": Knob(help, **meta)})


@dataclass(frozen=True, kw_only=True)
class LoopKnobs:
    """The knobs a sweep may search (`space.<name>`), each a field: its default, and in `Knob` its rule,
    help and flag."""

    # the sweep sets it (a spec: space.num_workers, else scaling.num_workers); 0 in a config: whatever the
    # launcher started (torchrun)
    num_workers: int = knob(0, "ranks the trial runs on, one GPU each with use_gpu",
                            note="ranks per trial, one GPU each with use_gpu", implicit=False, flag=False)
    batch_size: int = knob(32, "samples per rank per micro-batch", note="per worker")
    precision: str = knob("32", "the loop's precision: autocast, and a GradScaler for 16-mixed", choices=PRECISIONS)
    lr: float = knob(1e-3, "the optimizer's learning rate (before lr_scaling)", speed=False)
    num_dataloader_workers: int = knob(0, "loader worker processes per rank", minimum=0)
    pin_memory: bool = knob(False, "pinned host memory for the batches (CUDA only)")
    prefetch_factor: int = knob(2, "batches per loader worker in flight", note="batches per loader worker in flight")
    persistent_workers: bool = knob(True, "keep loader workers alive across epochs")
    compile: bool = knob(False, "torch.compile the model (compile time falls in the untimed warm-up)")
    tf32_under_autocast: bool = knob(False, "mixed precisions on CUDA: fp32 matmuls left by autocast use TF32",
                                     note="mixed precisions on CUDA: fp32 matmuls left by autocast use TF32",
                                     implicit=False)
    grad_accum_steps: int = knob(1, "micro-batches per optimizer step", note="micro-batches per optimizer step",
                                 group="optim", implicit=False)
    max_grad_norm: float = knob(0.0, "clip the global gradient norm to this after unscaling (0: off)",
                                note="0: no clipping", minimum=0, group="optim", implicit=False, speed=False)
    lr_warmup_steps: int = knob(0, "optimizer steps of linear LR warm-up", note="optimizer steps of linear LR warm-up",
                                minimum=0, group="optim", implicit=False, speed=False)
    accelerator_type: str = knob("", "the accelerator type the trial's ranks run on: a GPU type by the name Ray "
                                 "labels it with (H100, A100), or a CPU node type its nodes' label names; priced by "
                                 "the spec's cost section; empty: any", note="a GPU type or a node label; empty: any",
                                 implicit=False, flag=False)
    lr_schedule: str = knob("constant", "after warm-up: constant, or cosine decay to 0 at the last step",
                            choices=LR_SCHEDULES, group="optim", implicit=False, speed=False)

def declared() -> dict[str, tuple[type, Any, Knob]]:
    """Every loop knob: name -> (type, default, what it is), in declaration order."""
    kinds = {"int": int, "float": float, "str": str, "bool": bool}
    return {f.name: (kinds[str(f.type)], f.default, f.metadata["knob"]) for f in dataclasses.fields(LoopKnobs)}


KNOBS = declared()
