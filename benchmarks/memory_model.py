"""The memory model against what the trials measured: `examples/memory.yaml` (DDP vs FSDP2 vs each activation-
checkpointing mode on a 4.3M-parameter GPT, 2 gloo ranks) run whole, then per trial its predicted peak per rank
(`memory/predicted_gib`) beside its measured one and its step time, and how well the prediction orders them.

On a CPU the measured peak is the rank's resident set (`memory/peak_rss_gib`), libraries and data included (about
0.6 GiB here), in a warm group whose process served the trials before it: compare orders and gaps, not values.
The order's agreement is Spearman's rank correlation over the trials (1: the same order).

    .venv/bin/python benchmarks/memory_model.py [--spec examples/memory.yaml]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, record, table


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation of two equally long lists without ties (Pearson's on their ranks)."""
    def ranks(xs: list[float]) -> list[float]:
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        out = [0.0] * len(xs)
        for r, i in enumerate(order):
            out[i] = float(r)
        return out

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default=str(REPO / "examples" / "memory.yaml"))
    a = ap.parse_args()
    from mlflow.tracking import MlflowClient

    from sweeps.spec import load_spec

    spec, _ = load_spec(a.spec)
    with tempfile.TemporaryDirectory(prefix="memory-model-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(Path(tmp) / "cache")}
        env.pop("RAY_ADDRESS", None)
        proc = subprocess.run([sys.executable, "-m", "sweeps", "run", str(Path(a.spec).resolve())], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"the sweep failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        said = next((line for line in proc.stdout.splitlines() if line.startswith("Memory (")), "")
        client = MlflowClient(f"sqlite:///{Path(tmp) / 'mlflow.db'}")
        exp = client.get_experiment_by_name(spec.tracking.experiment or spec.name)
        runs = client.search_runs([exp.experiment_id], "tags.`sweep.trial_id` != ''", order_by=["attributes.start_time"])
    rows: list[dict[str, Any]] = []
    for n, r in enumerate(runs, 1):
        m, p = r.data.metrics, r.data.params
        rows.append({"order": n, "strategy": p.get("strategy"), "activation_checkpointing": p.get("activation_checkpointing"),
                     "predicted_gib": round(m["memory/predicted_gib"], 3),
                     "predicted_activations_gib": round(m["memory/predicted_activations_gib"], 3),
                     "measured_peak_rss_gib": round(m["memory/peak_rss_gib"], 3),
                     "step_ms": round(m["time/step_ms"], 1), "tokens_per_s": round(m["throughput/tokens_per_s"])})
    rho = spearman([r["predicted_gib"] for r in rows], [r["measured_peak_rss_gib"] for r in rows])
    summary = {"summary": "spearman(predicted, measured)", "spearman": round(rho, 3), "trials": len(rows),
               "answer_line": said}
    print(table(list(rows[0]), [[str(v) for v in r.values()] for r in rows]))
    print(f"\nSpearman's rank correlation, predicted vs measured peak per rank: {rho:.2f} over {len(rows)} trials")
    print(said)
    record("memory_model", "python benchmarks/memory_model.py", [*rows, summary])


if __name__ == "__main__":
    main()
