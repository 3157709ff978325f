"""Training FLOPs per item, counted once on one batch, for a workload that does not declare them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainables.batches import loss_of

logger = logging.getLogger(__name__)


def _cpu_attention_formulas() -> dict[Any, Callable[..., int]]:
    """FLOPs of the CPU flash-attention kernels, which torch's counter does not list (torch 2.13): without
    them attention counts as 0 on a CPU. Same formulas as its CUDA entries; empty where the op is missing."""
    from torch.utils import flop_counter as fc

    ops = torch.ops.aten
    if not hasattr(ops, "_scaled_dot_product_flash_attention_for_cpu"):
        return {}

    def fwd(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> int:
        return int(fc.sdpa_flop_count(q, k, v))

    def bwd(grad_out: Any, q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> int:
        return int(fc.sdpa_backward_flop_count(grad_out, q, k, v))

    return {ops._scaled_dot_product_flash_attention_for_cpu: fwd, ops._scaled_dot_product_flash_attention_for_cpu_backward: bwd}


def op_formulas() -> dict[Any, Callable[..., int]]:
    """Return torch's FLOP formula per op (OpOverloadPacket), the CPU attention kernels' included.

    Each takes the op's arguments and `out_val`, as `FlopCounterMode` calls it: what a dispatch mode of our own
    counts with."""
    from torch.utils import flop_counter as fc

    return {**fc.flop_registry, **{k: fc.shape_wrapper(v) for k, v in _cpu_attention_formulas().items()}}


def flops_per_item(model: nn.Module, step_fn: Callable[[nn.Module, Any], Any], batch: Any,
                   count_items: Callable[[Any], int]) -> float | None:
    """Count the training FLOPs (forward + backward) per item of `batch` on one step.

    Counted by `torch.utils.flop_counter`; None where counting fails or finds nothing to count.

    Pass the bare model (before DDP or `torch.compile`) and a batch already on its device. The
    counter sees matmuls, convolutions and attention (what dominates and what the peak measures),
    not element-wise ops, so the figure is a slight undercount, like the analytic 6·N·tokens.
    The model is left as it was: gradients cleared, buffers (BatchNorm statistics) restored, and
    the RNG streams untouched (dropout draws from a forked stream)."""
    from torch.utils.flop_counter import FlopCounterMode

    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    devices = [p.device for p in model.parameters() if p.device.type == "cuda"][:1]
    try:
        with torch.random.fork_rng(devices=devices), FlopCounterMode(display=False, custom_mapping=_cpu_attention_formulas()) as counter:
            loss_of(step_fn(model, batch), training=True).backward()
        total, items = counter.get_total_flops(), count_items(batch)
    except Exception as exc:  # noqa: BLE001 - a model the counter cannot trace only loses its MFU
        logger.warning("FLOP counting failed (%s: %s): perf/tflops_per_s and MFU will be absent", type(exc).__name__, exc)
        return None
    finally:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
    if total <= 0 or items <= 0:
        return None
    return float(total) / float(items)
