"""A multi-node sweep on one machine, in its own process (one Ray driver, one cluster).

A head with no CPUs and two 2-CPU nodes (`ray.cluster_utils.Cluster`); every trial has 2 workers
x 1 CPU, so a trial fills a node. Warm groups (`scaling.reuse_workers` true, the default), 2 trials at
once: once both are training, every CPU of both worker nodes must be in use (the two groups at once,
across the nodes); then one node is removed: its trial must be retried on a group started on the other
node, nothing finished may be lost, every run must say on which node it ran, and all resources must be
free at the end. (Cold trials, a Train run each, once had a phase of their own here: a lost node is to
Ray Train what a crashed rank is, and `tests/loop/test_loop_faults.py`'s cold sweep retries a crashed rank
from its checkpoint; a warm trial's node loss with its storage elsewhere is `tests/e2e/test_private_disk.py`'s.)
Writes result.json into argv[1].

Ray Train runs lean, as `sweeps run` runs it on a local cluster (`LEAN_TRAIN_ENV`): its controller polls
its workers every 0.5 s, so a lost node is noticed within 0.5 s.

"Both trials train when the node goes" is made a fact, not a race: every rank waits at a gate
(`tests.helpers.faulty:gated`) until the node is gone. (Timed windows kept the first trial training until the
second had reported, on an idle machine; beside another test process the first could end before the
node went, and then nothing was left to retry.)
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

from sweeps.service.resources import LEAN_TRAIN_ENV
from sweeps.service.runner import run_sweep
from sweeps.spec import parse_spec
from tests.helpers.reap import reap, tree

out = Path(sys.argv[1])
SPEC = """
name: {name}
trainable: {{name: "tests.helpers.faulty:gated", params: {{num_train_rows: 4096, hidden: 256, at: {at}, gate: '{gate}'}}}}
space: {{lr: {{type: float, low: 1.0e-3, high: 1.0e-2, log: true}}}}
budget: {{num_trials: 2, max_concurrent_trials: 2, num_steps: {steps}, num_warmup_steps: 3, max_retries: 1,
          report_interval_s: 1}}
scaling: {{num_workers: 2, cpus_per_worker: 1, reuse_workers: true}}
tracking: {{uri: 'sqlite:///{db}'}}
storage_path: {storage}
"""
STEPS, AT = 600, 5  # every rank waits at its 5th training forward (2nd measured step) until the node is gone
# How long the 4 ranks may take to reach the gate. Two cold trials start 2 Ray Train groups; beside another test
# process on 2 cores that took more than 120 s once (CI of 223ff18: no node removed, nothing measured).
GATE_WAIT_S = 300
RANKS = 4  # 2 trials x 2 workers: all of them at the gate means both trials are training
DB = out / "mlflow.db"
HEAD_TMP = tempfile.mkdtemp(prefix="rm", dir="/tmp")  # short, for sockets; removed at the end
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "temp_dir": HEAD_TMP})
nodes = [cluster.add_node(num_cpus=2) for _ in range(2)]
ray.init(address=cluster.address, runtime_env={"env_vars": dict(LEAN_TRAIN_ENV)})
client = MlflowClient(f"sqlite:///{DB}")


def sweep(name: str, gate: Path) -> tuple:
    text = SPEC.format(name=name, steps=STEPS, at=AT, gate=gate, db=DB, storage=out / "results")
    lines: list[str] = []
    outcome = run_sweep(parse_spec(text), text, echo=lambda line: (lines.append(line), print(line, flush=True)))
    return outcome, lines


def node_ids(outcome: object) -> list[str]:
    return sorted({client.get_run(t.run_id).data.tags.get("device/ray_node_id", "?") for t in outcome.trials})  # type: ignore[attr-defined]


known_nodes: set[str] = set()  # every node that was ever part of the cluster


def remove_a_node_once_both_train(experiment: str, gate: Path, removed: threading.Event, busy: dict) -> None:
    """Wait until every rank of both trials is at the gate, note the CPUs in use on each worker node,
    drop a node, then open the gate (always: a sweep that cannot get there must not wait forever)."""
    try:
        started = time.monotonic()
        while len(list(gate.glob("arrived-*"))) < RANKS:
            if time.monotonic() > started + GATE_WAIT_S:
                busy["gate"] = f"only {len(list(gate.glob('arrived-*')))} of {RANKS} ranks reached the gate in {GATE_WAIT_S} s"
                print(f"{experiment}: {busy['gate']}; no node removed; free per node: {available_resources_per_node()}",
                      flush=True)
                return
            time.sleep(0.2)
        busy["gate_s"] = round(time.monotonic() - started, 1)
        print(f"{experiment}: all {RANKS} ranks at the gate after {busy['gate_s']} s", flush=True)
        free = available_resources_per_node()
        busy["cpus"] = sorted(total.get("CPU", 0) - free.get(n, {}).get("CPU", 0)
                              for n, total in total_resources_per_node().items() if total.get("CPU", 0) > 0)
        # its processes, listed while they run: their raylet goes with the node, so they leave the tree
        doomed = tree(info.process.pid for infos in nodes[1].all_processes.values() for info in infos
                      if info.process is not None and info.process.poll() is None)
        cluster.remove_node(nodes[1])
        reap(doomed, 30, f"{experiment}: the removed node")
        print(f"{experiment}: removed a node while both trials were training", flush=True)
        removed.set()
    finally:
        (gate / "open").touch()


def settled(wait_s: float = 60, cpus: float = 0) -> dict[str, float]:
    """Wait until every CPU of the cluster is free (and it has `cpus` of them), at most `wait_s`."""
    deadline = time.monotonic() + wait_s
    while (ray.available_resources().get("CPU", 0) < max(ray.cluster_resources().get("CPU", 0), cpus)
           and time.monotonic() < deadline):
        time.sleep(1)
    return {"free_cpu": ray.available_resources().get("CPU", 0), "total_cpu": ray.cluster_resources().get("CPU", 0)}


NAME = "loss-warm"  # the experiment
removed, busy, gate = threading.Event(), {}, out / "gate"
gate.mkdir()
known_nodes.update(n["NodeID"] for n in ray.nodes())
# Both nodes' CPUs free before the sweep starts: it runs as many trials at once as fit in what is free then
# (CI of 44c431f: a sweep ran its trials one after the other, 2 of 4 ranks at the gate)
free_at_start = settled(180, cpus=2 * len(nodes))
threading.Thread(target=remove_a_node_once_both_train, args=(NAME, gate, removed, busy), daemon=True).start()
outcome, _ = sweep(NAME, gate)
exp = client.get_experiment_by_name(NAME)
result = {
    "statuses": sorted(t.status for t in outcome.trials),
    "busy_cpus_per_node": busy.get("cpus", []),
    "free_at_start": free_at_start,
    "gate": busy.get("gate", f"all ranks there after {busy.get('gate_s')} s"),
    "nodes_named": all(n in known_nodes for n in node_ids(outcome)),
    "removed": removed.is_set(),
    "children": len(client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{outcome.parent_run_id}'")),
    **settled(),
}
(out / "result.json").write_text(json.dumps(result))
print(json.dumps(result), flush=True)
ours = tree(p.pid for p in psutil.Process().children())  # the nodes this process started, and their workers
ray.shutdown()
cluster.shutdown()
reap(ours, 30, "the multi-node test cluster")
shutil.rmtree(HEAD_TMP, ignore_errors=True)
