"""Sweep overhead: what a sweep costs beyond the training it runs, and where it goes.

On one Ray runtime kept warm (as under `ray job submit`), per round:
- a sweep of K trials, 1 at a time, of a fixed `mlp-tabular` config sized to ~T s of loop time;
  per trial, fixed cost = trial wall time (Tune start -> end, from the sweep's progress lines)
  minus the loop's own wall time (`time/loop_total_s`: build, data, warm-up, measured steps,
  validation); sweep overhead = sweep wall time / sum of loop times (1 slot);
- the floors: a bare `TorchTrainer` (2 workers) whose train function returns at once, and a bare
  Tune trial (function trainable) that returns at once.

    .venv/bin/python benchmarks/sweep_overhead.py [--rounds 2] [--trials 3] [--steps 1500]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, record, summary, table

SPEC = """\
name: overhead
trainable: {{name: mlp-tabular, params: {{num_train_rows: 8192, hidden: 256}}}}
budget: {{num_trials: {trials}, num_steps: {steps}, num_warmup_steps: 5}}
tracking: {{uri: 'sqlite:///{tmp}/mlflow.db'}}
storage_path: {tmp}/r
"""
_START = re.compile(r"^\[trial (\d+)/\d+\] \S+ started")
_END = re.compile(r"^\[trial (\d+)/\d+\] ")


def one_sweep(trials: int, steps: int) -> tuple[float, list[float], list[float]]:
    """(sweep wall s, per-trial wall s, per-trial loop s)."""
    from sweeps.runner import run_sweep
    from sweeps.spec import parse_spec

    starts: dict[int, float] = {}
    walls: dict[int, float] = {}

    def echo(line: str) -> None:
        now = time.monotonic()
        if m := _START.match(line):
            starts[int(m.group(1))] = now
        elif (m := _END.match(line)) and int(m.group(1)) in starts:
            walls[int(m.group(1))] = now - starts[int(m.group(1))]

    with tempfile.TemporaryDirectory() as tmp:
        text = SPEC.format(trials=trials, steps=steps, tmp=tmp)
        t0 = time.monotonic()
        outcome = run_sweep(parse_spec(text), text, echo=echo)
        wall = time.monotonic() - t0
    loops = [float(t.metrics["time/loop_total_s"]) for t in sorted(outcome.trials, key=lambda t: t.number)]
    return wall, [walls[n] for n in sorted(walls)], loops


def bare_train() -> float:
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        TorchTrainer(lambda: None, torch_config=TorchConfig(backend="gloo"),
                     scaling_config=ray.train.ScalingConfig(num_workers=2),
                     run_config=ray.train.RunConfig(name="bare", storage_path=tmp)).fit()
        return time.monotonic() - t0


def bare_tune() -> float:
    from ray import tune

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        tune.Tuner(tune.with_resources(lambda config: None, {"CPU": 1}),
                   run_config=tune.RunConfig(name="bare", storage_path=tmp, verbose=0)).fit()
        return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    import ray

    t0 = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}},
             log_to_driver=False)
    ray_init_s = time.monotonic() - t0
    ratios: list[float] = []
    fixed: list[float] = []
    loops: list[float] = []
    floors: dict[str, list[float]] = {"bare TorchTrainer (2 workers)": [], "bare Tune trial": []}
    try:
        for r in range(args.rounds):
            wall, walls, loop = one_sweep(args.trials, args.steps)
            ratios.append(wall / sum(loop))
            fixed += [w - lp for w, lp in zip(walls, loop, strict=True)]
            loops += loop
            floors["bare TorchTrainer (2 workers)"].append(bare_train())
            floors["bare Tune trial"].append(bare_tune())
            print(f"round {r + 1}: sweep {wall:.1f}s for loops {[round(x, 1) for x in loop]}; "
                  f"per-trial fixed {[round(w - lp, 1) for w, lp in zip(walls, loop, strict=True)]}", flush=True)
    finally:
        ray.shutdown()
    fmt = lambda s: f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"  # noqa: E731
    loop_s = summary(loops)["median"]
    rows = [
        ["sweep wall / sum of loop time", fmt(summary(ratios)), f"<= 1.1x for 150 s trials (here {loop_s:.0f} s)"],
        ["per-trial fixed cost, s", fmt(summary(fixed)), "<= 10 s on 2 vCPU"],
        *[[f"{k}, s", fmt(summary(v)), "floor"] for k, v in floors.items()],
        ["ray.init (cold), s", f"{ray_init_s:.2f}", "once per driver"],
    ]
    print(table(["figure", "median (min-max)", "goal"], rows))
    projected = (150 + summary(fixed)["median"]) / 150
    print(f"at 150 s of loop time per trial, the same fixed cost gives {projected:.3f}x (projected, not measured)")
    result: list[dict[str, Any]] = [
        {"figure": "ratio", **summary(ratios)}, {"figure": "fixed_s", **summary(fixed)},
        {"figure": "loop_s", **summary(loops)}, {"figure": "ray_init_s", "value": ray_init_s},
        {"figure": "projected_ratio_150s", "value": projected},
        *[{"figure": k, **summary(v)} for k, v in floors.items()],
    ]
    record("sweep_overhead", f"benchmarks/sweep_overhead.py --rounds {args.rounds} --trials {args.trials} "
           f"--steps {args.steps}", result)


if __name__ == "__main__":
    main()
