"""A hand-written PyTorch DDP training loop, run under `torchrun`: the reference for loop parity.

Deliberately *not* our loop (`trainables.loop`): no telemetry, no step timer, no reporter, no
precision object — just DataLoader + DistributedSampler, DDP, AdamW, forward/backward/step, timed
with `perf_counter` between two barriers after warm-up. It borrows only the workload (model,
dataset, loss) so both sides train exactly the same thing.

    torchrun --standalone --nproc-per-node 2 benchmarks/plain_ddp.py --out result.json [options]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from trainables.registry import build
from trainables.workloads.base import BuildContext


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="image-cnn")
    p.add_argument("--params", default="{}")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--num-steps", type=int, default=100)
    p.add_argument("--num-warmup-steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (CPU or GPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=".cache/datasets")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    wl = build(args.workload, json.loads(args.params), BuildContext(args.data_dir, args.seed, rank, world))
    model = DistributedDataParallel(wl.model.to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sampler = DistributedSampler(wl.train_dataset, world, rank, shuffle=True, seed=args.seed, drop_last=True)  # type: ignore[arg-type]
    loader = DataLoader(wl.train_dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    def batches():  # type: ignore[no-untyped-def]
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    it = batches()
    model.train()
    t0 = 0.0
    for step in range(args.num_warmup_steps + args.num_steps):
        if step == args.num_warmup_steps:
            dist.barrier()
            t0 = time.perf_counter()
        x, y = next(it)
        x, y = x.to(device), y.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            loss = wl.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    items = args.num_steps * args.batch_size * world * wl.items_per_sample
    if rank == 0:
        Path(args.out).write_text(json.dumps({"throughput": items / float(elapsed), "elapsed_s": float(elapsed)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
