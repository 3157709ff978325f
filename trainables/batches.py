"""What the loop needs to know about a user's batch: move it, count it, get a loss out of a step.

A batch may be a tensor, a tuple/list (named tuples too), a mapping (dict, Hugging Face
`BatchEncoding`) or a dataclass, nested in any way. The loop never looks inside beyond that.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from trainables.loop_errors import WorkloadError

StepFn = Callable[[nn.Module, Any], Any]
CountFn = Callable[[Any], int]
_EVAL_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")  # logged as eval/<name>: MLflow's metric-name characters


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False, channels_last: bool = False) -> Any:
    """`batch` with every tensor in it on `device`, the containers rebuilt as they were.

    `channels_last` puts 4-D floating-point tensors (images) in channels-last memory format."""

    def move(t: torch.Tensor) -> torch.Tensor:
        moved = t.to(device, non_blocking=non_blocking)
        if channels_last and moved.dim() == 4 and moved.is_floating_point():
            moved = moved.contiguous(memory_format=torch.channels_last)
        return moved

    return map_tensors(batch, move)


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`batch` with `fn` applied to every tensor in it, the containers rebuilt as they were."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)

    def each(value: Any) -> Any:
        return map_tensors(value, fn)

    if isinstance(batch, Mapping):
        items = {k: each(v) for k, v in batch.items()}
        try:
            return type(batch)(items)  # type: ignore[call-arg]  # dict subclasses, BatchEncoding, OrderedDict
        except TypeError:  # e.g. defaultdict: its first argument is the factory
            return items
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: each(getattr(batch, f.name))
                                             for f in dataclasses.fields(batch) if f.init})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # named tuple
        return type(batch)(*(each(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(each(v) for v in batch)
    return batch  # numbers, strings, None: left as they are


def _children(batch: Any) -> Any:
    """The values a container batch holds, in its own order (None for a leaf that is not a tensor)."""
    if isinstance(batch, Mapping):
        return batch.values()
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return (getattr(batch, f.name) for f in dataclasses.fields(batch))
    if isinstance(batch, (list, tuple)):
        return batch
    return None


def tensor_bytes(batch: Any) -> int:
    """Bytes of all tensors in `batch` (what a host->device copy of it moves)."""
    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size()
    values = _children(batch)
    return sum(tensor_bytes(v) for v in values) if values is not None else 0


def first_tensor(batch: Any) -> torch.Tensor | None:
    """The first tensor met in `batch`, depth first, in the containers' own order."""
    if isinstance(batch, torch.Tensor):
        return batch
    for value in _children(batch) or ():
        found = first_tensor(value)
        if found is not None:
            return found
    return None


def take_items(batch: Any, n: int, need: int) -> Any | None:
    """Cut the first samples of `batch` (which holds `n` items) that make up about `need` items.

    Every tensor is cut along its leading (sample) dimension, the containers rebuilt. None where the batch cannot
    be cut that way (tensors whose leading sizes differ, no tensor at all): then it is used whole.

    Items are assumed evenly spread over samples (exact for samples, one sample's tokens for tokens);
    at least 2 samples are kept where the batch has them (BatchNorm refuses one in training)."""
    lead = first_tensor(batch)
    if lead is None or lead.dim() == 0 or not _leading_sizes_agree(batch, int(lead.shape[0])):
        return None
    samples = int(lead.shape[0])
    keep = min(samples, max(min(2, samples), math.ceil(samples * need / n)))
    return batch if keep == samples else map_tensors(batch, lambda t: t[:keep] if t.dim() > 0 else t)


def _leading_sizes_agree(batch: Any, size: int) -> bool:
    if isinstance(batch, torch.Tensor):
        return batch.dim() == 0 or int(batch.shape[0]) == size
    values = _children(batch)
    return all(_leading_sizes_agree(v, size) for v in values) if values is not None else True


def default_counter(items_per_sample: int) -> CountFn:
    """Samples in a batch (the leading dimension of its first tensor) x `items_per_sample`."""

    def count(batch: Any) -> int:
        t = first_tensor(batch)
        if t is None or t.dim() == 0:
            raise WorkloadError(f"cannot count the samples of a {type(batch).__name__} batch (no tensor with a batch "
                                "dimension in it): give the workload count_items(batch) -> int")
        return int(t.shape[0]) * items_per_sample

    return count


def checked_count(count_items: CountFn, batch: Any) -> int:
    """`count_items(batch)` as a positive int, or a `WorkloadError` saying what to return."""
    n = count_items(batch)
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise WorkloadError(f"count_items returned {type(n).__name__} {n!r}, not an int: return a Python int, "
                            "e.g. int(batch['attention_mask'].sum())")
    if n <= 0:
        raise WorkloadError(f"count_items returned {n} for a batch: it must count the items trained on (> 0); "
                            "an empty batch should not reach the loop")
    return int(n)


def xy_step(loss_fn: Callable[[Any, Any], Any]) -> StepFn:
    """The default step: `loss_fn(model(x), y)` for `(x, y)` batches."""

    def step(model: nn.Module, batch: Any) -> Any:
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise WorkloadError(f"the default step expects (input, target) batches, got a {type(batch).__name__}: "
                                "give the workload step_fn(model, batch) -> loss")
        x, y = batch
        return loss_fn(model(x), y)

    return step


def loss_of(out: Any, training: bool) -> torch.Tensor:
    """Return the scalar loss in what a step returned.

    A tensor, an object with `.loss` (Hugging Face outputs) or a mapping with "loss"."""
    loss = out
    if isinstance(out, Mapping) and "loss" in out:
        loss = out["loss"]
    elif not isinstance(out, torch.Tensor) and hasattr(out, "loss"):
        loss = out.loss
    if not isinstance(loss, torch.Tensor):
        raise WorkloadError(f"step_fn returned {type(out).__name__}"
                            + (f" whose loss is {type(loss).__name__}" if loss is not out else "")
                            + ": return a scalar tensor, an object with .loss or a mapping with 'loss' (for a Hugging "
                            "Face model, pass labels so it computes its loss)")
    if loss.numel() != 1:
        raise WorkloadError(f"step_fn returned a loss of shape {tuple(loss.shape)}, not a scalar: reduce it "
                            "(e.g. .mean()) inside step_fn")
    if training and not loss.requires_grad:
        raise WorkloadError("step_fn returned a loss without grad (detached, computed under no_grad, or made "
                            "from .item()): return the loss tensor the model computed")
    return loss.reshape(())


def checked_eval(values: Any) -> dict[str, Any]:
    """eval_fn's dict of name -> number (int, float or a one-element tensor), or a `WorkloadError`."""
    if not isinstance(values, Mapping):
        raise WorkloadError(f"eval_fn returned {type(values).__name__}: return a dict of name -> number, "
                            "e.g. {'accuracy': (pred == y).float().mean()}")
    names = [k for k in values if not (isinstance(k, str) and _EVAL_NAME.match(k))]
    if names:
        raise WorkloadError(f"eval_fn returned the name {names[0]!r}: names are logged as eval/<name>, so use letters, "
                            "digits, '_', '.' or '-' (e.g. 'accuracy')")
    bad = {k: v for k, v in values.items()
           if isinstance(v, bool)
           or not (isinstance(v, numbers.Real) or (isinstance(v, torch.Tensor) and v.numel() == 1))}
    if bad:
        shown = ", ".join(f"{k!r}: {type(v).__name__}" for k, v in list(bad.items())[:3])
        raise WorkloadError(f"eval_fn returned non-numbers ({shown}): each value must be a number or a "
                            "one-element tensor, under a string name")
    return dict(values)
