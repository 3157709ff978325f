"""Precision ladder on this CPU: fp32 vs bf16-mixed (and fp16-mixed) per workload.

Same workload, batch and thread count; each precision in a fresh single-rank process, in
alternating order over rounds; medians reported next to the CPU's ISA flags (avx512_bf16/AMX
decide whether bf16 runs natively).

    .venv/bin/python benchmarks/precision_ladder.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import machine, record, run_loop, summary, table  # noqa: E402

WORKLOADS = {
    "image-cnn": ["--params", '{"image_size": 32, "num_train_images": 1024, "num_val_images": 64, "width": 16}',
                  "--batch-size", "64", "--num-steps", "40", "--num-dataloader-workers", "1"],
    "gpt-lm": ["--params", '{"preset": "tiny", "num_train_tokens": 131072, "num_val_tokens": 8192}',
               "--batch-size", "32", "--num-steps", "40"],
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--precisions", nargs="+", default=["32", "bf16-mixed", "16-mixed"])
    a = ap.parse_args()
    rows, out = [], []
    for name, args in WORKLOADS.items():
        base = ["--workload", name, *args, "--num-warmup-steps", "5", "--threads-per-worker", "1",
                "--data-dir", ".cache/datasets", "--telemetry-period-s", "0"]
        run_loop([*base, "--num-steps", "1"])  # build the dataset outside the timing
        got: dict[str, list[float]] = {p: [] for p in a.precisions}
        for r in range(a.rounds):
            order = a.precisions if r % 2 == 0 else list(reversed(a.precisions))
            for p in order:
                final = run_loop([*base, "--precision", p])
                key = next(k for k in final if k.startswith("throughput/") and not k.endswith("per_worker"))
                got[p].append(final[key])
                print(f"{name} round {r + 1} {p}: {final[key]:.1f} {key}", file=sys.stderr)
        fp32 = summary(got["32"])["median"] if "32" in got else None
        for p, values in got.items():
            s = summary(values)
            rows.append({"workload": name, "precision": p, "throughput": s})
            vs = f"{s['median'] / fp32:.2f}x" if fp32 else "-"
            out.append([name, p, f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})", vs])
    print(table(["workload", "precision", "throughput median (min-max)", "vs fp32"], out))
    print(f"\nCPU: {machine()['cpu']}; ISA: {machine()['isa']}")
    record("precision_ladder", "python benchmarks/precision_ladder.py " + " ".join(sys.argv[1:]), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
