"""A cluster whose worker node has a disk of its own, on this one machine (issue 50): a head started with
`ray start --head`, and a worker joined to it inside `unshare --mount` with a private tmpfs over the sweep's
storage folder, so that the worker does not see what the head writes there (as two machines without a shared
filesystem). A local `storage_path` is refused before the first trial, in one line naming it and the node."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.test_job_submit import _free_ports, _wait_for_port
from tests.helpers.reap import reap, tree
from trainables.metrics import RESTORED_FROM

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# one process takes the file: its cluster is per module, and the node-loss test, last, kills a node of it
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("private_disk")]

SPEC = """\
name: private-disk
trainable: {{name: mlp-tabular}}
space: {{batch_size: 16}}
budget: {{num_trials: 1, num_steps: 2, num_warmup_steps: 1}}
scaling: {{num_workers: 1, cpus_per_worker: 1, reuse_workers: false}}
telemetry: {{period_s: 0}}
tracking: {{uri: "sqlite:///{db}"}}
storage_path: {storage}
"""


def _stop(proc: subprocess.Popen[bytes], what: str) -> None:
    ours = tree([proc.pid])
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # our own process group only
    for p in ours:
        with contextlib.suppress(psutil.Error):
            p.kill()
    proc.wait(timeout=30)
    reap(ours, 30, what)


def _count_nodes(gcs: int, env: dict[str, str]) -> int:
    count = (f"import ray; ray.init(address='127.0.0.1:{gcs}', logging_level='ERROR'); "
             "print(sum(n['Alive'] for n in ray.nodes()))")
    out = subprocess.run([sys.executable, "-c", count], env=env, capture_output=True, text=True, timeout=60)
    return int(out.stdout.strip() or 0)


@pytest.fixture(scope="module")
def two_disks(tmp_path_factory: pytest.TempPathFactory, auth_token_path: Path) -> Iterator[dict[str, Any]]:
    """A head and a worker node that shares no disk with it under `storage`; yields the address, the storage
    folder (seen by the head and this process, a private tmpfs on the worker), the client's environment, and
    `join`: another such worker node (each its own tmpfs), which the fixture stops at its end."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a mount namespace for the worker node)")
    tmp = tmp_path_factory.mktemp("two-disks")
    storage = tmp / "storage"
    storage.mkdir()
    (gcs, dash, *_), temp_dir = _free_ports(2), tempfile.mkdtemp(prefix="rpd", dir="/tmp")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(auth_token_path),
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--block", "--num-cpus", "1",
                             "--node-ip-address", "127.0.0.1", "--port", str(gcs), "--dashboard-host", "127.0.0.1",
                             "--dashboard-port", str(dash), "--temp-dir", temp_dir, "--disable-usage-stats"],
                            env=env, stdout=open(tmp / "head.log", "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    workers: list[subprocess.Popen[bytes]] = []

    def join() -> subprocess.Popen[bytes]:
        """Another 2-CPU worker node with its own disk under `storage`, once the cluster counts it."""
        nodes = _count_nodes(gcs, env)
        line = (f"mount -t tmpfs tmpfs {storage} && exec {BIN / 'ray'} start --address 127.0.0.1:{gcs} "
                f"--num-cpus 2 --node-ip-address 127.0.0.1 --temp-dir {temp_dir} --block --disable-usage-stats")
        log = tmp / f"worker-{len(workers)}.log"
        workers.append(subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", line],
                                        env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                        start_new_session=True))
        deadline = time.monotonic() + 120
        while _count_nodes(gcs, env) <= nodes:
            assert time.monotonic() < deadline, (tmp / "head.log", log.read_text()[-2000:])
            time.sleep(2)
        return workers[-1]

    try:
        _wait_for_port(gcs, 90)
        join()
        yield {"address": f"127.0.0.1:{gcs}", "storage": str(storage), "tmp": str(tmp), "join": join, "workers": workers,
               **{k: v for k, v in env.items() if k.startswith(("RAY_AUTH", "PATH", "PYTHONPATH"))}}
    finally:
        for n, worker in enumerate(workers):
            _stop(worker, f"private-disk worker node {n}")
        _stop(head, "the private-disk head")
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_local_storage_path_a_node_cannot_see_is_refused_before_the_first_trial(two_disks: dict[str, Any]) -> None:
    tmp = Path(two_disks["tmp"])
    spec = tmp / "local.yaml"
    spec.write_text(SPEC.format(db=tmp / "mlflow.db", storage=two_disks["storage"]))
    env = {**os.environ, "RAY_ADDRESS": two_disks["address"], "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN_PATH": two_disks["RAY_AUTH_TOKEN_PATH"], "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "sweeps", "run", str(spec)], cwd=tmp, env=env, capture_output=True,
                         text=True, timeout=300)
    took = time.monotonic() - t0
    assert run.returncode == 5, (run.returncode, run.stdout[-3000:], run.stderr[-3000:])
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: storage_path {two_disks['storage']} is not visible from 1 of 2 nodes ("), last
    assert "(node " in last and ": No such file or directory)" in last and "every node mounts at the same path" in last
    assert "[trial " not in run.stdout, run.stdout[-3000:]  # before the first trial
    print(f"refused in {took:.1f} s")


def test_validate_here_and_the_doctor_name_each_node_that_cannot_see_it(two_disks: dict[str, Any]) -> None:
    """`sweeps validate --here` on the cluster a run would join refuses as the run does (exit 5); the doctor's
    storage check gives each node its `host/storage_shared` fact and a finding for the worker node alone."""
    tmp = Path(two_disks["tmp"])
    spec = tmp / "validate.yaml"
    spec.write_text(SPEC.format(db=tmp / "mlflow.db", storage=two_disks["storage"]))
    env = {**os.environ, "RAY_ADDRESS": two_disks["address"], "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN_PATH": two_disks["RAY_AUTH_TOKEN_PATH"], "PYTHONPATH": str(REPO)}
    said = subprocess.run([sys.executable, "-m", "sweeps", "validate", "--here", str(spec)], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=120)
    assert said.returncode == 5, (said.returncode, said.stdout, said.stderr[-3000:])
    assert said.stderr.strip().splitlines()[-1].startswith(
        f"error: storage_path {two_disks['storage']} is not visible from 1 of 2 nodes ("), said.stderr[-3000:]
    ask = ("import json, ray; ray.init(logging_level='ERROR'); from sweeps.ops.doctor import shared_storage_findings; "
           "labels = {n['NodeID']: n['NodeID'][:8] for n in ray.nodes() if n['Alive']}; "
           "nodes = [{'node': label, 'facts': {}} for label in labels.values()]; "
           f"found = shared_storage_findings({two_disks['storage']!r}, nodes, labels); "
           "print(json.dumps({'findings': found, 'nodes': nodes}))")
    out = subprocess.run([sys.executable, "-c", ask], cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    shared = sorted(n["facts"]["host/storage_shared"] for n in report["nodes"])
    assert shared == ["no: No such file or directory", "yes"], report
    (finding,) = report["findings"]
    assert f"storage_path {two_disks['storage']} is not visible there (No such file or directory)" in finding


S3_SPEC = """\
name: private-disk-s3
trainable: {{name: "tests.helpers.faulty:gated", params: {{num_train_rows: 1024, at: {at}, gate: '{gate}'}}}}
space: {{batch_size: 16, num_dataloader_workers: 0, pin_memory: false}}
budget: {{num_trials: 2, num_steps: 8, num_warmup_steps: 4, report_interval_s: 0.5, checkpoint_every_steps: 2}}
scaling: {{num_workers: 1, cpus_per_worker: 2}}
telemetry: {{period_s: 0, trace_steps: 2}}
tracking: {{uri: "sqlite:///{db}"}}
storage_path: '{storage}'
"""


def test_with_s3_storage_each_worker_node_ranks_trace_and_checkpoint_reach_the_store(two_disks: dict[str, Any]) -> None:
    """The same cluster with `storage_path` on S3: each rank runs on the worker node (2 CPUs: only it fits one),
    its trace reaches MLflow through the bucket, and its warm checkpoint reaches the bucket (removed there once
    the trial ended). The first trial's rank waits at its 3rd measured step, after the checkpoint of its 2nd, until
    the test has seen that checkpoint: an unheld trial of 8 steps can begin and end between two listings."""
    from mlflow.tracking import MlflowClient

    from tests.helpers.s3_server import s3_server

    tmp = Path(two_disks["tmp"])
    gate = tmp / "s3-gate"
    gate.mkdir()
    with s3_server() as s3:
        uri = s3.uri("sweeps").replace("s3://", "s3://testing:testing@", 1)  # the nodes started without the variables
        spec = tmp / "s3.yaml"
        spec.write_text(S3_SPEC.format(at=1 + 4 + 3, gate=gate, db=tmp / "mlflow-s3.db", storage=uri))
        env = {**os.environ, "RAY_ADDRESS": two_disks["address"], "RAY_AUTH_MODE": "token",
               "RAY_AUTH_TOKEN_PATH": two_disks["RAY_AUTH_TOKEN_PATH"], "PYTHONPATH": str(REPO)}
        seen: list[str] = []
        with subprocess.Popen([sys.executable, "-m", "sweeps", "run", str(spec)], cwd=tmp, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as run:
            try:  # the build's measuring forward, 4 warm-up steps, 3 measured (`at` counts those forwards)
                deadline = time.monotonic() + 240
                while time.monotonic() < deadline and run.poll() is None and not seen:
                    if any(gate.glob("arrived-*")):
                        seen = [k for k in s3.keys("sweeps/") if k.endswith("checkpoint_warm/state.pt")]
                    time.sleep(0.2)
            finally:
                (gate / "open").touch()  # every later step passes; a sweep that cannot get there must not wait
            out = run.communicate(timeout=300)[0]
        assert run.returncode == 0, out[-3000:]
        keys = s3.keys("sweeps/")
    assert seen, f"no warm checkpoint reached the bucket while the trial was held: {keys}"
    assert not any("checkpoint_" in k for k in keys), keys  # removed once each trial ended
    assert len([k for k in keys if "/traces/" in k]) == 2, keys
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow-s3.db'}")
    runs = client.search_runs([client.get_experiment_by_name("private-disk-s3").experiment_id],
                              "tags.`sweep.trial_id` != ''")
    assert len(runs) == 2
    for r in runs:  # the worker node's rank's trace, through the bucket
        assert [a.path for a in client.list_artifacts(r.info.run_id, "trace")] == ["trace/rank-0.pt.trace.json.gz"]
    assert not (tmp / "s3:").exists() and not (REPO / "s3:").exists()


LOSS_SPEC = """\
name: node-loss
trainable: {{name: "tests.helpers.faulty:gated", params: {{num_train_rows: 1024, at: {at}, gate: '{gate}'}}}}
space: {{batch_size: 16, num_dataloader_workers: 0, pin_memory: false}}
budget: {{num_trials: 1, num_steps: 40, num_warmup_steps: 2, max_retries: 1, report_interval_s: 0.5,
          checkpoint_every_steps: 1}}
scaling: {{num_workers: 1, cpus_per_worker: 2}}
telemetry: {{period_s: 0}}
tracking: {{uri: "sqlite:///{db}"}}
storage_path: '{storage}'
"""


def test_a_trial_whose_node_dies_resumes_from_its_checkpoint_in_the_store_on_another_node(
        two_disks: dict[str, Any]) -> None:
    """Two worker nodes, each with its own disk, the storage on S3: the trial's rank waits at its 3rd measured
    step once a checkpoint is in the bucket, its node is killed (every process of it), and the trial, retried on
    the other node, continues from the checkpoint it fetched from the bucket. (The file's last test: its node
    stays dead.)"""
    from mlflow.tracking import MlflowClient

    from tests.helpers.s3_server import s3_server

    tmp = Path(two_disks["tmp"])
    gate = tmp / "gate"
    gate.mkdir()
    second = two_disks["join"]()
    with s3_server() as s3:
        uri = s3.uri("loss").replace("s3://", "s3://testing:testing@", 1)
        spec = tmp / "loss.yaml"
        spec.write_text(LOSS_SPEC.format(at=2 + 3, gate=gate, db=tmp / "mlflow-loss.db", storage=uri))
        env = {**os.environ, "RAY_ADDRESS": two_disks["address"], "RAY_AUTH_MODE": "token",
               "RAY_AUTH_TOKEN_PATH": two_disks["RAY_AUTH_TOKEN_PATH"], "PYTHONPATH": str(REPO)}
        killed = ""
        with subprocess.Popen([sys.executable, "-m", "sweeps", "run", str(spec)], cwd=tmp, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as run:
            try:
                deadline = time.monotonic() + 240
                while time.monotonic() < deadline and run.poll() is None:
                    arrived = [int(f.name.split("-")[1]) for f in gate.glob("arrived-*")]
                    kept = [k for k in s3.keys("loss/") if k.endswith("checkpoint_warm/state.pt")]
                    if arrived and kept:
                        break
                    time.sleep(0.2)
                assert arrived and kept, f"the rank did not reach the gate with a checkpoint kept: {arrived} {kept}"
                (worker,) = [w for w in two_disks["workers"] if arrived[0] in {p.pid for p in tree([w.pid])}]
                killed = "the second" if worker is second else "the first"
                _stop(worker, "the node of the trial's rank")
            finally:
                (gate / "open").touch()  # the retried attempt passes; a sweep that cannot get there must not wait
            out = run.communicate(timeout=300)[0]
    assert run.returncode == 0, out[-3000:]
    assert "retrying" in out, out[-3000:]
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow-loss.db'}")
    (trial,) = client.search_runs([client.get_experiment_by_name("node-loss").experiment_id],
                                  "tags.`sweep.trial_id` != ''")
    # from a checkpoint, not from its first step: the one the bucket held when the node died (step 1 or 2)
    assert trial.data.metrics[RESTORED_FROM] >= 1, (killed, trial.data.metrics)
