"""Shared fixtures. Ray tests share one local cluster (2 CPUs, own temp dir, own token)."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Before anything imports Ray: the auth token lives in a temp dir, never in $HOME/.ray.
_AUTH_DIR = tempfile.mkdtemp(prefix="sweeps-auth-")
_TOKEN = Path(_AUTH_DIR) / "token"
_TOKEN.write_text(secrets.token_hex(32))
os.environ["RAY_AUTH_TOKEN_PATH"] = str(_TOKEN)
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.pop("RAY_ADDRESS", None)
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_AUTH_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def auth_token_path() -> Path:
    return _TOKEN


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A real local Ray cluster for the session, stopped through its own handle."""
    import ray

    temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths are length-limited
    # Workers can import test-only trainables (tests.faulty) from the repo, as a job's working dir would.
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp_dir, object_store_memory=200 * 1024**2,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


SMALL_SWEEP = """\
name: test-sweep
description: two precisions, one unsupported on CPU
trainable: {{name: mlp-tabular, params: {{num_train_rows: 2048}}}}
space:
  batch_size: {{type: categorical, choices: [32, 64]}}
  precision: {{type: categorical, choices: ["32", "tf32"]}}
  lr: {{type: float, low: 1.0e-3, high: 1.0e-2, log: true}}
  num_dataloader_workers: 0
  pin_memory: false
objective:  # two objectives and a bound: the result is a Pareto front of the feasible trials
  metric: [throughput/samples_per_s, loss/val]
  mode: [max, min]
  constraints: [{{metric: loss/val, max: 1000.0}}]
budget: {{num_trials: 3, num_steps: 30, num_warmup_steps: 3, report_interval_s: 0.01}}
scaling: {{num_workers: 2, cpus_per_worker: 1}}
telemetry: {{period_s: 0.05}}
tracking: {{uri: "sqlite:///{db}", experiment: test-exp}}
storage_path: {storage}
seed: 3
"""


@pytest.fixture(scope="session")
def small_sweep(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """One real 3-trial sweep (Tuner + OptunaSearch + TorchTrainer per trial + MLflow store),
    shared by the tests that read its results; returns (outcome, tracking uri, progress lines)."""
    from sweeps.runner import run_sweep
    from sweeps.spec import parse_spec

    tmp = tmp_path_factory.mktemp("small-sweep")
    text = SMALL_SWEEP.format(db=tmp / "mlflow.db", storage=tmp / "results")
    lines: list[str] = []
    outcome = run_sweep(parse_spec(text), text, echo=lines.append)
    return outcome, f"sqlite:///{tmp / 'mlflow.db'}", lines


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated datasets are cached once per session."""
    return tmp_path_factory.mktemp("datasets")
