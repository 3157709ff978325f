"""`ray job submit` of a sweep to a head node this test starts itself (own ports, own temp
dir, token auth with a temp token) and stops itself through its own process group.

The client side uses only what a user has: the `ray` CLI and this repo.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from tests.helpers.reap import reap, tree

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.ray


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _wait_for_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


@pytest.fixture
def head(tmp_path: Path, auth_token_path: Path) -> Iterator[dict[str, str]]:
    gcs, dash, client, agent_http, agent_grpc, rt_env, metrics, nm, om = _free_ports(9)
    temp_dir = tempfile.mkdtemp(prefix="rj", dir="/tmp")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(auth_token_path),
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--num-cpus", "2", "--node-ip-address", "127.0.0.1",
           "--port", str(gcs), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
           "--include-dashboard", "true", "--ray-client-server-port", str(client),
           "--dashboard-agent-listen-port", str(agent_http), "--dashboard-agent-grpc-port", str(agent_grpc),
           "--runtime-env-agent-port", str(rt_env), "--metrics-export-port", str(metrics),
           "--node-manager-port", str(nm), "--object-manager-port", str(om),
           "--min-worker-port", "21000", "--max-worker-port", "21999",
           "--temp-dir", temp_dir, "--disable-usage-stats"]
    log = open(tmp_path / "head.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_port(dash, 90)
        yield {"address": f"http://127.0.0.1:{dash}", "token_path": str(auth_token_path)}
    finally:
        ours = tree([proc.pid])  # the head's nodes and the workers below them, listed while alive
        # Killed outright: `ray start --block` takes ~33 s to stop gracefully on SIGTERM (5 s of waiting for it
        # here cost every run 5 s), and nothing here needs more than its processes and files gone
        os.killpg(proc.pid, signal.SIGKILL)  # our own process group only
        for p in ours:  # and what left the group (a worker of the head's raylet)
            with contextlib.suppress(psutil.Error):
                p.kill()
        proc.wait(timeout=30)
        log.close()
        reap(ours, 30, "the job head")
        import shutil

        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    """A loopback MLflow tracking server this test starts and stops (one worker, no job runner)."""
    (port,) = _free_ports(1)
    cmd = [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
           "--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]
    proc = subprocess.Popen(cmd, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for_port(port, 90)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _client_env(home: Path, token_path: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{env['PATH']}")  # HOME: no ~/.ray token to find
    if token_path:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token_path)
    return env


JOB_SPEC = """\
name: job-sweep
trainable: {{name: "examples.image_folder:build", params: {{root: data/shapes, width: 4}}}}
space: {{batch_size: 4, lr: {{type: float, low: 1.0e-3, high: 1.0e-2, log: true}}}}
budget: {{num_trials: 2, num_steps: 4, num_warmup_steps: 2, report_interval_s: 0.01}}
scaling: {{num_workers: 2, cpus_per_worker: 1}}
telemetry: {{period_s: 0}}
tracking: {{uri: "{uri}", experiment: job-exp}}
storage_path: {storage}
"""


def test_the_readme_steps_wait_for_the_head_then_a_job_runs_a_sweep_reading_its_own_files(
        head: dict[str, str], mlflow_server: str, tmp_path: Path) -> None:
    """`ray start --head`, `sweeps wait-head`, `ray job submit --working-dir .` (token auth): a client
    without the token is refused by both; with it the head accepts the job, whose ranks resolve the
    spec's relative data path against the job's working directory, and both trials land in MLflow."""
    from examples.image_folder import prepare

    wait = [sys.executable, "-m", "sweeps", "wait-head", "--address", head["address"], "--timeout-s", "120"]
    refused = subprocess.run(wait, env=_client_env(tmp_path, None), capture_output=True, text=True, timeout=150)
    assert refused.returncode == 2 and "refused this client" in refused.stderr, refused.stderr[-2000:]
    env = _client_env(tmp_path, head["token_path"])
    ready = subprocess.run(wait, env=env, capture_output=True, text=True, timeout=150)
    assert ready.returncode == 0, ready.stderr[-2000:]
    assert f"the Ray head at {head['address']} accepts jobs" in ready.stdout

    project = tmp_path / "project"  # what the user submits: the spec and data/ beside it
    prepare(project / "data" / "shapes", num_per_class=8, image_size=12)
    (project / "sweep.yaml").write_text(JOB_SPEC.format(uri=mlflow_server, storage=tmp_path / "results"))
    submit = [str(BIN / "ray"), "job", "submit", "--address", head["address"], "--working-dir", ".",
              "--", "python", "-m", "sweeps", "run", "sweep.yaml"]
    denied = subprocess.run(submit, cwd=project, env=_client_env(tmp_path, None), capture_output=True, text=True,
                            timeout=120)
    said = denied.stdout + denied.stderr
    assert denied.returncode != 0
    assert "Failed to connect" not in said and ("401" in said or "token" in said.lower()), said[-2000:]
    client = MlflowClient(mlflow_server)
    assert client.get_experiment_by_name("job-exp") is None  # refused: nothing ran

    done = subprocess.run(submit, cwd=project, env=env, capture_output=True, text=True, timeout=400)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "succeeded" in out and "Sweep job-sweep finished" in out and "2/2 trials ok" in out
    runs = client.search_runs([client.get_experiment_by_name("job-exp").experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(runs) == 3 and len(children) == 2
    assert all(r.data.metrics["throughput/samples_per_s"] > 0 for r in children)
    # This head serves Ray's State API (a dashboard): the job's Train runs kept the placement-group cleaner,
    # which needs it (sweeps.service.trial: left out only where nothing answers it)
    listed = subprocess.run([str(BIN / "ray"), "list", "actors", "--address", head["address"], "--format", "json",
                             "--filter", "class_name=PlacementGroupCleaner"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0 and listed.stdout.strip().startswith("["), (listed.stdout[-1000:], listed.stderr[-2000:])
    cleaners = json.loads(listed.stdout)
    assert cleaners, "a job's Train run on a head with a dashboard started no PlacementGroupCleaner"
    probe = ready.stdout.split("no-op job ")[1].split(")")[0]
    status = subprocess.run([str(BIN / "ray"), "job", "status", "--address", head["address"], probe], env=env,
                            capture_output=True, text=True, timeout=60)
    assert f"Job '{probe}' succeeded" in status.stdout, status.stdout[-2000:]  # wait-head's no-op job ran

    # A second project, as a user submits it after a local run: its relative outputs (storage_path, the default
    # sqlite store) live outside the job's temporary working copy ($SWEEPS_HOME), so the local run's state that
    # the upload carries never collides with the job's; its data/ is listed in .gitignore, which `ray job submit`
    # does not upload: every trial fails `config`, and the reason says so, whole.
    second = tmp_path / "second"
    prepare(second / "data" / "shapes", num_per_class=4, image_size=12)
    (second / ".gitignore").write_text("data/\nmlflow.db\n")
    text = JOB_SPEC.format(uri="sqlite:///mlflow.db", storage="ray_results").replace("job-exp", "job-exp-2")
    (second / "sweep.yaml").write_text(text)
    local = second / "ray_results" / "job-sweep"  # what a local run of another spec under this name left
    local.mkdir(parents=True)
    (local / "sweep.json").write_text(json.dumps({"spec_text": text.replace("num_steps: 4", "num_steps: 5"),
                                                  "token": "t", "parent_run_id": "r", "tracking_uri": "u",
                                                  "spec_sha256": "0" * 64}))
    home = tmp_path / "sweeps-home"
    runtime = json.dumps({"env_vars": {"SWEEPS_HOME": str(home)}})
    failed = subprocess.run([*submit[:5], "--runtime-env-json", runtime, *submit[5:]], cwd=second, env=env,
                            capture_output=True, text=True, timeout=400)
    out = failed.stdout + failed.stderr
    assert failed.returncode != 0 and "a different sweep named" not in out, out[-4000:]
    assert "inside a Ray job: the sweep's state" in out and "0/2 trials ok" in out, out[-4000:]
    reasons = MlflowClient(f"sqlite:///{home / 'mlflow.db'}").search_runs(
        [MlflowClient(f"sqlite:///{home / 'mlflow.db'}").get_experiment_by_name("job-exp-2").experiment_id],
        "tags.`sweep.status` = 'config'")
    assert len(reasons) == 2 and (home / "ray_results" / "job-sweep" / "sweep.json").exists()
    why = reasons[0].data.tags["sweep.failure_reason"]
    assert why.startswith("rank 0: WorkloadError: 'data/shapes/classes.txt' is missing: `ray job submit` skips data "
                          "(in .gitignore)"), why
    assert all(fix in why for fix in ("remove it from .gitignore", "RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1",
                                      "use an absolute path on shared storage")), why
    # the sweep's last line (what `ray job status` shows of a job's log): the first failure itself (issue 50)
    nexts = [line for line in failed.stdout.splitlines() if line.startswith("Next: ")]
    assert nexts and nexts[-1].startswith("Next: no finished trial to learn from; fix the first failure first, trial "), nexts
    assert "skips data (in .gitignore)" in nexts[-1] and "RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1" in nexts[-1], nexts[-1]
    store = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    (parent,) = store.search_runs([store.get_experiment_by_name("job-exp-2").experiment_id], "tags.`sweep.name` = 'job-sweep'")
    assert parent.info.status == "FAILED", parent.info.status  # it ended and no trial finished: not FINISHED
