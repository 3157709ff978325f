"""MLflow tracking: fail fast on a dead server; buffer and replay when the store fails mid-sweep; the
experiment's description."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
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
    tracker.start_trial("t1", 1, {"batch_size": 32})  # create_run works, log_batch (params) fails
    for step in (1, 2, 3):
        tracker.log_result("t1", {"loss/train": 1.0 / step, "pid": 123}, step)
    assert len(tracker.pending) == 4 and tracker.degraded_reason.startswith("ConnectionError")

    monkeypatch.setattr(tracker.client, "log_batch", real)
    tracker.end_trial("t1", True, "ok", "", {"sweep.verdict": "unclear"})
    assert tracker.pending == []
    run = MlflowClient(uri).get_run(tracker.run_id("t1"))
    history = MlflowClient(uri).get_metric_history(run.info.run_id, "loss/train")
    assert [m.step for m in history] == [1, 2, 3] and run.data.params == {"batch_size": "32"}
    assert run.info.status == "FINISHED" and "pid" not in run.data.metrics


def test_what_never_reaches_the_store_is_saved_not_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tracker = SweepTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "exp", pending_path=tmp_path / "pending.jsonl")
    tracker.start_sweep("s", "", "name: s\n", {})
    monkeypatch.setattr(tracker.client, "create_run", lambda *a, **k: (_ for _ in ()).throw(TimeoutError("hangs")))
    tracker.start_trial("t1", 1, {"lr": 0.1})
    tracker.log_result("t1", {"loss/val": 0.5}, 7)
    assert not tracker.flush()
    path = tracker.dump_pending()
    lines = path.read_text().splitlines() if path else []
    assert len(lines) == 2 and '"loss/val": 0.5' in lines[1]


def test_a_resumed_sweep_that_finished_is_no_longer_said_to_be_interrupted(tmp_path: Path) -> None:
    # The first driver was stopped by SIGTERM (its parent run KILLED, "interrupted"); the one that resumed it ended
    # it: how it ended is what the last driver says, else a rerun took it for unfinished (tests/e2e/test_resume.py)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = SweepTracker(uri, "exp")
    first.start_sweep("s", "", "name: s\n", {})
    first.end_sweep("KILLED", {}, {"sweep.interrupted": "SIGTERM received", "sweep.exhausted": "old"})
    resumed = SweepTracker(uri, "exp")
    resumed.resume_sweep(first.parent_id)
    ends = ("sweep.stopped", "sweep.interrupted", "sweep.exhausted")
    resumed.end_sweep("FINISHED", {}, {"sweep.exhausted": "all 4 configurations ran"}, unsaid=ends[:2])
    run = MlflowClient(uri).get_run(first.parent_id)
    assert run.info.status == "FINISHED" and "sweep.interrupted" not in run.data.tags
    assert run.data.tags["sweep.exhausted"] == "all 4 configurations ran" and "sweep.stopped" not in run.data.tags


def test_the_experiment_is_described_by_its_latest_sweep_unless_a_user_described_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The UI shows an experiment's description folded to its first line above the runs table: the latest
    sweep's answer (the first paragraph of its parent run's note, not the spec's description after it),
    then what the experiment holds. A description someone else wrote is theirs and stays."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = SweepTracker(uri, "exp")
    first.start_sweep("s1", "the spec's description", "name: s1\n", {})

    def about() -> str:
        return str(MlflowClient(uri).get_experiment(first.experiment_id).tags["mlflow.note.content"])

    assert about().startswith("Latest sweep **s1**: running since ") and "\n\nThis experiment holds the sweeps" in about()
    first.set_note("**Best: trial 2** (batch_size 64) with x = 1. 2/2 trials finished.\n\n---\n\nthe spec's description")
    assert about().startswith("Latest sweep **s1**: **Best: trial 2** (batch_size 64) with x = 1. 2/2 trials finished.\n\n")
    assert "the spec's description" not in about() and about().endswith(f"parent run: `{first.parent_id}`.")
    second = SweepTracker(uri, "exp")
    second.start_sweep("s2", "", "name: s2\n", {})
    answer = "**Best: trial 2** (batch_size 64) with x = 1. 2/2 trials finished."
    last = f"Last answer, sweep **s1** (parent run `{first.parent_id}`): {answer}\n\n"
    assert about().startswith("Latest sweep **s2**: running since ") and last in about()  # the answer stays beside
    second.set_note("**No answer**: 0/2 trials finished.", answered=False)  # issue 50: a failed sweep keeps it too
    assert about().startswith(f"Latest sweep **s2**: **No answer**: 0/2 trials finished.\n\n{last}"), about()
    resumed = SweepTracker(uri, "exp")
    resumed.resume_sweep(first.parent_id)
    resumed.set_note("**Best: trial 3** with x = 2.")  # an answer: the last answer now
    assert about().startswith("Latest sweep **s1**: **Best: trial 3** with x = 2.\n\nThis experiment holds")

    MlflowClient(uri).set_experiment_tag(first.experiment_id, "mlflow.note.content", "Our team's MNIST sweeps.")
    third = SweepTracker(uri, "exp")
    third.start_sweep("s3", "", "name: s3\n", {})
    third.set_note("**Best: trial 1**")
    assert about() == "Our team's MNIST sweeps."

    def refused(*args: object) -> None:
        raise MlflowException("PERMISSION_DENIED: may not edit experiment")

    locked = SweepTracker(uri, "locked-exp")
    monkeypatch.setattr(locked.client, "set_experiment_tag", refused)
    assert locked.start_sweep("s4", "", "name: s4\n", {})  # the sweep goes on; the log says why
    assert "could not set the description of experiment" in caplog.text and "PERMISSION_DENIED" in caplog.text
