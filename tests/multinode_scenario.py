"""Multi-node sweeps on one machine, in their own process (one Ray driver, one cluster for all phases).

A head with no CPUs and two 2-CPU nodes (`ray.cluster_utils.Cluster`); every trial has 2 workers
x 1 CPU, so a trial fills a node. loss-warm, then loss-cold (`scaling.reuse_workers` true, then
false): 2 trials at once; once both are training, every CPU of both worker nodes must be in use (the
two trials at once, across the nodes); then one node is removed: its trial must be retried or rescheduled on the other
node, nothing finished may be lost, every run must say on which node it ran, and all resources must
be free at the end. A new node replaces the lost one between the two.
Writes result.json into argv[1]: one entry per phase.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import ray
from mlflow.tracking import MlflowClient
from ray._private.state import available_resources_per_node, total_resources_per_node
from ray.cluster_utils import Cluster

from sweeps.runner import run_sweep
from sweeps.spec import parse_spec
from tests.reap import reap, tree

out = Path(sys.argv[1])
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


def sweep(name: str, steps: int, reuse: str) -> tuple:
    text = SPEC.format(name=name, steps=steps, db=DB, storage=out / "results", reuse=reuse)
    lines: list[str] = []
    outcome = run_sweep(parse_spec(text), text, echo=lambda line: (lines.append(line), print(line, flush=True)))
    return outcome, lines


def node_ids(outcome: object) -> list[str]:
    return sorted({client.get_run(t.run_id).data.tags.get("device/ray_node_id", "?") for t in outcome.trials})  # type: ignore[attr-defined]


known_nodes: set[str] = set()  # every node that was ever part of the cluster


def remove_a_node_once_both_train(experiment: str, removed: threading.Event, busy: dict) -> None:
    """Wait until both trials of the sweep have reported training metrics, note the CPUs in use on
    each worker node, then drop a node."""
    while True:
        exp = client.get_experiment_by_name(experiment) if DB.exists() else None
        runs = client.search_runs([exp.experiment_id], "metrics.`progress/steps` > 0") if exp else []
        if len(runs) >= 2:
            break
        time.sleep(0.5)
    free = available_resources_per_node()
    busy.update({n: total.get("CPU", 0) - free.get(n, {}).get("CPU", 0)
                 for n, total in total_resources_per_node().items() if total.get("CPU", 0) > 0})
    # its processes, listed while they run: their raylet goes with the node, so they leave the tree
    doomed = tree(info.process.pid for infos in nodes[1].all_processes.values() for info in infos
                  if info.process is not None and info.process.poll() is None)
    cluster.remove_node(nodes[1])
    reap(doomed, 30, f"{experiment}: the removed node")
    print(f"{experiment}: removed a node while both trials were training", flush=True)
    removed.set()


def settled() -> dict[str, float]:
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0) and time.monotonic() < deadline:
        time.sleep(1)
    return {"free_cpu": ray.available_resources().get("CPU", 0), "total_cpu": ray.cluster_resources().get("CPU", 0)}


result: dict[str, dict] = {}
for reuse, name in (("true", "loss-warm"), ("false", "loss-cold")):
    removed, busy = threading.Event(), {}
    known_nodes.update(n["NodeID"] for n in ray.nodes())
    threading.Thread(target=remove_a_node_once_both_train, args=(name, removed, busy), daemon=True).start()
    outcome, _ = sweep(name, 1500, reuse)  # long enough that both trials train when the node goes
    exp = client.get_experiment_by_name(name)
    result[name] = {
        "statuses": sorted(t.status for t in outcome.trials),
        "busy_cpus_per_node": sorted(busy.values()),
        "nodes_named": all(n in known_nodes for n in node_ids(outcome)),
        "removed": removed.is_set(),
        "children": len(client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{outcome.parent_run_id}'")),
        **settled(),
    }
    if reuse == "true":  # a new node in place of the lost one, for the next phase
        nodes[1] = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
(out / "result.json").write_text(json.dumps(result))
print(json.dumps(result), flush=True)
ours = tree(p.pid for p in psutil.Process().children())  # the nodes this process started, and their workers
ray.shutdown()
cluster.shutdown()
reap(ours, 30, "the multi-node test cluster")
