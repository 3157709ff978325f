"""What the profiler trace costs a trial (issue 45): the demo with its trace (`telemetry.trace_steps: 2`, the
default) and without (`telemetry.trace_steps: 0`), in alternating order, `--rounds` times each, as a new user
runs it (`sweeps run --restart`, a fresh working directory and MLflow store).

Per trial, paired by configuration (precision, batch size, loader workers) across the two modes:
- `split_share_pct` = sum of `time/trace_s` (writing, gzipping and splitting the trace, stopping the
  profiler, and the ranks' all-reduce of their splits; before the review after a41c221 writing and gzipping
  were left out) / sum of `time/loop_total_s`, over the traced runs;
- `warmup_delta_pct` = (mean `time/warmup_s` traced - mean untraced) / mean `time/loop_total_s` traced x 100:
  the whole cost where it falls, in warm-up (the profiler's instrumentation of its warm-up step and the traced
  steps, and the split), as a share of the trial's loop;
- `loop_delta_pct` = (mean `time/loop_total_s` traced - mean untraced) / mean traced x 100: the same over
  the whole loop, whose window and validation the trace does not touch (noisier: they vary by a few % run
  to run);
- `throughput_ratio` = mean throughput traced / untraced (no traced step is measured: ~1 within noise).
Goal: the trace's cost at most 2% of a trial's wall time.

    .venv/bin/python benchmarks/trace_cost.py [--rounds 2] [--spec examples/demo.yaml]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, record, table

KEYS = ("time/loop_total_s", "time/trace_s", "time/warmup_s", "throughput/samples_per_s", "trace/compute_pct")


def run(spec_text: str, traced: bool) -> dict[tuple[str, str, str], dict[str, float]]:
    """One demo sweep; per configuration, its figures."""
    with tempfile.TemporaryDirectory(prefix="trace-cost-") as tmp:
        spec = Path(tmp) / "spec.yaml"
        spec.write_text(spec_text + ("" if traced else "\ntelemetry: {trace_steps: 0}\n"))
        env = {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / "cache")}
        proc = subprocess.run([sys.executable, "-m", "sweeps", "run", "--restart", str(spec)], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"the demo failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        db = sqlite3.connect(Path(tmp) / "mlflow.db")
        out: dict[tuple[str, str, str], dict[str, float]] = {}
        for (run_id,) in db.execute("select run_uuid from tags where key = 'mlflow.parentRunId'"):
            params = dict(db.execute("select key, value from params where run_uuid = ?", (run_id,)).fetchall())
            metrics = dict(db.execute("select key, value from latest_metrics where run_uuid = ?", (run_id,)).fetchall())
            key = (params.get("precision", "?"), params.get("batch_size", "?"), params.get("num_dataloader_workers", "?"))
            out[key] = {k: metrics[k] for k in KEYS if k in metrics}
        db.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--spec", default="examples/demo.yaml")
    a = ap.parse_args()
    text = (REPO / a.spec).read_text()
    if "\ntelemetry:" in text:
        raise SystemExit(f"{a.spec} sets telemetry itself; give a spec without a telemetry section")
    runs: dict[bool, list[dict[tuple[str, str, str], dict[str, float]]]] = {True: [], False: []}
    for r in range(a.rounds):
        for traced in ((True, False) if r % 2 == 0 else (False, True)):  # alternating: drift falls on both
            runs[traced].append(run(text, traced))
            print(f"round {r + 1}: {'traced' if traced else 'untraced'} done", flush=True)
    configs = sorted(set.intersection(*(set(x) for x in runs[True] + runs[False])))

    def mean(traced: bool, key: str, config: tuple[str, str, str]) -> float:
        return statistics.fmean(x[config][key] for x in runs[traced] if key in x[config])

    rows: list[dict[str, Any]] = []
    for c in configs:
        on, off = mean(True, "time/loop_total_s", c), mean(False, "time/loop_total_s", c)
        warm_on, warm_off = mean(True, "time/warmup_s", c), mean(False, "time/warmup_s", c)
        rows.append({"precision": c[0], "batch_size": int(c[1]), "loader_workers": int(c[2]), "loop_traced_s": on,
                     "loop_untraced_s": off, "loop_delta_pct": 100.0 * (on - off) / on, "warmup_traced_s": warm_on,
                     "warmup_untraced_s": warm_off, "warmup_delta_pct": 100.0 * (warm_on - warm_off) / on,
                     "trace_s": mean(True, "time/trace_s", c), "split_share_pct": 100.0 * mean(True, "time/trace_s", c) / on,
                     "throughput_ratio": mean(True, "throughput/samples_per_s", c) / mean(False, "throughput/samples_per_s", c),
                     "traced_everywhere": all("trace/compute_pct" in x[c] for x in runs[True])})
    total_on = sum(r["loop_traced_s"] for r in rows)
    summary = {"summary": True, "rounds": a.rounds, "trials_per_sweep": len(configs),
               "split_share_pct": 100.0 * sum(r["trace_s"] for r in rows) / total_on,
               "loop_delta_pct": 100.0 * (total_on - sum(r["loop_untraced_s"] for r in rows)) / total_on,
               "warmup_delta_pct": 100.0 * sum(r["warmup_traced_s"] - r["warmup_untraced_s"] for r in rows) / total_on,
               "throughput_ratio_mean": statistics.fmean(r["throughput_ratio"] for r in rows),
               "every_trial_traced": all(r["traced_everywhere"] for r in rows)}
    print(table(["precision", "batch", "loaders", "loop traced s", "untraced s", "delta %", "warm-up delta %",
                 "trace_s", "split %", "tput ratio"],
                [[r["precision"], str(r["batch_size"]), str(r["loader_workers"]), f"{r['loop_traced_s']:.2f}",
                  f"{r['loop_untraced_s']:.2f}", f"{r['loop_delta_pct']:+.1f}", f"{r['warmup_delta_pct']:+.2f}",
                  f"{r['trace_s']:.3f}",
                  f"{r['split_share_pct']:.2f}", f"{r['throughput_ratio']:.3f}"] for r in rows]))
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in summary.items()})
    record("trace_cost", f"benchmarks/trace_cost.py --rounds {a.rounds} --spec {a.spec}", [*rows, summary])


if __name__ == "__main__":
    main()
