"""Multi-node sweeps on one machine, in their own process (one Ray driver, one cluster for all phases).

A head with no CPUs and two 2-CPU nodes (`ray.cluster_utils.Cluster`); every trial has 2 workers
x 1 CPU, so a trial fills a node. loss-warm, then loss-cold (`scaling.reuse_workers` true, then
false): 2 trials at once; once both are training, every CPU of both worker nodes must be in use (the
two trials at once, across the nodes); then one node is removed: its trial must be retried or rescheduled on the other
node, nothing finished may be lost, every run must say on which node it ran, and all resources must
be free at the end. A new node replaces the lost one between the two.
Writes result.json into argv[1]: one entry per phase.

Ray Train runs lean, as `sweeps run` runs it on a local cluster (`LEAN_TRAIN_ENV`): its controller polls
its workers every 0.5 s, so a lost node is noticed within 0.5 s and a trial's last report is taken at
once (Ray's default, 2 s, took one report per poll: reports every second queued behind it, and a cold
trial held its node ~6 s past its last step). So a trial lasts about as long as its warm-up and
measured window, and the window is what keeps the first trial training until the second one has
started: see `PHASES`.
"""

from __future__ import annotations

import json
import shutil
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

from sweeps.resources import LEAN_TRAIN_ENV
from sweeps.runner import run_sweep
from sweeps.spec import parse_spec
from tests.reap import reap, tree

out = Path(sys.argv[1])
SPEC = """
name: {name}
trainable: {{name: mlp-tabular, params: {{num_train_rows: 4096, hidden: 256}}}}
space: {{lr: {{type: float, low: 1.0e-3, high: 1.0e-2, log: true}}}}
budget: {{num_trials: 2, max_concurrent_trials: 2, num_steps: {steps}, num_warmup_steps: 3, max_retries: 1,
          report_interval_s: 1, max_window_s: {window}}}
scaling: {{num_workers: 2, cpus_per_worker: 1, reuse_workers: {reuse}}}
tracking: {{uri: 'sqlite:///{db}'}}
storage_path: {storage}
"""
DB = out / "mlflow.db"
HEAD_TMP = tempfile.mkdtemp(prefix="rm", dir="/tmp")  # short, for sockets; removed at the end
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "temp_dir": HEAD_TMP})
nodes = [cluster.add_node(num_cpus=2) for _ in range(2)]
ray.init(address=cluster.address, runtime_env={"env_vars": dict(LEAN_TRAIN_ENV)})
client = MlflowClient(f"sqlite:///{DB}")


def sweep(name: str, steps: int, window: float, reuse: str) -> tuple:
    text = SPEC.format(name=name, steps=steps, window=window, db=DB, storage=out / "results", reuse=reuse)
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
        time.sleep(0.2)
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


# (reuse_workers, name, num_steps, max_window_s): long enough that both trials train when the node goes.
# Both trials need their first report in MLflow (~4 s after their group starts: build, warm-up, a
# report) while the other still trains. Warm groups start together when the sweep does (< 1.5 s apart):
# the CPU default (a 5 s window) is enough. Cold trials' groups start 1.5-4 s apart (each trial starts
# its own Train controller, on a busy machine), so a cold trial's window is up to 10 s: while both
# trials share the 2 cores a step takes 4.7-7 ms, so 2000 steps last 9.4 s or more (measured: the first
# trial's last step came 5.5-7 s after the node went; with a 5 s window, 0.4-1 s); the retry, alone on
# the surviving node (~2.6 ms a step), ends after its 2000 steps in ~5 s.
PHASES = (("true", "loss-warm", 1500, 5), ("false", "loss-cold", 2000, 10))
result: dict[str, dict] = {}
for reuse, name, steps, window in PHASES:
    removed, busy = threading.Event(), {}
    known_nodes.update(n["NodeID"] for n in ray.nodes())
    threading.Thread(target=remove_a_node_once_both_train, args=(name, removed, busy), daemon=True).start()
    outcome, _ = sweep(name, steps, window, reuse)
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
shutil.rmtree(HEAD_TMP, ignore_errors=True)
