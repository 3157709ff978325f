"""MLflow tracking: fail fast on a dead server; buffer and replay when the store fails mid-sweep."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeps.cli import main
from sweeps.tracking import SweepTracker, TrackingUnavailable, check_reachable


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dead_server_fails_fast_with_a_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(TrackingUnavailable, match=r"is not reachable \(ConnectionError\); nothing was run"):
        check_reachable(uri)
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: t\ntrainable: {{name: mlp-tabular}}\nbudget: {{num_trials: 1, num_steps: 2}}\n"
                    f"tracking: {{uri: '{uri}'}}\nstorage_path: {tmp_path}\n")
    t0 = time.monotonic()
    assert main(["run", str(spec)]) == 3
    assert time.monotonic() - t0 < 20  # no Ray started, no minutes of retries
    assert f"MLflow tracking server {uri} is not reachable" in capsys.readouterr().err


def test_calls_are_buffered_while_the_store_fails_and_replayed_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = SweepTracker(uri, "exp", pending_path=tmp_path / "pending.jsonl")
    tracker.start_sweep("s", "", "name: s\n", {})
    real = tracker.client.log_batch

    def down(*args: object, **kwargs: object) -> None:
        raise ConnectionError("server went away")

    monkeypatch.setattr(tracker.client, "log_batch", down)
    tracker.trial_started("t1", 1, {"batch_size": 32})  # create_run works, log_batch (params) fails
    for step in (1, 2, 3):
        tracker.trial_result("t1", {"loss/train": 1.0 / step, "pid": 123}, step)
    assert len(tracker.pending) == 4 and tracker.degraded_reason.startswith("ConnectionError")

    monkeypatch.setattr(tracker.client, "log_batch", real)
    tracker.trial_ended("t1", True, "ok", "", {"sweep.verdict": "unclear"})
    assert tracker.pending == []
    run = MlflowClient(uri).get_run(tracker.run_id("t1"))
    history = MlflowClient(uri).get_metric_history(run.info.run_id, "loss/train")
    assert [m.step for m in history] == [1, 2, 3] and run.data.params == {"batch_size": "32"}
    assert run.info.status == "FINISHED" and "pid" not in run.data.metrics


def test_what_never_reaches_the_store_is_saved_not_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tracker = SweepTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "exp", pending_path=tmp_path / "pending.jsonl")
    tracker.start_sweep("s", "", "name: s\n", {})
    monkeypatch.setattr(tracker.client, "create_run", lambda *a, **k: (_ for _ in ()).throw(TimeoutError("hangs")))
    tracker.trial_started("t1", 1, {"lr": 0.1})
    tracker.trial_result("t1", {"loss/val": 0.5}, 7)
    assert not tracker.flush()
    path = tracker.dump_pending()
    lines = path.read_text().splitlines() if path else []
    assert len(lines) == 2 and '"loss/val": 0.5' in lines[1]
