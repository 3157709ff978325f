"""The trace's bias on the measured throughput, with a 95% interval (issue 45): traced and untraced trials
alternating in the same processes, as a warm worker group serves trial after trial.

`--nproc` gloo ranks under torchrun (a core and a thread each) run the product's loop (`trainables.loop.train`)
trial after trial in the same processes: first one trial left out (the processes' first pays their imports
and caches), then `--pairs` pairs of the same trial, one traced (`trace_steps=2`, split and discarded as a
sweep's are) and one not, the order alternated pair by pair so that drift falls on both. Between trials the
processes reset as a warm group does (`trainables.train_functions.reset_between_trials`). No traced step is ever
measured: what the ratio shows is what a trace leaves behind for the window after it, and noise.

- per pair, `ratio` = the traced trial's throughput / the untraced one's (`throughput/<unit>_per_s`, all ranks);
- `ratio_mean` over the pairs with its 95% t-interval (`ci95_low`, `ci95_high`; a pair the unit, n - 1 degrees
  of freedom), and the same as a bias: `bias_pct` = (ratio_mean - 1) x 100, `ci95_pct` its half width.

    .venv/bin/python benchmarks/trace_bias.py [--nproc 2] [--pairs 10] [--workload mlp-tabular] [--batch-size 64]
        [--num-steps 200] [--num-warmup-steps 5]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def child() -> None:
    import torch
    import torch.distributed as dist

    from trainables import contract
    from trainables.contract import TrialConfig
    from trainables.loop import train
    from trainables.reporting import ListReporter
    from trainables.train_functions import reset_between_trials

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})  # a core and a thread per rank: less noise
    torch.set_num_threads(1)
    a = json.loads(os.environ["TRACE_BIAS_ARGS"])
    base = dict(workload=a["workload"], workload_params=json.loads(a["params"]), batch_size=a["batch_size"],
                num_steps=a["num_steps"], num_warmup_steps=a["num_warmup_steps"], seed=0, telemetry_period_s=0,
                report_interval_s=1e9)
    keys = [contract.throughput_key(unit) for unit in contract.UNITS]

    def trial(traced: bool) -> dict[str, Any]:
        reset_between_trials(torch.device("cpu"))
        final = train(TrialConfig(**base, trace_steps=2 if traced else 0), ListReporter(), torch.device("cpu"))
        key = next(k for k in keys if k in final)
        assert not traced or "trace/compute_pct" in final, final.get(contract.TRACE_SKIPPED)
        return {"throughput": final[key], "unit_key": key, "trace_s": final.get(contract.TRACE_S)}

    trial(False)  # the processes' first trial: left out
    out = []
    for p in range(a["pairs"]):
        for arm in ("traced", "untraced") if p % 2 == 0 else ("untraced", "traced"):
            out.append({"pair": p, "arm": arm, **trial(arm == "traced")})
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    if world > 1:
        dist.destroy_process_group()
    from trainables.launch import leave

    leave(0)  # a gloo group DDP used can abort the interpreter's finalization


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """The mean of `values` and its two-sided 95% t-interval."""
    from scipy.stats import t  # scipy comes with mlflow

    mean = statistics.fmean(values)
    half = float(t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def main() -> None:
    from common import REPO, record, table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--workload", default="mlp-tabular")
    ap.add_argument("--params", default="{}", help="workload params as JSON")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--num-steps", type=int, default=200)
    ap.add_argument("--num-warmup-steps", type=int, default=5, help="at least 4: the trace's 2 steps and the profiler's")
    a = ap.parse_args()
    if a.pairs < 2 or a.num_warmup_steps < 4:
        raise SystemExit("--pairs >= 2 (an interval needs two pairs) and --num-warmup-steps >= 4 (a trace of 2 steps)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TRACE_BIAS_CHILD": "1",
           "TRACE_BIAS_ARGS": json.dumps(vars(a))}
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={a.nproc}"] if a.nproc > 1 else []
    proc = subprocess.run([sys.executable, *launcher, __file__], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=7200)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"the trials failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    trials = json.loads(line[7:])
    rows: list[dict[str, Any]] = []
    for p in range(a.pairs):
        arm = {t["arm"]: t for t in trials if t["pair"] == p}
        rows.append({"pair": p, "order": "traced first" if p % 2 == 0 else "untraced first",
                     "traced": arm["traced"]["throughput"], "untraced": arm["untraced"]["throughput"],
                     "ratio": arm["traced"]["throughput"] / arm["untraced"]["throughput"],
                     "trace_s": arm["traced"]["trace_s"], "unit": arm["traced"]["unit_key"]})
    mean, low, high = t_interval([r["ratio"] for r in rows])
    summary = {"summary": True, "nproc": a.nproc, "pairs": a.pairs, "workload": a.workload, "params": a.params,
               "batch_size": a.batch_size, "num_steps": a.num_steps, "num_warmup_steps": a.num_warmup_steps,
               "ratio_mean": mean, "ratio_sd": statistics.stdev(r["ratio"] for r in rows), "ci95_low": low,
               "ci95_high": high, "bias_pct": 100.0 * (mean - 1.0), "ci95_pct": 100.0 * (high - mean),
               "interval": "two-sided 95% t-interval over pairs (n - 1 degrees of freedom)"}
    print(table(["pair", "order", "traced", "untraced", "ratio"],
                [[str(r["pair"]), r["order"], f"{r['traced']:.1f}", f"{r['untraced']:.1f}", f"{r['ratio']:.4f}"]
                 for r in rows]))
    print(f"traced / untraced throughput {mean:.4f} (95% CI {low:.4f} to {high:.4f}): a bias of "
          f"{summary['bias_pct']:+.2f}% +/- {summary['ci95_pct']:.2f}%")
    record("trace_bias", f"benchmarks/trace_bias.py --nproc {a.nproc} --pairs {a.pairs} --workload {a.workload} "
           f"--params '{a.params}' --batch-size {a.batch_size} --num-steps {a.num_steps} "
           f"--num-warmup-steps {a.num_warmup_steps}", [*rows, summary])


if __name__ == "__main__":
    if os.environ.get("TRACE_BIAS_CHILD"):
        child()
    else:
        main()
