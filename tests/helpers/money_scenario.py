"""A sweep over the accelerator type on a multi-node cluster on one machine, in its own process.

A head with no CPUs and two 2-CPU nodes labelled `accelerator-type: small` and `accelerator-type: large`
(`ray.cluster_utils.Cluster`), priced $0.05 and $0.20 a core-hour. The sweep searches the type x the
batch size (grid, 4 trials of 2 workers x 1 CPU, warm groups), ranked by dollars per million samples.
Writes result.json into argv[1]: where each trial ran, what it logged, the answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import ray
from mlflow.tracking import MlflowClient
from ray.cluster_utils import Cluster

from sweeps.service.resources import LEAN_TRAIN_ENV
from sweeps.service.runner import run_sweep
from sweeps.spec import parse_spec
from tests.helpers.reap import reap, tree

out = Path(sys.argv[1])
DB = out / "mlflow.db"
SPEC = f"""
name: money-types
trainable: {{name: mlp-tabular, params: {{num_train_rows: 2048}}}}
space:
  accelerator_type: {{type: categorical, choices: [small, large]}}
  batch_size: {{type: categorical, choices: [32, 128]}}
search: {{algorithm: grid}}
objective: {{metric: cost/usd_per_1m_samples, mode: min}}
budget: {{num_trials: 4, num_steps: 200, num_warmup_steps: 3, max_warmup_s: 2, max_window_s: 2, report_interval_s: 1}}
scaling: {{num_workers: 2, cpus_per_worker: 1, cpus_per_loader_worker: 0}}
cost: {{price_file: prices.csv}}   # relative to the working directory of `sweeps run`
tracking: {{uri: 'sqlite:///{DB}'}}
storage_path: {out / "results"}
"""
PRICES = out / "prices.csv"
PRICES.write_text("accelerator_type,usd_per_hour,date,source\nsmall,0.05,2026-11-26,test: the small nodes' price\n"
                  "large,0.20,2026-11-26,test: the large nodes' price\n")
os.chdir(out)
HEAD_TMP = tempfile.mkdtemp(prefix="rm", dir="/tmp")  # short, for sockets; removed at the end
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "temp_dir": HEAD_TMP})
typed = {kind: cluster.add_node(num_cpus=2, labels={"accelerator-type": kind}) for kind in ("small", "large")}
cluster.wait_for_nodes()
ray.init(address=cluster.address, runtime_env={"env_vars": dict(LEAN_TRAIN_ENV)})
node_of = {n["NodeID"]: n.get("Labels", {}).get("accelerator-type") for n in ray.nodes()}
lines: list[str] = []
outcome = run_sweep(parse_spec(SPEC), SPEC, echo=lambda line: (lines.append(line), print(line, flush=True)))
client = MlflowClient(f"sqlite:///{DB}")
trials = []
for t in outcome.trials:
    run = client.get_run(t.run_id)  # type: ignore[arg-type]
    trials.append({"type": t.params.get("accelerator_type"), "batch": t.params.get("batch_size"), "status": t.status,
                   "ran_on": node_of.get(run.data.tags.get("device/ray_node_id", "?")),
                   "metrics": {k: v for k, v in run.data.metrics.items() if k.startswith(("cost/", "throughput/"))}})
parent = client.get_run(outcome.parent_run_id)
best = outcome.best
# the file changes, then the answer is printed again from another directory: the sweep's own prices, its own dollars
PRICES.write_text("accelerator_type,usd_per_hour,date,source\nsmall,9,2026-12-01,later\nlarge,9,2026-12-01,later\n")
report = subprocess.run([sys.executable, "-m", "sweeps", "report", "money-types", "--tracking-uri", f"sqlite:///{DB}"],
                        cwd="/", capture_output=True, text=True, timeout=120,
                        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
state = json.loads((out / "results" / "money-types" / "sweep.json").read_text())
result = {"trials": trials, "parent_metrics": parent.data.metrics, "note": parent.data.tags.get("mlflow.note.content", ""),
          "best_type": best.params.get("accelerator_type") if best else None, "lines": lines, "wall_s": outcome.elapsed_s,
          "report": report.stdout + report.stderr, "report_rc": report.returncode, "drivers": state["drivers"],
          "saved_prices": state["prices"]}
(out / "result.json").write_text(json.dumps(result, default=str))
print(json.dumps({k: v for k, v in result.items() if k != "lines"}, default=str), flush=True)
ours = tree(p.pid for p in psutil.Process().children())
ray.shutdown()
cluster.shutdown()
reap(ours, 30, "the typed test cluster")
shutil.rmtree(HEAD_TMP, ignore_errors=True)
