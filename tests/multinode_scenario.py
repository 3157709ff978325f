"""Multi-node sweeps on one machine, in their own process (one Ray driver per process).

A head with no CPUs and two 2-CPU nodes (`ray.cluster_utils.Cluster`); every trial has 2 workers
x 1 CPU, so a trial fills a node. Phase 1: 2 trials at once must land on different nodes.
Phase 2: 2 trials at once; when both are training, one node is removed: its trial must be retried
or rescheduled on the other node, nothing finished may be lost, and all resources must be free at
the end. Writes result.json into argv[1].
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import ray
from mlflow.tracking import MlflowClient
from ray.cluster_utils import Cluster

from sweeps.runner import run_sweep
from sweeps.spec import parse_spec

out = Path(sys.argv[1])
REUSE = sys.argv[2] if len(sys.argv) > 2 else "true"  # scaling.reuse_workers
SPEC = """
name: {name}
trainable: {{name: mlp-tabular, params: {{num_train_rows: 4096, hidden: 256}}}}
space: {{lr: {{type: float, low: 1.0e-3, high: 1.0e-2, log: true}}}}
budget: {{num_trials: 2, max_concurrent_trials: 2, num_steps: {steps}, num_warmup_steps: 3, max_retries: 1,
          report_interval_s: 1}}
scaling: {{num_workers: 2, cpus_per_worker: 1, reuse_workers: {reuse}}}
tracking: {{uri: 'sqlite:///{db}'}}
storage_path: {storage}
"""
DB = out / "mlflow.db"
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                         "temp_dir": tempfile.mkdtemp(prefix="rm", dir="/tmp")})
nodes = [cluster.add_node(num_cpus=2) for _ in range(2)]
ray.init(address=cluster.address)
client = MlflowClient(f"sqlite:///{DB}")


def sweep(name: str, steps: int) -> tuple:
    text = SPEC.format(name=name, steps=steps, db=DB, storage=out / "results", reuse=REUSE)
    lines: list[str] = []
    outcome = run_sweep(parse_spec(text), text, echo=lambda line: (lines.append(line), print(line, flush=True)))
    return outcome, lines


def node_ids(outcome: object) -> list[str]:
    return sorted({client.get_run(t.run_id).data.tags.get("device/ray_node_id", "?") for t in outcome.trials})  # type: ignore[attr-defined]


def remove_a_node_once_both_train() -> None:
    """Wait until both trials of phase 2 have reported training metrics, then drop a node."""
    while True:
        exp = client.get_experiment_by_name("phase2") if DB.exists() else None
        runs = client.search_runs([exp.experiment_id], "metrics.`progress/steps` > 0") if exp else []
        if len(runs) >= 2:
            break
        time.sleep(0.5)
    cluster.remove_node(nodes[1])
    print("removed a node while both trials were training", flush=True)
    removed.set()


first, _ = sweep("phase1", 200 if REUSE == "false" else 1000)  # warm: both groups take a trial at once
removed = threading.Event()
threading.Thread(target=remove_a_node_once_both_train, daemon=True).start()
second, lines = sweep("phase2", 1500)  # long enough that both trials train when the node goes
deadline = time.monotonic() + 60
while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0) and time.monotonic() < deadline:
    time.sleep(1)
exp2 = client.get_experiment_by_name("phase2")
result = {
    "phase1_statuses": sorted(t.status for t in first.trials),
    "phase1_nodes": node_ids(first),
    "removed": removed.is_set(),
    "phase2_statuses": sorted(t.status for t in second.trials),
    "phase2_children": len(client.search_runs([exp2.experiment_id], f"tags.`mlflow.parentRunId` = '{second.parent_run_id}'")),
    "free_cpu": ray.available_resources().get("CPU", 0),
    "total_cpu": ray.cluster_resources().get("CPU", 0),
}
(out / "result.json").write_text(json.dumps(result))
print(json.dumps(result), flush=True)
ray.shutdown()
cluster.shutdown()
