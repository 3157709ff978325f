"""A team's MLflow, for real: PostgreSQL 15 behind `mlflow server --app-name basic-auth`, its artifacts proxied
to an S3 bucket (moto), all on loopback and started once for this file (tests/helpers/team_mlflow.py).

A client sets only MLflow's own variables (`MLFLOW_TRACKING_URI`, `_USERNAME`, `_PASSWORD`): a refused login
ends `sweeps run` in one line with the store's exit code before Ray starts; a real sweep's runs are rows in
PostgreSQL, and its report downloads through the server from the bucket, with no object-store key in the
client's process."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sweeps.cli import main
from sweeps.exits import ExitCode, StoreUnusable
from tests.helpers.team_mlflow import TeamMlflow, missing, team_mlflow

# One lane for the whole file under `make test` (-n 2 --dist loadgroup): its server starts once, in the process whose
# session Ray cluster the sweep below uses (tests/conftest.py puts that test in this group).
pytestmark = pytest.mark.xdist_group("ray_cluster")

CLIENT_VARS = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
SPEC = """\
name: {name}
trainable: {{name: mlp-tabular, params: {{num_train_rows: 512}}}}
space:
  batch_size: 32
  lr: {{type: float, low: 1.0e-3, high: 1.0e-2, log: true}}
  num_dataloader_workers: 0
  pin_memory: false
budget: {{num_trials: 2, num_steps: 8, num_warmup_steps: 4, report_interval_s: 0.01}}
scaling: {{num_workers: 1, cpus_per_worker: 1}}
telemetry: {{period_s: 0.05}}
tracking: {{experiment: team-exp}}
storage_path: {storage}
seed: 3
"""


@pytest.fixture(scope="module")
def team() -> Iterator[TeamMlflow]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    with team_mlflow() as server:
        yield server


@contextlib.contextmanager
def client_env(monkeypatch: pytest.MonkeyPatch, **env: str) -> Iterator[None]:
    """Only MLflow's own variables, as given; no object-store key or endpoint anywhere in this process."""
    for key in [k for k in os.environ if k.startswith("AWS_") or k == "MLFLOW_S3_ENDPOINT_URL" or k in CLIENT_VARS]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield
    assert not [k for k in os.environ if k.startswith("AWS_") or k == "MLFLOW_S3_ENDPOINT_URL"]


LOGINS = {"wrong password": ("MLFLOW_TRACKING_USERNAME={user}, MLFLOW_TRACKING_PASSWORD is set, "
                              "MLFLOW_TRACKING_TOKEN is not set): check MLFLOW_TRACKING_USERNAME and "
                              "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) with the server's admin"),
          "no login": ("MLFLOW_TRACKING_USERNAME is not set, MLFLOW_TRACKING_PASSWORD is not set, MLFLOW_TRACKING_TOKEN "
                       "is not set): set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"),
          # a basic-auth server that caches logins fails a bearer token with HTTP 500 (MLflow 3.17), else 401
          "a token": "MLFLOW_TRACKING_TOKEN is set)"}


@pytest.mark.parametrize("login", LOGINS)
def test_a_refused_login_ends_sweeps_run_in_one_line_naming_the_variables_before_ray_starts(
        team: TeamMlflow, login: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    given = {"wrong password": {"MLFLOW_TRACKING_USERNAME": team.username, "MLFLOW_TRACKING_PASSWORD": "not-it"},
             "no login": {}, "a token": {"MLFLOW_TRACKING_TOKEN": "not-it"}}[login]
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC.format(name="refused", storage=tmp_path / "results"))

    def no_ray(*args: object) -> None:
        raise AssertionError("Ray started")

    monkeypatch.setattr("sweeps.service.runner.connect_ray", no_ray)
    with client_env(monkeypatch, MLFLOW_TRACKING_URI=team.uri, **given):
        t0 = time.monotonic()
        assert main(["run", str(spec)]) == ExitCode.STORE_UNUSABLE
        assert time.monotonic() - t0 < 20
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"error: the MLflow tracking server {team.uri} "), err
    assert "; nothing was run (" in err[0] and LOGINS[login].format(user=team.username) in err[0], err
    assert "not-it" not in err[0]


def test_an_experiment_the_user_may_only_read_is_refused_in_one_line(
        team: TeamMlflow, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's default permission is READ: another member's experiment can be read, not written."""
    from mlflow.tracking import MlflowClient

    from sweeps.tracking import SweepTracker

    with client_env(monkeypatch, MLFLOW_TRACKING_USERNAME=team.admin[0], MLFLOW_TRACKING_PASSWORD=team.admin[1]):
        MlflowClient(team.uri).create_experiment("admins-exp")
    with client_env(monkeypatch, MLFLOW_TRACKING_USERNAME=team.username, MLFLOW_TRACKING_PASSWORD=team.password):
        tracker = SweepTracker(team.uri, "admins-exp")  # reading it is allowed
        with pytest.raises(StoreUnusable, match=r"does not allow it to create runs in the experiment 'admins-exp' "
                                                r"\(HTTP 403\); nothing was run \(MLFLOW_TRACKING_USERNAME=alice"):
            tracker.start_sweep("s", "", "name: s\n", {})


def test_a_sweep_with_only_mlflows_variables_keeps_its_runs_in_postgres_and_its_report_in_the_bucket(
        team: TeamMlflow, ray_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3
    import psycopg2
    from mlflow.tracking import MlflowClient

    from sweeps.service.runner import run_sweep
    from sweeps.spec import parse_spec

    text = SPEC.format(name="team-sweep", storage=tmp_path / "results")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with client_env(monkeypatch, **team.client_env()):
        outcome = run_sweep(parse_spec(text), text, echo=lambda line: None)
        assert [t.status for t in outcome.trials] == ["ok", "ok"], [(t.status, t.reason) for t in outcome.trials]
        client = MlflowClient()  # the server from MLFLOW_TRACKING_URI, the login from the environment
        parent = outcome.parent_run_id
        summary = Path(client.download_artifacts(parent, "report/summary.html", str(tmp_path / "dl")))
        assert summary.read_text().lstrip().lower().startswith("<!doctype html")
        child = next(r for r in client.search_runs([client.get_run(parent).info.experiment_id])
                     if r.data.tags.get("mlflow.parentRunId") == parent)
        traces = [a.path for a in client.list_artifacts(child.info.run_id, "trace")]
        assert traces and Path(client.download_artifacts(child.info.run_id, traces[0], str(tmp_path / "dl"))).stat().st_size

    with contextlib.closing(psycopg2.connect(team.database_uri)) as con, con.cursor() as cur:
        cur.execute("SELECT r.run_uuid, r.status FROM runs r JOIN experiments e ON r.experiment_id = e.experiment_id "
                    "WHERE e.name = 'team-exp'")
        rows = dict(cur.fetchall())
    assert rows.keys() == {parent, *(t.run_id for t in outcome.trials)} and set(rows.values()) == {"FINISHED"}, rows
    s3 = boto3.client("s3", endpoint_url=team.s3_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                      region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=team.bucket)["Contents"]]
    assert any(k.endswith(f"{parent}/artifacts/report/summary.html") for k in keys), keys
    assert any(k.endswith(f"{child.info.run_id}/artifacts/{traces[0]}") for k in keys), keys
