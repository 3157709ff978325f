"""Does a sweep's driver-side cost per trial grow as the sweep grows?

One warm sweep (`scaling.reuse_workers: true`, 1 slot) of N trials of a ~1 s `mlp-tabular` loop,
searched by TPE over lr and batch size. Per trial, driver-side cost = trial wall time (Tune start
-> end, from the sweep's progress lines) - the loop's own wall time (`time/loop_total_s`): Tune's
bookkeeping, Optuna's sampler, MLflow's logging, the queue. Reported: the median over the first 10
and the last 10 trials (the first trial also pays the group's start-up, so it is left out), and
their ratio (goal <= 1.5).

    .venv/bin/python benchmarks/sweep_growth.py [--trials 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, TrialTimes, record, summary, table

SPEC = """\
name: growth
trainable: {{name: mlp-tabular, params: {{num_train_rows: 4096, hidden: 128}}}}
space:
  lr: {{type: float, low: 1.0e-4, high: 1.0e-1, log: true}}
  batch_size: {{type: categorical, choices: [32, 64, 128]}}
budget: {{num_trials: {trials}, num_steps: {steps}, num_warmup_steps: 3}}
scaling: {{num_workers: 2, cpus_per_worker: 1, reuse_workers: true}}
telemetry: {{period_s: 0}}
tracking: {{uri: 'sqlite:///{tmp}/mlflow.db'}}
storage_path: {tmp}/r
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    import ray

    from sweeps.service import resources
    from sweeps.service.runner import run_sweep
    from sweeps.spec import parse_spec

    times = TrialTimes()
    echo, walls = times.echo, times.walls

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), **resources.LEAN_TRAIN_ENV}})
    try:
        with tempfile.TemporaryDirectory() as tmp:
            text = SPEC.format(trials=args.trials, steps=args.steps, tmp=tmp)
            t0 = time.monotonic()
            outcome = run_sweep(parse_spec(text), text, echo=echo)
            wall = time.monotonic() - t0
    finally:
        ray.shutdown()
    loops = {t.number: float(t.metrics["time/loop_total_s"]) for t in outcome.trials if "time/loop_total_s" in t.metrics}
    cost = {n: walls[n] - loops[n] for n in sorted(loops) if n in walls}
    numbers = sorted(cost)
    first, last = [cost[n] for n in numbers[1:11]], [cost[n] for n in numbers[-10:]]
    ratio = statistics.median(last) / statistics.median(first)
    print(table(["figure", "median (min-max)"], [
        ["driver-side cost per trial, trials 2-11, s", f"{statistics.median(first):.3f} ({min(first):.3f}-{max(first):.3f})"],
        [f"driver-side cost per trial, last 10 of {len(numbers)}, s", f"{statistics.median(last):.3f} ({min(last):.3f}-{max(last):.3f})"],
        ["ratio last / first (goal <= 1.5)", f"{ratio:.2f}"],
        ["loop time per trial, s", f"{statistics.median(loops.values()):.2f}"],
        ["sweep wall / sum of loops", f"{wall / sum(loops.values()):.2f}"],
    ]))
    record("sweep_growth", f"benchmarks/sweep_growth.py --trials {args.trials} --steps {args.steps}",
           [{"first10": summary(first), "last10": summary(last), "ratio": ratio, "trials": len(numbers),
             "loop": summary(list(loops.values())), "wall_s": wall, "sweep_over_loops": wall / sum(loops.values()),
             "per_trial": [round(cost[n], 4) for n in numbers]}])


if __name__ == "__main__":
    main()
