"""Search quality on a synthetic throughput landscape with a known optimum (no training).

The landscape mimics a GPU sweep: throughput rises with batch size and saturates, lower
precisions have higher peaks, the input pipeline caps throughput unless enough dataloader
workers (and pinned memory) feed it, and batches above a memory limit that depends on the
precision run out of memory (an OOM trial still costs a trial). Each seed draws a different
landscape. For each method, the number of trials run until one is within 5% of the best
feasible configuration (found by enumeration), with the same budget:

- ours:   the product's searcher (`sweeps.search.searcher.SweepSearch`: seeded TPE, OOM trials told
          to Optuna as infeasible, monotone skipping of batches at/above an OOM),
- tpe, OOM as FAIL: the same TPE, but OOM trials reach Optuna as FAIL and nothing is skipped
          (what plain OptunaSearch does): isolates what the infeasibility feedback buys,
- random: Optuna's RandomSampler, OOM trials simply fail (what a plain random search does),
- grid:   the full grid in the product's grid order (smallest batch first), no skipping.

    .venv/bin/python benchmarks/search_landscape.py [--seeds 10] [--budget 40]
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna
from common import record, summary, table

from sweeps.search.live_state import SearchState, running
from sweeps.search.searcher import SweepSearch, make_searcher
from sweeps.spec import parse_spec
from trainables.contract import FINAL

BATCHES = [8, 16, 32, 64, 128, 256, 512]
PRECISIONS = ["32", "tf32", "bf16-mixed", "16-mixed"]
WORKERS = [0, 1, 2, 4, 8]
METRIC = "throughput/samples_per_s"
SPEC = """\
name: landscape
trainable: {{name: mlp-tabular}}
space:
  batch_size: {{type: categorical, choices: {batches}}}
  precision: {{type: categorical, choices: {precisions}}}
  num_dataloader_workers: {{type: categorical, choices: {workers}}}
  pin_memory: {{type: categorical, choices: [false, true]}}
search: {{algorithm: {algorithm}}}
budget: {{num_trials: {trials}, num_steps: 10}}
seed: {seed}
"""


class Landscape:
    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.peak = {"32": 1.0, "tf32": rng.uniform(1.5, 3.0), "bf16-mixed": rng.uniform(2.5, 5.0)}
        self.peak["16-mixed"] = self.peak["bf16-mixed"] * rng.uniform(0.9, 1.1)
        self.half = rng.choice([16, 32, 64, 128])  # batch at half the peak
        self.per_worker = rng.uniform(0.6, 1.4)  # samples/s one loader worker delivers (x1000)
        self.pin_gain = rng.uniform(1.05, 1.3)
        self.mem_limit = rng.choice([64, 128, 256, 512]) * 4  # bytes-ish units: batch x bytes/sample
        self.noise = rng

    def oom(self, knobs: dict[str, Any]) -> bool:
        width = 4 if knobs["precision"] in ("32", "tf32") else 2
        return knobs["batch_size"] * width > self.mem_limit

    def throughput(self, knobs: dict[str, Any], noisy: bool = True) -> float:
        b = knobs["batch_size"]
        compute = 1000 * self.peak[knobs["precision"]] * b / (b + self.half)
        feed = 1000 * self.per_worker * (0.35 + knobs["num_dataloader_workers"])
        feed *= self.pin_gain if knobs["pin_memory"] else 1.0
        value = min(compute, feed)
        return value * (self.noise.uniform(0.98, 1.02) if noisy else 1.0)  # run-to-run noise

    def best(self) -> float:
        points = [dict(zip(("batch_size", "precision", "num_dataloader_workers", "pin_memory"), p, strict=True))
                  for p in itertools.product(BATCHES, PRECISIONS, WORKERS, [False, True])]
        return max(self.throughput(k, noisy=False) for k in points if not self.oom(k))


def _spec(algorithm: str, trials: int, seed: int) -> Any:
    return parse_spec(SPEC.format(batches=BATCHES, precisions=[f'"{p}"' for p in PRECISIONS], workers=WORKERS,
                                  algorithm=algorithm, trials=trials, seed=seed).replace("'", ""))


def run_searcher(search: SweepSearch, state: SearchState, land: Landscape, budget: int, target: float,
                 learn_oom: bool) -> tuple[int | None, int]:
    """(trials until within 5% of the best, or None; OOM trials run) for one searcher."""
    ooms = 0
    for i in range(budget):
        config = search.suggest(f"t{i}")
        if not isinstance(config, dict):
            return None, ooms  # the searcher ran out of proposals
        knobs = {"compile": False, **config}
        if land.oom(knobs):
            ooms += 1
            search.on_trial_complete(f"t{i}", error=True)
            state.failures[f"t{i}"] = "oom" if learn_oom else "crash"  # crash: Optuna sees a FAIL only
            if learn_oom:
                state.record_oom(knobs)
            continue
        value = land.throughput(knobs)
        search.on_trial_complete(f"t{i}", {METRIC: value, FINAL: 1})
        if value >= 0.95 * target:
            return i + 1, ooms
    return None, ooms


def grid_trials(land: Landscape, budget: int, target: float) -> tuple[int | None, int]:
    ooms = 0
    for i, point in enumerate(_spec("grid", len(BATCHES) * len(PRECISIONS) * len(WORKERS) * 2, 0).space.grid_points()):
        if i >= budget:
            return None, ooms
        if land.oom(point):
            ooms += 1
        elif land.throughput(point) >= 0.95 * target:
            return i + 1, ooms
    return None, ooms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--budget", type=int, default=40)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    found: dict[str, list[int | None]] = {"ours": [], "tpe, OOM as FAIL": [], "random": [], "grid": []}
    oom_runs: dict[str, list[int]] = {k: [] for k in found}
    for seed in range(args.seeds):
        land = Landscape(seed)
        target = land.best()
        for method, algorithm, learn in (("ours", "tpe", True), ("tpe, OOM as FAIL", "tpe", False),
                                         ("random", "random", False)):
            with running(SearchState()) as state:
                search = make_searcher(_spec(algorithm, args.budget, seed))
                assert search is not None
                land.noise.seed(seed)
                n, ooms = run_searcher(search, state, land, args.budget, target, learn)
            found[method].append(n)
            oom_runs[method].append(ooms)
        land.noise.seed(seed)
        n, ooms = grid_trials(land, args.budget, target)
        found["grid"].append(n)
        oom_runs["grid"].append(ooms)

    grid_size = len(BATCHES) * len(PRECISIONS) * len(WORKERS) * 2
    rows, recorded = [], []
    for method, values in found.items():
        hits = [v for v in values if v is not None]
        # A miss counts as "more than the budget" for the median (reported as >budget).
        padded = sorted(v if v is not None else math.inf for v in values)
        median = padded[len(padded) // 2] if len(padded) % 2 else (padded[len(padded) // 2 - 1] + padded[len(padded) // 2]) / 2
        rows.append([method, f"{len(hits)}/{len(values)}", f">{args.budget}" if math.isinf(median) else f"{median:g}",
                     f"{summary([float(h) for h in hits])['min']:g}-{max(hits):g}" if hits else "-",
                     f"{sum(oom_runs[method]) / len(values):.1f}"])
        recorded.append({"method": method, "found_within_budget": len(hits), "seeds": len(values),
                         "median_trials": None if math.isinf(median) else median, "trials": values,
                         "mean_oom_trials": sum(oom_runs[method]) / len(values)})
    print(f"Trials until within 5% of the best feasible config; budget {args.budget}, {args.seeds} landscapes, "
          f"grid of {grid_size} points")
    print(table(["method", "found within budget", "median trials", "range (found)", "OOM trials run (mean)"], rows))
    record("search_landscape", f"benchmarks/search_landscape.py --seeds {args.seeds} --budget {args.budget}", recorded)


if __name__ == "__main__":
    main()
