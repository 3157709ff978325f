"""A hand-written PyTorch DDP training loop, run under `torchrun`: the reference for loop parity.

Deliberately *not* our loop (`trainables.loop`): no telemetry, no step timer, no reporter, no
precision object — just DataLoader + DistributedSampler, DDP, AdamW, forward/backward/step, timed
with `perf_counter` between two barriers after warm-up (the GPU synchronised at both ends). It
borrows only the workload (model, dataset, its step or loss) and the small batch helpers
(`move_to_device`, `loss_of`, `xy_step`), so both sides train exactly the same thing.

On CUDA it does what a careful hand-written loop does: NCCL with each rank's device set before the
group starts, pinned memory and non-blocking copies (with `--pin-memory`), fused AdamW, bf16
autocast for `--precision bf16-mixed`, channels-last images where the workload asks for them, and
strict fp32 (no TF32) for `--precision 32`, as our loop's "32" means. The device and backend
choices are `plan()`, a pure function.

    torchrun --standalone --nproc-per-node 2 benchmarks/plain_ddp.py --out result.json [options]

The JSON written by rank 0: `throughput` (items/s in the workload's `unit`, summed over ranks),
`elapsed_s` (the slowest rank's window), `items`, `unit`, `world_size`, `backend`, `device`, `precision`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset  # noqa: E402

from trainables.batches import default_counter, loss_of, move_to_device, xy_step  # noqa: E402
from trainables.registry import build  # noqa: E402
from trainables.workloads.base import BuildContext, Workload  # noqa: E402

PRECISIONS = ("32", "bf16-mixed")


@dataclass(frozen=True)
class Plan:
    """Where this rank trains and how its collectives run."""

    backend: str  # "nccl" (CUDA) or "gloo" (CPU)
    device: torch.device  # the model, the batches and every collective's tensors live here
    pin_memory: bool  # pinned host memory, so copies can be non-blocking
    non_blocking: bool
    fused_adamw: bool  # our loop's default optimizer on CUDA
    autocast_dtype: torch.dtype | None  # None: fp32


def plan(cuda_available: bool, local_rank: int, precision: str = "32", pin_memory: bool = False) -> Plan:
    """The device and backend choices for one rank (no side effects)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {PRECISIONS}")
    dtype = torch.bfloat16 if precision == "bf16-mixed" else None
    if cuda_available:
        return Plan("nccl", torch.device("cuda", local_rank), pin_memory, pin_memory, True, dtype)
    return Plan("gloo", torch.device("cpu"), False, False, False, dtype)


def init_distributed(p: Plan) -> None:
    """Start the process group. NCCL needs the rank's device set first: otherwise every rank's
    barrier and communicator land on GPU 0."""
    if p.device.type == "cuda":
        torch.cuda.set_device(p.device)
        dist.init_process_group(p.backend, device_id=p.device)
    else:
        dist.init_process_group(p.backend)


def barrier(p: Plan) -> None:
    """All ranks here, with the GPU's queued work finished (a barrier alone does not wait for it)."""
    if p.device.type == "cuda":
        torch.cuda.synchronize(p.device)
        dist.barrier(device_ids=[p.device.index])
    else:
        dist.barrier()


def reduce_window(elapsed_s: float, items: int, p: Plan) -> tuple[float, int]:
    """(the slowest rank's window, the items of all ranks). The tensors live on the plan's device:
    NCCL reduces CUDA tensors only."""
    elapsed = torch.tensor([elapsed_s], dtype=torch.float64, device=p.device)
    count = torch.tensor([items], dtype=torch.int64, device=p.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    dist.all_reduce(count, op=dist.ReduceOp.SUM)
    return float(elapsed.item()), int(count.item())


def _loader(wl: Workload, p: Plan, args: argparse.Namespace, rank: int,
            world: int) -> tuple[DataLoader[Any], DistributedSampler[Any] | None]:
    sampler: DistributedSampler[Any] | None = None
    if not isinstance(wl.train_dataset, IterableDataset):  # an IterableDataset shards itself by rank
        sampler = DistributedSampler(wl.train_dataset, world, rank, shuffle=True, seed=args.seed, drop_last=True)
    workers = args.num_dataloader_workers
    loader = DataLoader(wl.train_dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=workers, pin_memory=p.pin_memory, persistent_workers=workers > 0,
                        collate_fn=wl.collate_fn)
    return loader, sampler


def _batches(loader: DataLoader[Any], sampler: DistributedSampler[Any] | None) -> Iterator[Any]:
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def ddp(model: nn.Module, wl: Workload, args: argparse.Namespace, p: Plan, world: int) -> tuple[nn.Module, Plan]:
    """The model as the step trains it, and the plan it trains under: DDP's wrapper over 2+ ranks.

    One process has no gradients to average: like our loop, no DDP wrapper (and no bucket copies) then."""
    trained = DistributedDataParallel(model, device_ids=[p.device.index] if p.device.type == "cuda" else None) \
        if world > 1 else model
    return trained, p


Wrap = Callable[[nn.Module, Workload, argparse.Namespace, Plan, int], tuple[nn.Module, Plan]]


def run(args: argparse.Namespace, p: Plan, rank: int, world: int, wrap: Wrap = ddp) -> dict[str, Any]:
    """Warm up, then time `args.num_steps` steps; returns rank 0's result (every rank computes it).

    `wrap` makes the trained model from the bare one (`ddp`; `plain_fsdp.fsdp` shards it), and may change the
    plan (FSDP2's mixed precision policy replaces autocast)."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if p.device.type == "cuda":  # "32" is strict fp32, as in our loop; TF32 is its own precision there
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    wl = build(args.workload, json.loads(args.params), BuildContext(args.data_dir, args.seed, rank, world))
    channels_last = p.device.type == "cuda" and wl.channels_last
    model = wl.model.to(p.device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    trained, p = wrap(model, wl, args, p, world)
    opt = (wl.optimizer_fn(model, args.lr) if wl.optimizer_fn is not None
           else torch.optim.AdamW(model.parameters(), lr=args.lr, fused=p.fused_adamw))
    step_fn = wl.step_fn or xy_step(wl.loss_fn)  # type: ignore[arg-type]  # a workload has one of them
    count = wl.count_items or default_counter(wl.items_per_sample)
    loader, sampler = _loader(wl, p, args, rank, world)
    it = _batches(loader, sampler)

    autocast = (torch.autocast(p.device.type, dtype=p.autocast_dtype) if p.autocast_dtype is not None
                else contextlib.nullcontext())
    trained.train()
    t0, items = 0.0, 0
    for step in range(args.num_warmup_steps + args.num_steps):
        if step == args.num_warmup_steps:
            barrier(p)
            t0 = time.perf_counter()
        batch = next(it)
        if step >= args.num_warmup_steps:
            items += count(batch)
        batch = move_to_device(batch, p.device, non_blocking=p.non_blocking, channels_last=channels_last)
        with autocast:
            loss = loss_of(step_fn(trained, batch), training=True)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if p.device.type == "cuda":
        torch.cuda.synchronize(p.device)
    elapsed, total = reduce_window(time.perf_counter() - t0, items, p)
    return {"throughput": total / elapsed, "unit": wl.unit, "elapsed_s": elapsed, "items": total,
            "steps": args.num_steps, "world_size": world, "backend": p.backend,
            "device": torch.cuda.get_device_name(p.device) if p.device.type == "cuda" else "cpu",
            "precision": args.precision,
            **{k: getattr(args, k) for k in ("strategy", "activation_checkpointing", "sharded_blocks")
               if hasattr(args, k)}}


def parser(what: str = "DDP") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=f"the plain {what} reference loop (run under torchrun)")
    ap.add_argument("--workload", default="image-cnn")
    ap.add_argument("--params", default="{}")
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--num-steps", type=int, default=100)
    ap.add_argument("--num-warmup-steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", choices=PRECISIONS, default="32", help="bf16-mixed: bf16 autocast (CPU or GPU)")
    ap.add_argument("--num-dataloader-workers", type=int, default=0)
    ap.add_argument("--pin-memory", action="store_true", help="pinned batches and non-blocking copies (CUDA only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=".cache/datasets")
    ap.add_argument("--out", required=True)
    return ap


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    return parser().parse_args(argv)


def main(argv: list[str] | None = None, args: argparse.Namespace | None = None, wrap: Wrap = ddp) -> None:
    args = args or parse(argv)
    p = plan(torch.cuda.is_available(), int(os.environ.get("LOCAL_RANK", "0")), args.precision, args.pin_memory)
    if args.pin_memory and not p.pin_memory and int(os.environ.get("RANK", "0")) == 0:
        warnings.warn("--pin-memory has no effect without CUDA; running unpinned", stacklevel=1)
    init_distributed(p)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        result = run(args, p, rank, world, wrap)
        if rank == 0:
            Path(args.out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def exit_now() -> None:
    """End the process at once. As trainables.launch does: after DDP the gloo group outlives
    destroy_process_group (torch 2.13) and a worker thread of it can abort the interpreter's finalization
    (SIGABRT after the result was written)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    exit_now()
