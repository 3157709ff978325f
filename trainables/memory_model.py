"""A trial's peak memory per rank, predicted before its first step: model states by strategy, activations measured.

Model states come from the parameter count (bytes per parameter: fp32 parameters and gradients, the optimizer's
state; DDP's gradient buckets; under FSDP2 a 1/world shard of each plus what it gathers unsharded at once: the root
and two blocks in flight with `reshard_after_forward`, every block without it). Activations come from measured
forwards on the bare model, under the trial's autocast (`measure_activations`): what autograd saves for backward
outside the blocks and inside each, each block's input, and the outputs of the ops torchtitan's selective policy
keeps (`sharding.keeps`), so one forward gives all three activation-checkpointing modes. Forwards of one sample and
of two split what grows with the micro-batch from what a forward saves once (autocast's 16-bit weight copies:
`Activations.fit`); the first gradient backward makes (of the largest saved tensor that grows with the batch)
is added, or the block a checkpointed backward recomputes, which never lives with it, where that is larger. The
same forward counts the FLOPs each mode recomputes in backward (full: every block's forward; selective: the block
ops the policy does not keep), by torch's FLOP formulas: the hardware FLOPs beside the model's (`perf/hfu_pct` beside `perf/mfu_pct`).

What it leaves out, on purpose and said in `docs/explain/memory.md`: the allocator's fragmentation and cache
(the gap between `memory/max_allocated_gib` and `memory/max_reserved_gib`), the communication buffers, the
backward's transient gradients of one block, and on a CPU everything the process holds besides the model (its
libraries, the data): there the prediction orders configurations, the resident set does not equal it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from trainables.flop_count import op_formulas
from trainables.knobs import SHARDED
from trainables.sharding import Blocks, keeps

GIB = 1024**3
MODES = ("none", "selective", "full")
# Which of the build's measuring forwards runs now (1, 2; 0: none): a workload whose model counts its own forwards
# (the fault-injecting test workloads) can tell the build's second one apart, which it did not make before
measuring_pass = 0


@dataclass(frozen=True)
class Activations:
    """Bytes the forward keeps for backward, by activation-checkpointing mode.

    Per sample, and what does not grow with the micro-batch (autocast's 16-bit copies of the weights: one per
    forward, whatever its batch)."""

    none: int  # per sample
    selective: int
    full: int
    # the sample's forward FLOPs each mode runs again in backward (none: 0)
    recomputed_selective_flops: float = 0.0
    recomputed_full_flops: float = 0.0
    items: int = 1  # the sample's items in the workload's unit (tokens, samples): FLOPs per item divide by it
    fixed_none: int = 0  # per forward, whatever its batch
    fixed_selective: int = 0
    fixed_full: int = 0
    # per sample: the gradient of the largest tensor the forward saved that grows with the batch (the loss's
    # input, mostly), which backward makes first, while every saved tensor is still alive
    first_grad: int = 0
    # per sample, of `selective` and `full`: the one block backward recomputes at a time, which lives after the
    # first gradient is gone, never with it
    rebuilt_selective: int = 0
    rebuilt_full: int = 0
    sizes: tuple[int, ...] = ()  # of one forward: each storage it saved, by size (what `fit` compares)

    def of(self, mode: str, batch: int = 1, fixed: bool = True) -> int:
        """Return the bytes under `mode` (`none`, `selective` or `full`) for a micro-batch of `batch` samples.

        At backward's peak: the saved tensors and the first gradient, or, where larger, the block recomputed.
        `fixed` False leaves out what a forward saves once (a sharded model: FSDP2 gathers the 16-bit
        parameters, counted in its model states, instead of autocast copying them)."""
        once = int(getattr(self, f"fixed_{mode}")) if fixed else 0
        kept = int(getattr(self, mode))
        rebuilt = min(int(getattr(self, f"rebuilt_{mode}", 0)), kept)
        return once + batch * (kept - rebuilt + max(rebuilt, self.first_grad))

    def recomputed_flops(self, mode: str) -> float:
        """Return the forward FLOPs `mode` recomputes in backward, per item (0 for `none`)."""
        return 0.0 if mode == "none" else float(getattr(self, f"recomputed_{mode}_flops")) / max(self.items, 1)

    @classmethod
    def fit(cls, one: Activations, two: Activations) -> Activations:
        """Split two measured forwards, of one sample and of two, into bytes per sample and bytes per forward."""
        per = {m: max(getattr(two, m) - getattr(one, m), 0) for m in MODES}
        gained = Counter(two.sizes) - Counter(one.sizes)  # the storages that grew with the batch, at their size for 2
        return cls(**per, recomputed_selective_flops=one.recomputed_selective_flops,
                   recomputed_full_flops=one.recomputed_full_flops, items=one.items,
                   **{f"fixed_{m}": max(getattr(one, m) - per[m], 0) for m in MODES},
                   first_grad=max(gained, default=0) // 2,
                   **{f"rebuilt_{m}": max(getattr(two, f"rebuilt_{m}") - getattr(one, f"rebuilt_{m}"), 0)
                      for m in ("selective", "full")})


@dataclass(frozen=True)
class Prediction:
    """A rank's predicted peak, in bytes, in its two parts."""

    states: int  # parameters, gradients, optimizer state, buckets, what FSDP2 gathers at once
    activations: int  # what the micro-batch's forward keeps for backward

    @property
    def total_gib(self) -> float:
        return (self.states + self.activations) / GIB

    @property
    def activations_gib(self) -> float:
        return self.activations / GIB


@dataclass(frozen=True)
class ParamCounts:
    """A model's parameters: all (a tied weight once), those outside its blocks, each block's."""

    total: int
    root: int
    blocks: tuple[int, ...]

    @classmethod
    def of(cls, model: nn.Module, blocks: Blocks) -> ParamCounts:
        """Count them on the bare model (before sharding)."""
        total = sum(p.numel() for p in model.parameters())
        each = tuple(sum(p.numel() for p in b.parameters()) for b in blocks.container or [])
        return cls(total, total - sum(each), each)


def optimizer_bytes_per_param(optimizer: torch.optim.Optimizer) -> int | None:
    """State bytes per fp32 parameter of the optimizers whose state is known: Adam's two moments, SGD's momentum."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return 8
    if isinstance(optimizer, torch.optim.SGD):
        return 4 if optimizer.defaults.get("momentum", 0) else 0
    return None


def model_states(counts: ParamCounts, world: int, strategy: str, compute_bytes: int, optimizer_bytes: int,
                 offloaded: bool = False) -> int:
    """Bytes of model states per rank, on its device.

    `compute_bytes`: a parameter's bytes in the forward (2 with bf16 parameters or autocast, else 4); `offloaded`:
    the shard, its gradients and optimizer state live in host memory (FSDP2's CPUOffloadPolicy on a GPU), so the
    device holds what is gathered only. `world`: the ranks the states are sharded over, for `hsdp` a node's."""
    params, root_params, block_params = counts.total, counts.root, counts.blocks
    per_param = 4 + 4 + optimizer_bytes  # fp32 parameter, fp32 gradient, the optimizer's state
    if strategy not in SHARDED:  # autocast's 16-bit weight copies that backward needs are measured activations
        buckets = 4 * params if world > 1 else 0  # DDP reduces gradients in buckets of their own
        return per_param * params + buckets
    shard = per_param * params // max(world, 1)
    if strategy in ("fsdp", "hsdp"):  # the root's parameters, and at most two blocks gathered at once (one prefetched)
        largest = sorted(block_params, reverse=True)[:2]
        gathered = root_params + sum(largest)
    else:  # fsdp_no_reshard: every block stays gathered from its forward to its backward
        gathered = params
    return (0 if offloaded else shard) + compute_bytes * gathered


class _KeptOutputs(TorchDispatchMode):
    """Inside a block: the bytes of the outputs torchtitan's selective policy keeps (`sharding.keeps`)."""

    def __init__(self) -> None:
        super().__init__()
        self.block: int | None = None  # the block running now, by its place in the forward
        self.counts: dict[str, int] = defaultdict(int)
        self.kept: dict[int, int] = defaultdict(int)  # per block
        self.flops: dict[int, float] = defaultdict(float)  # per block: its forward's FLOPs
        self.unkept_flops: dict[int, float] = defaultdict(float)  # per block: of the ops the policy recomputes
        self.formulas = op_formulas()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.block is None:
            return out
        formula = self.formulas.get(func._overloadpacket)
        try:  # a formula that cannot read these arguments loses its op's FLOPs, never the memory measurement
            flops = float(formula(*args, **(kwargs or {}), out_val=out)) if formula is not None else 0.0
        except Exception:  # noqa: BLE001
            flops = 0.0
        self.flops[self.block] += flops
        if keeps(func, self.counts, "forward"):
            first = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(first, torch.Tensor):
                self.kept[self.block] += first.numel() * first.element_size()
        else:
            self.unkept_flops[self.block] += flops
        return out


def measure_activations(model: nn.Module, blocks: Blocks, forward: Callable[[nn.Module], torch.Tensor],
                        autocast: Any = None) -> Activations:
    """Run `forward(model)` once and return what it keeps for backward under each AC mode.

    All of it as if per sample, for a forward of one: `Activations.fit` splits the forwards of one sample and of
    two into what grows with the batch and what does not.

    Parameters and buffers are not activations (their storages are left out); a storage saved twice counts once.
    The model is left as it was (its gradients untouched: no backward runs), and nothing saved outlives it."""
    owned = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: set[int] = set()
    saved: dict[int | None, int] = defaultdict(int)  # per block (None: outside the blocks)
    inputs = 0
    kept = _KeptOutputs()

    held: list[torch.Tensor] = []  # every saved tensor, alive until the forward ends: no storage is reused
    sizes: list[int] = []

    def pack(t: torch.Tensor) -> None:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in owned and ptr not in seen:
            seen.add(ptr)
            saved[kept.block] += t.untyped_storage().nbytes()
            sizes.append(t.untyped_storage().nbytes())
        held.append(t)
        # Not the tensor itself: no backward runs, and a hook that returns a saved output closes a reference cycle
        # (output -> its grad_fn -> the output) that outlived the measurement, activations and all
        return None

    def unpack(_: None) -> torch.Tensor:
        raise RuntimeError("the activation measurement keeps no tensor: no backward may run through it")

    calls: list[int] = []  # each block's forward, in order

    def enter(_: nn.Module, args: tuple[Any, ...]) -> None:
        nonlocal inputs
        inputs += sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
        kept.block = len(calls)
        calls.append(kept.block)
        kept.counts.clear()

    def leave(*_: Any) -> None:
        kept.block = None

    hooks = [h for b in (blocks.container or []) for h in (b.register_forward_pre_hook(enter),
                                                           b.register_forward_hook(leave))]
    try:
        with ExitStack() as stack:
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, unpack))
            stack.enter_context(autocast if autocast is not None else nullcontext())
            stack.enter_context(kept)
            loss = forward(model)
        del loss
    finally:
        held.clear()
        for h in hooks:
            h.remove()
    outside = saved[None]
    if not calls:  # no blocks: checkpointing has nothing to wrap (refused), all is "outside"
        return Activations(outside, outside, outside, first_grad=max(sizes, default=0), sizes=tuple(sorted(sizes)))
    inside = sum(saved[b] for b in calls)
    # the backward recomputes one block at a time: its activations (the policy's recomputed ones) live at once
    recomputed_full = max(saved[b] for b in calls)
    recomputed_selective = max(max(saved[b] - kept.kept[b], 0) for b in calls)
    none = outside + inside
    return Activations(none=none, selective=min(outside + inputs + sum(kept.kept.values()) + recomputed_selective, none),
                       full=min(outside + inputs + recomputed_full, none),
                       recomputed_selective_flops=sum(kept.unkept_flops.values()),
                       recomputed_full_flops=sum(kept.flops.values()), first_grad=max(sizes, default=0),
                       rebuilt_selective=recomputed_selective, rebuilt_full=recomputed_full, sizes=tuple(sorted(sizes)))
