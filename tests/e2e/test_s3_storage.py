"""A sweep whose `storage_path` is a URI on an S3-compatible store (moto's server on loopback, issue 50).

The bucket holds the sweep's state, Tune's experiment and every rank's trace, MLflow gets each trial's trace
from there, and no local folder named after the URI (`./s3:/...`, what a bypassed storage layer makes) appears.
A driver of warm groups SIGKILLed mid-trial is resumed from the URI (`sweeps resume NAME --storage-path URI`) in
the same parent run, without duplicate child runs, its cost a lower bound that says so. The session cluster's
workers started before the store did, so the credentials travel in the URI (`s3://KEY:SECRET@bucket/...`), as a
node without the variables would need."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeps.exits import ExitCode
from tests.helpers.s3_server import S3Server, s3_server

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray

SPEC = """\
name: {name}
trainable: {{name: mlp-tabular, params: {{num_train_rows: 1024}}}}
space: {{lr: {{type: float, low: 1.0e-3, high: 1.0e-2, log: true}}, num_dataloader_workers: 0, pin_memory: false}}
budget: {{num_trials: 2, num_steps: 6, num_warmup_steps: 4, report_interval_s: 0.5}}
scaling: {{num_workers: 1}}
telemetry: {{trace_steps: 2}}
tracking: {{uri: 'sqlite:///{db}', experiment: s3-test}}
storage_path: '{storage}'
seed: 3
"""

GATED = """\
name: s3-resumable
trainable: {{name: "tests.helpers.faulty:gated", params: {{num_train_rows: 2048, at: 5, gate: '{gate}'}}}}
space: {{lr: {{type: float, low: 1.0e-3, high: 1.0e-2, log: true}}}}
budget: {{num_trials: 2, num_steps: 100000, num_warmup_steps: 2, report_interval_s: 0.5, max_window_s: 3}}
tracking: {{uri: 'sqlite:///{db}', experiment: s3-resume}}
storage_path: '{storage}'
seed: 5
cost: {{prices: {{cpu: {{usd_per_hour: 0.05, date: 2026-11-27, source: test price}}}}}}
"""


@pytest.fixture
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


def _with_keys(uri: str) -> str:
    return uri.replace("s3://", "s3://testing:testing@", 1)


def _no_local_uri_folder(*roots: Path) -> list[Path]:
    """Folders a bypassed storage layer would have made: `s3:` below the working directory or a temp folder."""
    return [p for root in roots for p in (root / "s3:", *root.glob("*/s3:")) if p.exists()]


def _children(client: MlflowClient, experiment: str, parent: str) -> list:
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'") if exp else []


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())


def test_a_sweep_keeps_its_state_tunes_experiment_and_traces_in_the_bucket(
        ray_cluster: None, s3: S3Server, tmp_path: Path, new_store: Callable[[Path], Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from sweeps.service.runner import run_sweep
    from sweeps.spec import parse_spec

    new_store(tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)  # a bypassed layer would make ./s3:/... here
    uri = _with_keys(s3.uri("sweeps"))
    text = SPEC.format(name="s3-sweep", db=tmp_path / "mlflow.db", storage=uri)
    lines: list[str] = []
    analysis = _Kept()  # Tune's ExperimentAnalysis's own records (the `ray` logger does not propagate to pytest's)
    logging.getLogger("ray.tune.analysis.experiment_analysis").addHandler(analysis)
    t0 = time.monotonic()
    try:
        outcome = run_sweep(parse_spec(text), text, echo=lines.append)
    finally:
        logging.getLogger("ray.tune.analysis.experiment_analysis").removeHandler(analysis)
    took = time.monotonic() - t0
    assert [t.status for t in outcome.trials] == ["ok", "ok"], [(t.status, t.reason) for t in outcome.trials]
    keys = s3.keys("sweeps/")
    assert "sweeps/s3-sweep/sweep.json" in keys and "sweeps/s3-sweep/tuner.pkl" in keys, keys
    assert any(k.startswith("sweeps/s3-sweep/experiment_state") for k in keys), keys
    # Tune's result files are not written where Tune would upload them again at every state save (MLflow has them),
    # and Tune's analysis at the end of the fit does not warn that it found none
    assert not [k for k in keys if k.rsplit("/", 1)[-1] in ("progress.csv", "result.json", "params.pkl")], keys
    assert not [m for m in analysis.said if "Failed to fetch metrics" in m], analysis.said
    traces = [k for k in keys if "/traces/" in k]
    assert len(traces) == 2 and all(k.endswith("rank-0.pt.trace.json.gz") for k in traces), keys
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = _children(client, "s3-test", outcome.parent_run_id)
    assert len(runs) == 2
    for run in runs:  # each trial's trace, from the bucket
        assert [a.path for a in client.list_artifacts(run.info.run_id, "trace")] == ["trace/rank-0.pt.trace.json.gz"]
    assert not _no_local_uri_folder(tmp_path, REPO, Path("/tmp")), "a local folder named after the URI"
    assert not any("testing:testing" in line for line in lines), lines  # the URI's secret is never printed
    print(f"2-trial sweep on S3 storage: {took:.1f} s")


def test_a_killed_driver_resumes_from_the_uri(ray_cluster: None, s3: S3Server, tmp_path: Path,
                                               new_store: Callable[[Path], Path]) -> None:
    import ray

    new_store(tmp_path / "mlflow.db")
    gate = tmp_path / "gate"
    gate.mkdir()
    uri = _with_keys(s3.uri("sweeps"))
    (tmp_path / "spec.yaml").write_text(GATED.format(gate=gate, db=tmp_path / "mlflow.db", storage=uri))
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONPATH": str(REPO)}
    driver = subprocess.Popen([sys.executable, "-m", "sweeps", "run", str(tmp_path / "spec.yaml")], cwd=REPO,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, first, before = time.monotonic() + 240, [], {}
    parent = ""
    try:
        while time.monotonic() < deadline and driver.poll() is None:  # trial 1 done, trial 2 at the gate
            held = sorted(f.name.removeprefix("arrived-") for f in gate.glob("arrived-*"))
            if not first and len(held) >= 2:
                first = held
                for me in first:
                    (gate / f"open-{me}").touch()
            elif first and len(held) >= 4 and "sweeps/s3-resumable/sweep.json" in s3.keys("sweeps/"):
                parent = json.loads(s3.client().get_object(Bucket=s3.bucket, Key="sweeps/s3-resumable/sweep.json")
                                    ["Body"].read())["parent_run_id"]
                runs = _children(client, "s3-resume", parent)
                if len(runs) == 2 and any(r.data.tags.get("sweep.status") == "ok" for r in runs):
                    before = {r.data.tags["sweep.trial_id"]: r.info.run_id for r in runs}
                    break
            time.sleep(0.2)
        if before:
            time.sleep(2.5)  # a Tune state save with trial 2 in it
    finally:
        driver.send_signal(signal.SIGKILL)
        out = driver.communicate(timeout=60)[0]
        (gate / "open").touch()  # the resumed trial 2 goes on
    assert before, f"the sweep never reached its second trial:\n{out[-3000:]}"
    # from the same directory as the run: the ranks work there, and import the test's trainable from it
    resumed = subprocess.run([sys.executable, "-m", "sweeps", "resume", "s3-resumable", "--storage-path", uri],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == ExitCode.OK, (resumed.stdout[-3000:], resumed.stderr[-3000:])
    assert "testing:testing" not in resumed.stdout + resumed.stderr
    runs = _children(client, "s3-resume", parent)
    trial_ids = [r.data.tags["sweep.trial_id"] for r in runs]
    assert len(trial_ids) == len(set(trial_ids)) == 2 and all(r.data.tags.get("sweep.status") == "ok" for r in runs), \
        ([(r.data.tags.get("sweep.status"), r.data.tags.get("sweep.failure_reason")) for r in runs], resumed.stdout[-3000:])
    assert all(before[r.data.tags["sweep.trial_id"]] == r.info.run_id for r in runs)
    parents = client.search_runs([runs[0].info.experiment_id], "tags.`sweep.name` = 's3-resumable'")
    assert [p.info.run_id for p in parents] == [parent] and parents[0].info.status == "FINISHED"
    assert not _no_local_uri_folder(tmp_path, REPO, Path("/tmp"))
    # what the sweep held: each driver says so in the sweep's ledger, unless killed outright; then the sweep's
    # figure is a lower bound, and says so
    ledger = [d["held_usd"] for d in json.loads(s3.client().get_object(
        Bucket=s3.bucket, Key="sweeps/s3-resumable/sweep.json")["Body"].read())["drivers"]]
    swept, tags = parents[0].data.metrics["cost/sweep_usd"], parents[0].data.tags
    assert len(ledger) == 2 and ledger[0] is None and ledger[1] is not None and ledger[1] > 0, ledger
    assert swept == pytest.approx(ledger[1])
    assert "killed outright" in tags["sweep.cost_at_least"] and "The sweep cost at least $" in tags["mlflow.note.content"]
