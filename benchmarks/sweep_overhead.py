"""Sweep overhead: what a sweep costs beyond the training it runs, and where it goes.

On a Ray runtime started once per variant and round (its start-up excluded), per round:
- a sweep of K trials, 1 at a time, of a fixed `mlp-tabular` config sized to ~T s of loop time;
  per trial, fixed cost = trial wall time (Tune start -> end, from the sweep's progress lines)
  minus the loop's own wall time (`time/loop_total_s`: build, data, warm-up, measured steps,
  validation); sweep overhead = sweep wall time / sum of loop times (1 slot);
- the floors: a bare `TorchTrainer` (2 workers) whose train function returns at once, and a bare
  Tune trial (function trainable) that returns at once.

Variants (alternating): `default` (Ray's settings, a new Tune actor per trial), `lean`
(`sweeps.service.resources.LEAN_TRAIN_ENV`, a new Tune actor per trial), `lean-reuse` (lean, and Tune's actor
reused across trials, `sweeps.service.tuning.REUSE_TRIAL_ACTORS`: one TorchTrainer per trial) and `warm`
(lean-reuse with `scaling.reuse_workers: true`: one long-lived worker group serves every trial).

    .venv/bin/python benchmarks/sweep_overhead.py [--rounds 2] [--trials 3] [--steps 1500]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, TrialTimes, record, summary, table

SPEC = """\
name: overhead
trainable: {{name: mlp-tabular, params: {{num_train_rows: 8192, hidden: 256}}}}
budget: {{num_trials: {trials}, num_steps: {steps}, num_warmup_steps: 5}}
scaling: {{num_workers: 2, cpus_per_worker: 1, reuse_workers: {warm}}}
tracking: {{uri: 'sqlite:///{tmp}/mlflow.db'}}
storage_path: {tmp}/r
"""


def one_sweep(trials: int, steps: int, warm: bool = False) -> tuple[float, list[float], list[float]]:
    """(sweep wall s, per-trial wall s, per-trial loop s)."""
    from sweeps.service.runner import run_sweep
    from sweeps.spec import parse_spec

    times = TrialTimes()
    echo, walls = times.echo, times.walls

    with tempfile.TemporaryDirectory() as tmp:
        text = SPEC.format(trials=trials, steps=steps, tmp=tmp, warm=str(warm).lower())
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


# lean: `sweeps.service.resources.LEAN_TRAIN_ENV` (what `sweeps run` sets on a local cluster) in the job's runtime env.


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--variants", default="default,lean,lean-reuse",
                        help="default: Ray's settings; lean: LEAN_TRAIN_ENV; lean-reuse: and Tune actors reused; "
                        "warm: and one warm worker group for every trial")
    args = parser.parse_args()
    import ray

    variants = args.variants.split(",")
    stats: dict[str, dict[str, list[float]]] = {
        v: {"ratio": [], "fixed": [], "all-in": [], "loop": [], "init": [], "bare TorchTrainer (2 workers)": [],
            "bare Tune trial": []}
        for v in variants}
    for r in range(args.rounds):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            from sweeps.service import resources, tuning

            env = {"PYTHONPATH": str(REPO), **(resources.LEAN_TRAIN_ENV if v.startswith("lean") or v == "warm" else {})}
            tuning.REUSE_TRIAL_ACTORS = v.endswith("reuse") or v == "warm"
            t0 = time.monotonic()
            ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env}, log_to_driver=False)
            st = stats[v]
            st["init"].append(time.monotonic() - t0)
            try:
                wall, walls, loop = one_sweep(args.trials, args.steps, warm=v == "warm")
                st["ratio"].append(wall / sum(loop))
                st["fixed"] += [w - lp for w, lp in zip(walls, loop, strict=True)]
                st["all-in"].append((wall - sum(loop)) / len(loop))  # also the gaps between trials
                st["loop"] += loop
                st["bare TorchTrainer (2 workers)"].append(bare_train())
                st["bare Tune trial"].append(bare_tune())
            finally:
                ray.shutdown()
            print(f"round {r + 1} {v}: sweep {wall:.1f}s for loops {[round(x, 1) for x in loop]}; per-trial fixed "
                  f"{[round(w - lp, 1) for w, lp in zip(walls, loop, strict=True)]}", flush=True)
    fmt = lambda s: f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"  # noqa: E731
    head = ["figure", *variants, "goal"]
    loop_s = summary(stats[variants[0]]["loop"])["median"]
    goals = {"ratio": f"<= 1.1x for 150 s trials (here {loop_s:.0f} s)", "fixed": "<= 10 s on 2 vCPU",
             "all-in": "<= 10 s on 2 vCPU", "init": "once per driver"}
    names = {"ratio": "sweep wall / sum of loop time", "fixed": "per-trial fixed cost (trial start -> end), s",
             "all-in": "per-trial overhead all in: (sweep wall - sum of loops) / K, s", "init": "ray.init (cold), s"}
    rows = [[names.get(k, f"{k}, s"), *[fmt(summary(stats[v][k])) for v in variants], goals.get(k, "floor")]
            for k in ("ratio", "fixed", "all-in", "bare TorchTrainer (2 workers)", "bare Tune trial", "init")]
    print(table(head, rows))
    for v in variants:
        projected = (150 + summary(stats[v]["all-in"])["median"]) / 150
        print(f"{v}: at 150 s of loop time per trial this fixed cost gives {projected:.3f}x (projected, not measured)")
    result: list[dict[str, Any]] = [{"variant": v, "figure": k, **summary(vals)} for v in variants
                                    for k, vals in stats[v].items()]
    record("sweep_overhead", f"benchmarks/sweep_overhead.py --rounds {args.rounds} --trials {args.trials} "
           f"--steps {args.steps} --variants {args.variants}", result)


if __name__ == "__main__":
    main()
