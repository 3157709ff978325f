"""Precision vocabulary -> autocast context, GradScaler and matmul flags.

One object owns all three so the loop never branches on the precision name.
Whatever the hardware cannot do raises `UnsupportedError`; nothing silently runs
as something else.
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from trainables.contract import PRECISIONS
from trainables.loop_errors import UnsupportedError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Precision:
    name: str
    device_type: str
    autocast_dtype: torch.dtype | None  # None: no autocast
    use_scaler: bool
    allow_tf32: bool

    def apply_matmul_flags(self) -> dict[str, str]:
        """Set TF32 on or off for this process and return the flags now in effect, as tags.

        Strict "32" really means fp32. The tags say what a trial's numbers were measured under, not what was meant."""
        if self.device_type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = self.allow_tf32
            torch.backends.cudnn.allow_tf32 = self.allow_tf32
        torch.set_float32_matmul_precision("high" if self.allow_tf32 else "highest")
        return {
            "precision/float32_matmul": torch.get_float32_matmul_precision(),
            "precision/cuda_matmul_tf32": str(torch.backends.cuda.matmul.allow_tf32),
            "precision/cudnn_tf32": str(torch.backends.cudnn.allow_tf32),
            "precision/autocast_dtype": str(self.autocast_dtype).removeprefix("torch.") if self.autocast_dtype else "none",
            "precision/grad_scaler": str(self.use_scaler),
        }

    def autocast(self) -> AbstractContextManager[object]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)

    def make_scaler(self) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler(self.device_type) if self.use_scaler else None

    @staticmethod
    def backward(loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> None:
        (scaler.scale(loss) if scaler is not None else loss).backward()

    @staticmethod
    def step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None, model: torch.nn.Module,
             max_grad_norm: float, force: bool = False) -> None:
        """Unscale (to clip the true gradients), clip, step, update the scale.

        `force`: step even where the scaler would skip (a memory probe must allocate the optimizer's state)."""
        if scaler is not None and (max_grad_norm > 0 or force):
            scaler.unscale_(optimizer)
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        if scaler is None or force:
            optimizer.step()
        else:
            scaler.step(optimizer)
        if scaler is not None:
            scaler.update()


def resolve_precision(name: str, device: torch.device, tf32_under_autocast: bool = False) -> Precision:
    """Map a precision name to what it means on `device`, or raise `UnsupportedError`.

    TF32 is on only for "tf32", or for a mixed precision with `tf32_under_autocast` (the fp32
    matmuls and convolutions autocast leaves in fp32 then use TF32): a mixed precision never
    switches it on silently."""
    if tf32_under_autocast and name == "32":
        raise UnsupportedError("precision 32 is strict fp32: tf32_under_autocast applies to 16-mixed/bf16-mixed; "
                               "use precision tf32 for TF32 without autocast")
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; choose one of {list(PRECISIONS)}")
    kind = device.type
    if kind == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        gpu = torch.cuda.get_device_name(device)
        if name == "tf32" and major < 8:
            raise UnsupportedError(f"tf32 needs compute capability >= 8.0 (Ampere+); {gpu} is {major}.x")
        if name == "bf16-mixed" and not torch.cuda.is_bf16_supported(including_emulation=False):
            raise UnsupportedError(f"bf16 is not supported natively on {gpu}; use 16-mixed")
    elif kind == "cpu":
        if name == "tf32":
            raise UnsupportedError("tf32 is a GPU (Ampere+) format; a CPU has no TF32 mode: use 32 or bf16-mixed")
    else:
        raise UnsupportedError(f"device type {kind!r} is not supported by the loop")
    return Precision(
        name=name,
        device_type=kind,
        autocast_dtype={"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(name),
        use_scaler=name == "16-mixed",
        allow_tf32=kind == "cuda" and (name == "tf32" or (tf32_under_autocast and name != "32")),
    )
