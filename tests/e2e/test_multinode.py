"""Multi-node behaviour on one machine (ray.cluster_utils.Cluster), in its own process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray


@pytest.mark.timeout(780)  # the scenario's own limit (720 s) first: pyproject's 600 s would kill it without its nodes
def test_trials_spread_over_nodes_and_survive_a_node_loss_on_warm_groups(tmp_path: Path) -> None:
    # Ray's test Cluster writes the head's address to $RAY_TMPDIR/ray/ray_current_cluster (default
    # /tmp/ray, which a fresh machine does not have): give it a folder of its own, short for sockets.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rx", dir="/tmp"))
    (ray_tmp / "ray").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TMPDIR": str(ray_tmp)}
    try:
        proc = subprocess.run([sys.executable, str(REPO / "tests" / "helpers" / "multinode_scenario.py"), str(tmp_path)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=720)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    said = proc.stdout + proc.stderr
    print(said[-8000:])  # pytest shows it when an assertion below fails
    assert proc.returncode == 0, said[-4000:]
    p = json.loads((tmp_path / "result.json").read_text())
    assert p["busy_cpus_per_node"] == [2, 2], p  # both trials at once, across both nodes
    assert p["nodes_named"], p  # each run's device/ray_node_id is one of the cluster's nodes
    assert p["removed"], said[-4000:]
    assert p["statuses"] == ["ok", "ok"], p  # the trial on the lost node was retried elsewhere
    assert p["children"] == 2, p  # nothing lost, nothing duplicated in MLflow
    # a trial actor logs each retry ("trial T attempt 1: <kind> (<reason>); retrying")
    assert "; retrying" in said, said[-4000:]
    assert p["free_cpu"] == p["total_cpu"] > 0, p  # every resource free after the sweep
