"""Resume: a sweep whose driver is killed mid-sweep is continued by `sweeps resume` (or a
second `sweeps run` of the same spec); another spec under the same name is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeps.cli import main
from sweeps.exits import ExitCode
from sweeps.results.outcome import TrialRow, end_status
from sweeps.service.runner import run_sweep
from sweeps.service.saved_state import STATE_FILE, SweepExists, SweepState, spec_digest, why_ended
from sweeps.spec import parse_spec

REPO = Path(__file__).resolve().parents[2]

SPEC = """\
name: resumable
trainable: {{name: "tests.helpers.faulty:gated", params: {{num_train_rows: 2048, at: 5, gate: '{gate}'}}}}
space: {{lr: {{type: float, low: 1.0e-3, high: 1.0e-2, log: true}}}}
budget: {{num_trials: 2, num_steps: {steps}, num_warmup_steps: 2, report_interval_s: 0.5, max_window_s: 3}}
scaling: {{reuse_workers: {reuse}}}
tracking: {{uri: 'sqlite:///{db}', experiment: resume-test}}
storage_path: {storage}
seed: 5
cost: {{prices: {{cpu: {{usd_per_hour: 0.05, date: 2026-11-27, source: test price}}}}}}
"""


def _children(client: MlflowClient, parent: str) -> list:
    exp = client.get_experiment_by_name("resume-test")
    return client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'") if exp else []


# How the driver is stopped: SIGKILL (nothing runs: Tune's last state save is what resume has), SIGTERM (what
# `timeout`, systemd, SLURM and Kubernetes send: a graceful stop, exit 4), SIGTERM twice (the second stops at
# once, exit 4). With scaling.reuse_workers true (warm groups) and false (a Train run per trial). A SIGKILLed
# driver of warm groups is tests/e2e/test_s3_storage.py's, with the storage on a URI (the same assertions).
STOPS = [("false", (signal.SIGKILL,)), ("true", (signal.SIGTERM,)), ("true", (signal.SIGTERM, signal.SIGTERM))]


@pytest.mark.ray
@pytest.mark.parametrize(("reuse", "signals"), STOPS, ids=["cold-kill", "warm-term", "warm-term-twice"])
def test_a_stopped_driver_resumes_without_losing_or_duplicating(ray_cluster: None, tmp_path: Path, reuse: str,
                                                                signals: tuple[int, ...],
                                                                new_store: Callable[[Path], Path],
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import ray

    new_store(tmp_path / "mlflow.db")

    # Every rank waits at its 5th training forward (3rd measured step) until the test lets it go
    # (tests.helpers.faulty:gated): trial 1's ranks at once, trial 2's not before the kill, so trial 2 is training
    # when the driver is killed (timed windows made that a race beside another test process). A
    # released trial ends at its 3 s time box (budget.max_window_s: more steps than it takes).
    gate = tmp_path / "gate"
    gate.mkdir()
    text = SPEC.format(steps=100_000, db=tmp_path / "mlflow.db", storage=tmp_path / "r", reuse=reuse, gate=gate)
    (tmp_path / "spec.yaml").write_text(text)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    # The driver runs in its own process against this session's cluster, as `ray job submit` would; in
    # the repository, where its ranks (which work in the driver's folder) find tests.helpers.faulty.
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONPATH": str(REPO)}
    driver = subprocess.Popen([sys.executable, "-m", "sweeps", "run", str(tmp_path / "spec.yaml")], cwd=REPO,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    state_file = tmp_path / "r" / "resumable" / STATE_FILE
    deadline = time.monotonic() + 240
    before: dict[str, str] = {}
    first: list[str] = []
    try:
        while time.monotonic() < deadline and driver.poll() is None:  # wait: trial 1 done, trial 2 at the gate
            held = sorted(f.name.removeprefix("arrived-") for f in gate.glob("arrived-*"))
            if not first and len(held) >= 2:  # trial 1's two ranks (one trial at a time): let them go
                first = held
                for me in first:
                    (gate / f"open-{me}").touch()
            elif first and len(held) >= 4 and state_file.exists():
                runs = _children(client, SweepState.read(state_file.parent).parent_run_id)
                if len(runs) == 2 and any(r.data.tags.get("sweep.status") == "ok" for r in runs):
                    before = {r.data.tags["sweep.trial_id"]: r.info.run_id for r in runs}
                    break
            time.sleep(0.2)
        # Tune saves its state every 2 s: a trial started in the last 2 s would be forgotten ("lost", by
        # design), so give Tune a save with trial 2 in it (and trial 1 ended) first.
        if before:
            time.sleep(2.5)
    finally:  # whatever happened: no driver left, no rank held (they would hold the session cluster's CPUs)
        for sig in signals if before else (signal.SIGKILL,):
            driver.send_signal(sig)
            time.sleep(0.5)
        if signals[0] != signal.SIGKILL:  # a stopping driver winds its warm group down: its held ranks must go on
            (gate / "open").touch()
        try:
            out = driver.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            driver.kill()
            out = driver.communicate(timeout=30)[0]
        (gate / "open").touch()  # the resumed trial 2 goes on
    assert before, f"the sweep never reached its second trial:\n{out[-3000:]}"
    if signals[0] == signal.SIGTERM:  # a scheduler's stop: exit 4, "resumable", the resume command, one parent run
        assert driver.returncode == ExitCode.RESUMABLE, out[-3000:]
        assert "Traceback" not in out and "Aborted" not in out and "SIGTERM received" in out, out[-3000:]
        assert "sweeps resume resumable" in out, out[-3000:]
        if len(signals) == 1:  # the graceful stop ran to its end: the trial was marked, the report drawn
            assert "NOT FINISHED" in out and "trial 2 interrupted" in out, out[-3000:]

    lines: list[str] = []
    spec = parse_spec(text)
    outcome = run_sweep(spec, text, echo=lines.append)  # `sweeps run` of the same spec resumes
    assert any(line.startswith("resuming sweep resumable") and "1 of 2 trials already ended" in line for line in lines), lines

    assert [t.status for t in outcome.trials] == ["ok", "ok"], [(t.status, t.reason) for t in outcome.trials]
    runs = _children(client, outcome.parent_run_id)
    trial_ids = [r.data.tags["sweep.trial_id"] for r in runs]
    assert len(trial_ids) == len(set(trial_ids)) == 2  # no duplicate runs, none lost
    assert all(before[t] == run_id for t, run_id in ((r.data.tags["sweep.trial_id"], r.info.run_id) for r in runs) if t in before)
    parents = client.search_runs([runs[0].info.experiment_id], "tags.`sweep.name` = 'resumable'")
    assert [p.info.run_id for p in parents] == [outcome.parent_run_id] and parents[0].data.tags["sweep.resumed"] == "1"
    assert parents[0].info.status == "FINISHED"

    # what the sweep held, across the two drivers: each said what it held in the sweep's ledger, unless killed
    held = [d["held_usd"] for d in SweepState.read(state_file.parent).drivers]
    swept, tags = parents[0].data.metrics["cost/sweep_usd"], parents[0].data.tags
    assert len(held) == 2 and held[1] is not None and held[1] > 0, held
    if signals == (signal.SIGTERM,):  # both concluded: the whole cost, the interrupted attempt's included
        assert held[0] is not None and swept == pytest.approx(held[0] + held[1]) and "sweep.cost_at_least" not in tags
        spent = sorted(([m.value for m in client.get_metric_history(r.info.run_id, "cost/trial_usd")] for r in runs),
                       key=len)
        # trial 1 once; trial 2 after its interrupted attempt, then that attempt and the resumed one together
        assert [len(h) for h in spent] == [1, 2] and spent[1][1] > spent[1][0] > 0, spent
    elif signals[0] == signal.SIGKILL:  # the killed driver never said: the figure is a lower bound, and says so
        assert held[0] is None and swept == pytest.approx(held[1])
        assert "killed outright" in tags["sweep.cost_at_least"] and "The sweep cost at least $" in tags["mlflow.note.content"]
    # Finished now, the sweep is left alone by another `sweeps run` of its spec and by `sweeps resume`
    _run_again_is_left_alone(tmp_path, "resumable", outcome.parent_run_id, monkeypatch, capsys)


FINISHED_SPEC = """\
name: done-once
trainable: {{name: mlp-tabular, params: {{num_train_rows: 1024}}}}
space: {{lr: {{type: float, low: 1.0e-3, high: 1.0e-2, log: true}}, num_dataloader_workers: 0, pin_memory: false}}
budget: {{num_trials: 2, num_steps: 6, num_warmup_steps: 2, report_interval_s: 0.5}}
scaling: {{num_workers: 1}}
tracking: {{uri: 'sqlite:///{db}', experiment: done-test}}
storage_path: {storage}
seed: 7
"""


def _parent_as_logged(client: MlflowClient, parent: str) -> dict:
    """What MLflow holds of a sweep: its parent run's status, end, tags, every metric's whole history and
    every artifact, and its child runs' status and end."""
    run = client.get_run(parent)

    def files(path: str | None = None) -> list[tuple[str, int | None]]:
        return [x for f in client.list_artifacts(parent, path) for x in (files(f.path) if f.is_dir else [(f.path, f.file_size)])]

    return {"status": run.info.status, "end_time": run.info.end_time, "tags": run.data.tags,
            "history": {k: [(m.value, m.step, m.timestamp) for m in client.get_metric_history(parent, k)]
                        for k in run.data.metrics},
            "artifacts": sorted(files()),
            "children": sorted((c.info.run_id, c.info.status, c.info.end_time) for c in
                               client.search_runs([run.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'"))}


def _run_again_is_left_alone(tmp_path: Path, name: str, parent: str, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    """Run the finished sweep of `tmp_path / "spec.yaml"` again, by `sweeps run` and by `sweeps resume`: each says
    there is nothing to do and prints the stored answer, with no Ray connection and no warm pool (so no worker
    group); MLflow and the sweep's ledger are as they were."""
    import ray

    import sweeps.service.runner
    import sweeps.service.tuning

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    logged = _parent_as_logged(client, parent)
    assert logged["status"] == "FINISHED" and logged["artifacts"], logged
    state = (tmp_path / "r" / name / STATE_FILE).read_text()
    groups = len(ray.util.placement_group_table())
    started: list[str] = []
    connect, pool = sweeps.service.runner.connect_ray, sweeps.service.tuning.WarmPool
    monkeypatch.setattr(sweeps.service.runner, "connect_ray", lambda *a: started.append("ray") or connect(*a))
    monkeypatch.setattr(sweeps.service.tuning, "WarmPool", lambda *a: started.append("pool") or pool(*a))
    capsys.readouterr()
    for argv in (["run", str(tmp_path / "spec.yaml")], ["resume", name, "--storage-path", str(tmp_path / "r")]):
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        said = [line for line in out.splitlines() if "nothing to do" in line]
        assert len(said) == 1 and "already ended" in said[0] and "all 2 trials of its budget ended" in said[0], out
        # the stored answer, as `sweeps report` prints it
        assert f"Sweep {name} (parent run {parent}): 2/2 trials ok" in out, out
        assert "Best configuration:" in out and parent in out and "finished in" not in out, out
    assert started == [], started
    assert len(ray.util.placement_group_table()) == groups
    assert _parent_as_logged(client, parent) == logged
    assert (tmp_path / "r" / name / STATE_FILE).read_text() == state  # no driver entered the ledger


def test_a_sweep_has_ended_only_when_its_driver_concluded_it_and_tune_has_nothing_left() -> None:
    # why_ended: "" sends a re-run into Tune's resume, as before; a reason leaves the sweep alone
    spec = parse_spec(FINISHED_SPEC.format(db="/x/mlflow.db", storage="/x/r").replace(
        "report_interval_s: 0.5", "report_interval_s: 0.5, time_budget_s: 60"))

    def rows(*statuses: str, reason: str = "") -> list[TrialRow]:
        return [TrialRow(f"t{i}", i, {}, status=s, reason=reason) for i, s in enumerate(statuses)]

    ok4, tune4 = rows("ok", "ok", "oom", "ok"), ["TERMINATED", "TERMINATED", "ERROR", "TERMINATED"]
    assert why_ended(4, "FINISHED", {}, ok4, tune4) == "all 4 trials of its budget ended"
    failed4 = rows("error", "error", "error", "error")  # no trial finished: FAILED, and ended all the same
    assert why_ended(4, "FAILED", {}, failed4, tune4) == "all 4 trials of its budget ended"
    assert why_ended(4, "KILLED", {"sweep.interrupted": "Ctrl+C"}, ok4, tune4) == ""  # stopped before its end
    assert why_ended(4, "RUNNING", {}, ok4, tune4) == ""  # its driver was killed outright
    assert why_ended(4, "FINISHED", {}, rows("ok", "ok", "oom", "interrupted"), tune4) == ""
    assert why_ended(4, "FINISHED", {}, ok4[:3], [*tune4[:3], "PENDING"]) == ""  # Tune starts it on resume
    assert why_ended(4, "FINISHED", {}, ok4[:2], tune4[:2]) == ""  # e.g. Ctrl+C between two trials: the rest runs
    assert why_ended(4, "FINISHED", {"sweep.stopped": "3 identical failures"}, ok4[:2], tune4[:2]) == \
        "it stopped early after 2 of 4 trials (3 identical failures)"
    assert why_ended(4, "FINISHED", {"sweep.exhausted": "all 2 configurations ran"}, ok4[:2], tune4[:2]) == \
        "its space was exhausted after 2 of 4 trials"
    status, reason, _ = end_status(spec, {}, "", out_of_time=True)  # how the callback ends a trial the budget stopped
    assert why_ended(4, "FINISHED", {}, [*ok4[:1], *rows(status, reason=reason)], tune4[:2]) == \
        "its time budget ran out after 2 of 4 trials"


def test_another_spec_under_the_same_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = SPEC.format(steps=10, db=tmp_path / "mlflow.db", storage=tmp_path / "r", reuse="true", gate=tmp_path)
    SweepState(text, "tok", "run-1", "sqlite:///x").write(tmp_path / "r" / "resumable")
    other = text.replace("num_steps: 10", "num_steps: 20")
    with pytest.raises(SweepExists, match="a different sweep named 'resumable' already exists") as info:
        SweepState.find(parse_spec(other), other)
    assert "sweeps resume resumable" in str(info.value) and "--restart" in str(info.value)
    (tmp_path / "other.yaml").write_text(other)
    assert main(["run", str(tmp_path / "other.yaml")]) == 2  # refused before Ray or MLflow start
    assert "already exists" in capsys.readouterr().err
    # comments, formatting and the storage folder do not make a different spec; values do
    moved = text.replace(str(tmp_path / "r"), str(tmp_path / "elsewhere"))
    assert spec_digest(parse_spec("# same\n" + moved)) == spec_digest(parse_spec(text)) != spec_digest(parse_spec(other))
    # --restart moves the old one aside instead
    assert SweepState.find(parse_spec(other), other, restart=True, echo=lambda _: None) is None
    assert not (tmp_path / "r" / "resumable").exists() and list((tmp_path / "r").glob("resumable.old-*"))


def test_resume_of_an_unknown_sweep_lists_the_known_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = SPEC.format(steps=10, db=tmp_path / "mlflow.db", storage=tmp_path / "r", reuse="true", gate=tmp_path)
    SweepState(text, "tok", "run-1", "sqlite:///x").write(tmp_path / "r" / "resumable")
    assert main(["resume", "nope", "--storage-path", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "no sweep named 'nope'" in err and "sweeps there: resumable" in err


def test_a_sweep_whose_mlflow_run_is_gone_says_so_before_anything_runs(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # A user deleted mlflow.db to start afresh, the sweep's folder is still there: resuming it would
    # fail at the first trial with MLflow's "Run with id=... not found"; say what happened and the fix.
    text = SPEC.format(steps=10, db=tmp_path / "mlflow.db", storage=tmp_path / "r", reuse="true", gate=tmp_path)
    exp_dir = tmp_path / "r" / "resumable"
    SweepState(text, "tok", "4258cafd91964445b3d1118f0beb6ca8", f"sqlite:///{tmp_path / 'mlflow.db'}").write(exp_dir)
    (exp_dir / "tuner.pkl").write_bytes(b"")  # Ray Tune had saved its state
    (tmp_path / "spec.yaml").write_text(text)
    assert main(["run", str(tmp_path / "spec.yaml")]) == 2  # refused before Ray starts
    err = capsys.readouterr().err
    assert "was tracked as MLflow run 4258cafd91964445b3d1118f0beb6ca8" in err and "no longer has" in err, err
    assert "--restart" in err and "Traceback" not in err
    assert (exp_dir / STATE_FILE).exists()  # nothing was moved or lost
