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

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.ray


@pytest.mark.parametrize("reuse", ["true", "false"], ids=["warm", "cold"])  # scaling.reuse_workers
def test_trials_spread_over_nodes_and_survive_a_node_loss(tmp_path: Path, reuse: str) -> None:
    # Ray's test Cluster writes the head's address to $RAY_TMPDIR/ray/ray_current_cluster (default
    # /tmp/ray, which a fresh machine does not have): give it a folder of its own, short for sockets.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rx", dir="/tmp"))
    (ray_tmp / "ray").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TMPDIR": str(ray_tmp)}
    try:
        proc = subprocess.run([sys.executable, str(REPO / "tests" / "multinode_scenario.py"), str(tmp_path), reuse],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["phase1_statuses"] == ["ok", "ok"] and len(r["phase1_nodes"]) == 2  # one trial per node
    assert r["removed"]
    assert r["phase2_statuses"] == ["ok", "ok"]  # the trial on the lost node was retried elsewhere
    assert "retrying" in proc.stdout + proc.stderr
    assert r["phase2_children"] == 2  # nothing lost, nothing duplicated in MLflow
    assert r["free_cpu"] == r["total_cpu"] > 0  # every resource free again at the end
