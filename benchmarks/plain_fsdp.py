"""A hand-written FSDP2 training loop, run under `torchrun`: the reference for the sharded strategies' parity.

It is `plain_ddp.py` (its plan, loader, timed window and result) with the model sharded the way torchtitan's
`apply_fsdp` does it, not by our loop's code: `checkpoint_wrapper` on each repeated block with
`--activation-checkpointing full`, then `fully_shard` on each block and on the root over a 1-D mesh of every rank,
`reshard_after_forward` as `--strategy` says (`fsdp`: yes, `fsdp_no_reshard`: no), and under `--precision
bf16-mixed` FSDP2's `MixedPrecisionPolicy` (bf16 parameters, fp32 reduction) instead of autocast. The blocks are
the workload's (`Workload.blocks`, else the largest `nn.ModuleList` of one class: `trainables.sharding.find_blocks`,
the one piece of ours it borrows, so both sides shard the same modules).

    torchrun --standalone --nproc-per-node 2 benchmarks/plain_fsdp.py --workload gpt-lm --out result.json [options]

The JSON written by rank 0 is `plain_ddp.py`'s, with `strategy`, `activation_checkpointing` and `sharded_blocks`
(the blocks `fully_shard` wrapped, besides the root) added.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import torch  # noqa: E402
from plain_ddp import Plan, exit_now, main, parser  # noqa: E402
from torch import nn  # noqa: E402

from trainables.sharding import find_blocks  # noqa: E402
from trainables.workloads.base import Workload  # noqa: E402


def fsdp(model: nn.Module, wl: Workload, args: argparse.Namespace, p: Plan, world: int) -> tuple[nn.Module, Plan]:
    """The model checkpointed and sharded in torchtitan's order; the plan without autocast under bf16-mixed."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    blocks = find_blocks(model, wl.blocks).container
    if args.activation_checkpointing == "full":
        if blocks is None:
            raise SystemExit(f"{type(model).__name__} has no repeated blocks to checkpoint")
        for i, block in enumerate(blocks):
            blocks[i] = checkpoint_wrapper(block)
    mesh = init_device_mesh(p.device.type, (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if p.autocast_dtype is not None else MixedPrecisionPolicy()
    reshard = args.strategy == "fsdp"
    for block in blocks or []:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    args.sharded_blocks = len(blocks or [])  # said in the result: what was sharded, not only what was asked
    return model, dataclasses.replace(p, autocast_dtype=None)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = parser("FSDP2")
    ap.add_argument("--strategy", choices=("fsdp", "fsdp_no_reshard"), default="fsdp")
    ap.add_argument("--activation-checkpointing", choices=("none", "full"), default="none")
    return ap.parse_args(argv)


if __name__ == "__main__":
    main(args=parse(), wrap=fsdp)
    exit_now()
