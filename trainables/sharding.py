"""How a trial's model is held across its ranks.

Its repeated blocks found, activation checkpointing on each, `torch.compile` per block, then FSDP2's
`fully_shard` on each block and the root, in torchtitan's order.

The blocks are the ones a `Workload` names (`Workload.blocks`: the dotted name of a `ModuleList`), else the
largest `nn.ModuleList` whose children are all of one class (GPT's `h`, a Hugging Face LM's `model.layers`); a
model with none is sharded whole, and activation checkpointing then has nothing to wrap (refused, with the fix).
With sharding and `bf16-mixed`, FSDP2's `MixedPrecisionPolicy` (bf16 parameters, fp32 gradient reduction) is the
mixed precision: the loop runs no autocast then. DDP is `build.py`'s, unchanged; checkpointing applies under it too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainables.knobs import SHARDED
from trainables.loop_errors import UnsupportedError

BLOCKS_TAG = "memory/blocks"  # tags (text), not metrics: which blocks were wrapped, and how the model is held
SHARDING_TAG = "memory/sharding"


@dataclass(frozen=True)
class Blocks:
    """A model's repeated blocks: their container, its dotted name in the model and their class."""

    container: nn.ModuleList | None  # None: no repeated blocks
    path: str
    kind: str

    @property
    def count(self) -> int:
        return len(self.container) if self.container is not None else 0

    def describe(self) -> str:
        """How the tag says it: "12 x Block (h)", or that there are none."""
        if self.container is None:
            return "none: the model is one unit"
        return f"{self.count} x {self.kind} ({self.path})"


def find_blocks(model: nn.Module, named: str | None = None) -> Blocks:
    """Return the model's repeated blocks: the `ModuleList` named `named`, else the largest of one block class.

    Largest by its number of blocks, then by its parameters; a `ModuleList` whose children differ in class is
    not a run of blocks. Raises `UnsupportedError` where `named` is not a `ModuleList` of the model."""
    if named is not None:
        found = model.get_submodule(named) if named else model
        if not isinstance(found, nn.ModuleList) or len(found) == 0:
            raise UnsupportedError(f"Workload.blocks names {named!r}, which is {type(found).__name__}, not a "
                                   "non-empty nn.ModuleList of the model's repeated blocks")
        return Blocks(found, named, type(found[0]).__name__)
    best: tuple[int, int] = (0, 0)
    chosen = Blocks(None, "", "")
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        kinds = {type(child) for child in module}
        size = (len(module), sum(p.numel() for p in module.parameters()))
        if len(kinds) == 1 and size > best:
            best, chosen = size, Blocks(module, path, type(module[0]).__name__)
    return chosen


# torchtitan's per-op selective policy: keep these ops' outputs, recompute the rest, and keep only every other
# matmul's. `addmm` is a matmul too (a Linear with a bias); the CPU's flash attention is the one SDPA runs here.
_SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.max.default,
}
_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


def keeps(func: Any, counts: dict[str, int], mode: str) -> bool:
    """Whether the selective policy keeps `func`'s output (`counts`: the block's matmuls so far, per `mode`)."""
    if func in _MATMULS:
        counts[mode] += 1
    return func in _SAVE_OPS and not (func in _MATMULS and counts[mode] % 2 == 0)


def _selective_context() -> Any:
    """A fresh pair of contexts for one checkpointed call: the per-op policy, its matmul count reset."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    counts: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        keep = keeps(func, counts, "recompute" if ctx.is_recompute else "forward")
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def checkpointed(block: nn.Module, mode: str) -> nn.Module:
    """`block` wrapped to recompute its activations in backward: all of them (full), or per op (selective)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if mode == "full":
        return checkpoint_wrapper(block, preserve_rng_state=False)  # type: ignore[no-any-return]
    assert mode == "selective", mode
    return checkpoint_wrapper(block, context_fn=_selective_context,  # type: ignore[no-any-return]
                              preserve_rng_state=False)


def wrap_blocks(blocks: Blocks, wrap: Callable[[nn.Module], nn.Module]) -> None:
    """Replace each block in its container by `wrap(block)`, in place."""
    assert blocks.container is not None
    for i, block in enumerate(list(blocks.container)):
        blocks.container[i] = wrap(block)


@dataclass(frozen=True)
class Layout:
    """What `shard` did to the model (wrapped in place): whether FSDP2 holds it, and the tags that say so."""

    sharded: bool
    tags: dict[str, str]
    shard_over: int  # the ranks each parameter is split over: the world, one node's ranks under hsdp (DDP: the world, unused)


@dataclass(frozen=True)
class Wrapping:
    """What `shard` does to a model: the data-parallel strategy, activation checkpointing, per-block compile."""

    strategy: str
    ac: str
    compile_blocks: bool
    precision: str
    offload: bool = False  # FSDP2's CPUOffloadPolicy (CUDA only: on a CPU the model is in host memory already)

    @classmethod
    def of(cls, strategy: str, ac: str, compile_model: bool, precision: str, offload: bool = False) -> Wrapping:
        """A trial's wrapping from its knobs: compile goes per block where the model is sharded."""
        return cls(strategy, ac, compile_model and strategy in SHARDED, precision, offload)


def offloads(asked: bool, device: torch.device) -> bool:
    """Whether `cpu_offload` moves anything to host memory: asked for, on CUDA (a CPU's model is there already)."""
    return asked and device.type == "cuda"


def node_layout(world_size: int) -> tuple[int, int]:
    """Return this trial's (nodes, ranks per node), from every rank's `LOCAL_WORLD_SIZE`.

    torchrun and Ray Train set it; it is gathered, so that all ranks agree or all raise the same
    `UnsupportedError` (never a mesh some ranks disagree on, which would hang them). Call it on every rank."""
    import os

    import torch.distributed as dist

    mine = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    every = [mine]
    if world_size > 1 and dist.is_initialized():
        every = [0] * world_size
        dist.all_gather_object(every, mine)
    if len(set(every)) != 1 or world_size % every[0]:
        raise UnsupportedError(f"strategy hsdp needs the same number of ranks on every node, and the trial's "
                               f"{world_size} ranks run {sorted(every)} per node; place them evenly (e.g. "
                               "scaling.num_workers a multiple of the GPUs per node) or use strategy fsdp")
    return world_size // every[0], every[0]


def shard(model: nn.Module, blocks: Blocks, wrapping: Wrapping, device: torch.device, world_size: int) -> Layout:
    """Checkpoint, compile and shard the model's blocks, in torchtitan's order.

    Activation checkpointing on each block, `torch.compile` on each block (when `compile_blocks`), then
    `fully_shard` on each block and the root (a sharded `strategy`). Raises `UnsupportedError` for activation
    checkpointing without blocks to wrap."""
    strategy, ac, compile_blocks, precision = (wrapping.strategy, wrapping.ac, wrapping.compile_blocks,
                                               wrapping.precision)
    # which blocks were wrapped, where any were: a plain DDP trial's tags stay as they were
    tags = {BLOCKS_TAG: blocks.describe()} if ac != "none" or strategy in SHARDED else {}
    if ac != "none":
        if blocks.container is None:
            raise UnsupportedError(f"activation_checkpointing {ac} wraps the model's repeated blocks, and "
                                   f"{type(model).__name__} has no nn.ModuleList of one block class; name them "
                                   "(Workload.blocks) or use activation_checkpointing none")
        wrap_blocks(blocks, lambda b: checkpointed(b, ac))
    if compile_blocks and blocks.container is not None:
        wrap_blocks(blocks, lambda b: torch.compile(b))  # type: ignore[arg-type, return-value]
    if strategy not in SHARDED:
        return Layout(False, tags, world_size)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    nodes, per_node = node_layout(world_size) if strategy == "hsdp" else (1, world_size)
    # "cpu" for gloo (a gloo group on a GPU host: #132471); hsdp: 2-D, replicated over the first dimension
    mesh = init_device_mesh(device.type, (world_size,)) if strategy != "hsdp" else \
        init_device_mesh(device.type, (nodes, per_node), mesh_dim_names=("replicate", "shard"))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if precision == "bf16-mixed" else MixedPrecisionPolicy()
    offload = offloads(wrapping.offload, device)
    policy = CPUOffloadPolicy() if offload else OffloadPolicy()
    reshard = strategy != "fsdp_no_reshard"
    for block in blocks.container or []:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=policy)
    said = (f"{strategy} over {world_size} rank(s)" if strategy != "hsdp" else
            f"hsdp over {nodes} node(s) x {per_node} rank(s): sharded within a node, replicated across nodes"
            + (" (one node: as fsdp)" if nodes == 1 else "")) + \
        (", bf16 parameters, fp32 reduction" if precision == "bf16-mixed" else "")
    if world_size == 1:
        said += ": one rank shards nothing (FSDP2's code path, DDP's memory)"
    if blocks.container is None:
        said += "; no repeated blocks: sharded whole"
    if wrapping.offload:
        said += ("; shards, gradients and optimizer state in host memory (CPUOffloadPolicy)" if offload else
                 "; cpu_offload: nothing to move without CUDA (the model is in host memory already)")
    tags[SHARDING_TAG] = said
    return Layout(True, tags, per_node)
