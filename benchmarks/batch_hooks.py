"""What the open step contract costs per step: the recursive batch move and the count_items hook,
next to the image workload's real step time, measured in one run.

The loop used to unpack `x, y = batch` and copy two tensors; it now walks any batch structure
(`trainables.batches.move_to_device`) and counts each batch (`checked_count` over the default
counter: leading dimension x items_per_sample). Both run on the host, once per micro-batch.

  hooks_us  = median time of checked_count + move_to_device on a real image-cnn batch
  fixed_us  = median time of the old path: x.to(device), y.to(device)
  step_ms   = the loop's own time/step_ms for the same workload and batch (fresh process)
  overhead  = (hooks_us - fixed_us) / (1000 x step_ms)      goal: <= 1%

    .venv/bin/python benchmarks/batch_hooks.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch
from common import REPO, record, run_loop, summary, table

from trainables.batches import checked_count, default_counter, move_to_device
from trainables.contract import TrialConfig
from trainables.loader import make_loader as _make_loader
from trainables.registry import build
from trainables.workloads.base import BuildContext

PARAMS = {"image_size": 32, "num_train_images": 1024, "num_val_images": 64, "width": 16, "depth": 1}
BATCH = 32
ARGS = ["--workload", "image-cnn", "--params", '{"image_size": 32, "num_train_images": 1024, "num_val_images": 64, '
        '"width": 16, "depth": 1}', "--batch-size", str(BATCH), "--num-steps", "40", "--num-warmup-steps", "5",
        "--threads-per-worker", "1", "--telemetry-period-s", "0", "--data-dir", str(REPO / ".cache" / "datasets")]
REPEATS = 2000  # calls per timing: the hooks take microseconds


def _per_call_us(fn: Any, batches: list[Any]) -> float:
    t0 = time.perf_counter()
    for i in range(REPEATS):
        fn(batches[i % len(batches)])
    return 1e6 * (time.perf_counter() - t0) / REPEATS


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    device = torch.device("cpu")
    wl = build("image-cnn", PARAMS, BuildContext(str(REPO / ".cache" / "datasets"), 0))
    cfg = TrialConfig(workload="image-cnn", workload_params=PARAMS, batch_size=BATCH, precision="32", lr=1e-3, num_steps=1)
    loader, _ = _make_loader(wl, cfg, pin=False, train=True, rank=0, world=1)
    batches = [b for _, b in zip(range(8), loader, strict=False)]  # real decoded batches
    count = default_counter(wl.items_per_sample)

    def hooks(batch: Any) -> None:
        checked_count(count, batch)
        move_to_device(batch, device, False, False)

    def fixed(batch: Any) -> None:
        x, y = batch
        x.to(device, non_blocking=False), y.to(device, non_blocking=False)

    hook_us, fixed_us, step_ms = [], [], []
    for r in range(a.rounds):  # alternate: hooks, fixed, the loop's step time
        hook_us.append(_per_call_us(hooks, batches))
        fixed_us.append(_per_call_us(fixed, batches))
        step_ms.append(run_loop(ARGS)["time/step_ms"])
        print(f"round {r + 1}: hooks {hook_us[-1]:.1f} us, fixed {fixed_us[-1]:.1f} us, step {step_ms[-1]:.1f} ms",
              file=sys.stderr)
    h, f, s = (summary(v) for v in (hook_us, fixed_us, step_ms))
    overhead_pct = 100 * (h["median"] - f["median"]) / (1000 * s["median"])
    print(table(["figure", "median (min-max)"], [
        ["hooks (count + recursive move), us", f"{h['median']:.1f} ({h['min']:.1f}-{h['max']:.1f})"],
        ["old fixed (x, y) move, us", f"{f['median']:.1f} ({f['min']:.1f}-{f['max']:.1f})"],
        ["image-cnn step, ms", f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"],
        ["overhead = (hooks - fixed) / step", f"{overhead_pct:.3f}%  (goal <= 1%)"],
    ]))
    record("batch_hooks", "python benchmarks/batch_hooks.py " + " ".join(sys.argv[1:]),
           [{"hooks_us": h, "fixed_us": f, "step_ms": s, "overhead_pct": overhead_pct, "batch_size": BATCH}])
    return 0


if __name__ == "__main__":
    sys.exit(main())
