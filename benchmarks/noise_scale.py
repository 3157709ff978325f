"""Gradient noise scale: accuracy against a known answer, and what measuring it costs.

1. Accuracy: linear regression with Gaussian noise at fixed weights (tests/helpers/linreg.py), where
   B_noise = ((d + 1)|delta|^2 + d sigma^2) / |delta|^2 exactly; 2 gloo ranks under torchrun, one run
   per seed. Goal: within 20%.
2. Overhead, two ways on the demo's image model (2 gloo ranks):
   - direct: the hook's extra work per step (two dot products over all gradients: before and after
     the all-reduce) timed in-process, divided by the measured step time;
   - A/B: the same run with and without the hook, alternating; ratio of step times per pair.
   Goal: <= 1% of step time.

    .venv/bin/python benchmarks/noise_scale.py [--seeds 3] [--pairs 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, record, run_loop, summary, table

LINREG = {"dim": 16, "sigma": 1.0, "delta_norm": 2.0}
DEMO_PARAMS = {"image_size": 32, "num_train_images": 1024, "num_val_images": 64, "width": 16, "depth": 1}
DEMO = ["--workload", "image-cnn", "--params", json.dumps(DEMO_PARAMS), "--batch-size", "32", "--num-steps", "60",
        "--num-warmup-steps", "5", "--telemetry-period-s", "0", "--data-dir", str(REPO / ".cache" / "datasets")]


def hook_cost_s(repeats: int = 200) -> tuple[float, int]:
    """Seconds for the hook's extra work on the demo model's gradients (both dot products), and #params."""
    import torch

    from trainables.noise_scale import _sq
    from trainables.registry import build
    from trainables.workloads.base import BuildContext

    torch.set_num_threads(1)
    model = build("image-cnn", DEMO_PARAMS, BuildContext(str(REPO / ".cache" / "datasets"), 0)).model
    flat = torch.randn(sum(p.numel() for p in model.parameters()))
    for _ in range(10):
        _sq(flat)
    t0 = time.perf_counter()
    for _ in range(repeats):
        _sq(flat)
        _sq(flat)
    return (time.perf_counter() - t0) / repeats, flat.numel()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=4)
    a = ap.parse_args()
    from tests.helpers.linreg import analytic_noise_scale

    truth = analytic_noise_scale(LINREG["dim"], LINREG["sigma"], LINREG["delta_norm"])
    estimates = []
    for seed in range(a.seeds):
        final = run_loop(["--workload", "tests.helpers.linreg:build", "--params", json.dumps(LINREG), "--num-steps", "300",
                          "--num-warmup-steps", "2", "--batch-size", "32", "--lr", "1e-9", "--telemetry-period-s", "0",
                          "--seed", str(seed)], nproc=2)
        estimates.append(final["stats/grad_noise_scale"])
        print(f"seed {seed}: estimate {estimates[-1]:.2f} vs analytic {truth:.2f}", file=sys.stderr)
    errors = [e / truth - 1 for e in estimates]

    run_loop(DEMO + ["--num-steps", "1"], nproc=2)  # generate the images outside the timing
    on, off, ratios = [], [], []
    for i in range(a.pairs):
        order = [("on", []), ("off", ["--no-grad-noise-scale"])]
        got = {name: run_loop(DEMO + extra, nproc=2) for name, extra in (order if i % 2 == 0 else order[::-1])}
        on.append(got["on"]["time/step_ms"])
        off.append(got["off"]["time/step_ms"])
        ratios.append(on[-1] / off[-1])
        print(f"pair {i + 1}: step on {on[-1]:.2f} ms, off {off[-1]:.2f} ms, ratio {ratios[-1]:.4f}", file=sys.stderr)
    cost_s, n_params = hook_cost_s()
    direct_pct = 100 * cost_s / (summary(on)["median"] / 1000)
    r = summary(ratios)
    print(table(["figure", "value"], [
        ["analytic B_noise (samples)", f"{truth:.2f}"],
        ["in-loop estimates, 2 gloo ranks", ", ".join(f"{e:.2f}" for e in estimates)],
        ["relative error", ", ".join(f"{100 * e:+.1f}%" for e in errors)],
        [f"hook's extra work per step (2 dots over {n_params} grads)", f"{cost_s * 1e6:.1f} us"],
        ["direct overhead = extra / step time (on)", f"{direct_pct:.3f}%"],
        ["A/B step time on/off per pair, median (min-max)", f"{r['median']:.4f} ({r['min']:.4f}-{r['max']:.4f})"],
    ]))
    record("noise_scale", "python benchmarks/noise_scale.py " + " ".join(sys.argv[1:]),
           [{"analytic": truth, "estimates": estimates, "rel_errors": errors, "hook_cost_s": cost_s,
             "n_params": n_params, "direct_overhead_pct": direct_pct, "step_ms_on": summary(on),
             "step_ms_off": summary(off), "ratio_on_off": r}])
    return 0


if __name__ == "__main__":
    sys.exit(main())
