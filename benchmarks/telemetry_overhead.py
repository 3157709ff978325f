"""Telemetry overhead: the same trial with the sampler on (1 s period) and off, alternating.

Reports the per-pair throughput ratio on/off (goal >= 0.995x) as median (min-max), and the
direct cost of one sample (NVML where present, psutil), i.e. the sampler's CPU share at 1 s.

    .venv/bin/python benchmarks/telemetry_overhead.py [--pairs 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import record, run_loop, summary, table

ARGS = ["--workload", "image-cnn", "--params", '{"image_size": 32, "num_train_images": 2048, "num_val_images": 64, "width": 8}',
        "--batch-size", "64", "--num-steps", "150", "--num-warmup-steps", "5", "--threads-per-worker", "1",
        "--num-dataloader-workers", "1", "--data-dir", ".cache/datasets"]


def sample_cost_s(n: int = 200) -> float:
    import time

    from trainables.sampler import CpuReader, Sampler

    sampler = Sampler([CpuReader()])
    t0 = time.perf_counter()
    for _ in range(n):
        sampler.sample_once()
    return (time.perf_counter() - t0) / n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    a = ap.parse_args()
    run_loop(ARGS + ["--num-steps", "1"])  # generate the images outside the timing
    on, off, ratios = [], [], []
    for i in range(a.pairs):
        order = [("on", "1.0"), ("off", "0")] if i % 2 == 0 else [("off", "0"), ("on", "1.0")]
        got = {}
        for name, period in order:
            got[name] = run_loop(ARGS + ["--telemetry-period-s", period])["throughput/samples_per_s"]
        on.append(got["on"])
        off.append(got["off"])
        ratios.append(got["on"] / got["off"])
        print(f"pair {i + 1}: on {got['on']:.1f}, off {got['off']:.1f}, ratio {ratios[-1]:.4f}", file=sys.stderr)
    r, son, soff = summary(ratios), summary(on), summary(off)
    print(table(["sampler", "samples/s median (min-max)"],
                [["off", f"{soff['median']:.1f} ({soff['min']:.1f}-{soff['max']:.1f})"],
                 ["on, 1 s", f"{son['median']:.1f} ({son['min']:.1f}-{son['max']:.1f})"]]))
    print(f"\nratio on/off per pair: median {r['median']:.4f} (min {r['min']:.4f}, max {r['max']:.4f}), goal >= 0.995")
    cost_s = sample_cost_s()
    print(f"one sample costs {cost_s * 1e3:.3f} ms: {100 * cost_s:.3f}% of one core at a 1 s period")
    record("telemetry_overhead", "python benchmarks/telemetry_overhead.py " + " ".join(sys.argv[1:]),
           [{"ratio_on_off": r, "on_samples_per_s": son, "off_samples_per_s": soff, "sample_cost_s": cost_s}])
    return 0


if __name__ == "__main__":
    sys.exit(main())
