"""Does `num_dataloader_workers` change image-cnn's data wait and throughput on this machine?

Each configuration runs the shared loop in a fresh single-rank process (1 compute thread),
in alternating order (0 1 2 0 1 2 ...), and we report medians.

    .venv/bin/python benchmarks/data_pipeline.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys

from common import record, run_loop, summary, table

ARGS = ["--workload", "image-cnn", "--params", '{"image_size": 64, "num_train_images": 2048, "num_val_images": 64, "width": 4}',
        "--batch-size", "64", "--num-steps", "30", "--num-warmup-steps", "5", "--threads-per-worker", "1",
        "--data-dir", ".cache/datasets"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    a = ap.parse_args()
    runs: dict[int, list[dict[str, float]]] = {w: [] for w in a.workers}
    run_loop(ARGS + ["--num-steps", "1"])  # generate the images once, outside the timing
    for r in range(a.rounds):
        for w in a.workers:
            final = run_loop(ARGS + ["--num-dataloader-workers", str(w)])
            runs[w].append(final)
            print(f"round {r + 1} workers={w}: {final['throughput/samples_per_s']:.1f} samples/s, "
                  f"data wait {final['time/data_wait_pct']:.1f}%", file=sys.stderr)
    rows, out = [], []
    base = summary([f["throughput/samples_per_s"] for f in runs[a.workers[0]]])["median"]
    for w in a.workers:
        tput = summary([f["throughput/samples_per_s"] for f in runs[w]])
        wait = summary([f["time/data_wait_pct"] for f in runs[w]])
        rows.append({"num_dataloader_workers": w, "samples_per_s": tput, "data_wait_pct": wait})
        out.append([str(w), f"{tput['median']:.1f} ({tput['min']:.1f}-{tput['max']:.1f})",
                    f"{wait['median']:.1f} ({wait['min']:.1f}-{wait['max']:.1f})", f"{tput['median'] / base:.2f}x"])
    print(table(["loader workers", "samples/s median (min-max)", "data wait % median (min-max)", "vs first"], out))
    record("data_pipeline", "python benchmarks/data_pipeline.py " + " ".join(sys.argv[1:]), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
