"""The sweep's controller on fakes (as Ray Train V2's `test_controller.py` drives its controller with a dummy
worker group): trials start, report and end (ok, infeasible, pruned, OOM, error, unranked, halted), and the
sweep concludes (unfinished trials settled, interrupted or lost, the parent run closed, the cost summed), with a
tracker that records its calls, a fake warm-pool queue, a fake Ray and Tune and a clock the test moves. No Ray
cluster, no MLflow store."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sweeps.results.outcome import TrialRow
from sweeps.service.controller import SweepController
from sweeps.service.failures import TrialFailure
from sweeps.service.saved_state import STATE_FILE, SweepState
from sweeps.service.trial import HALT_KEY
from sweeps.spec import parse_spec
from trainables.contract import SWEEP_USD, TRIAL_USD

TPUT = "throughput/samples_per_s"
SPEC = """\
name: ctl
trainable: {{name: mlp-tabular}}
space: {{lr: {{type: float, low: 1.0e-3, high: 1.0e-2}}}}
objective: {{metric: throughput/samples_per_s, mode: max, constraints: [{{metric: loss/val, max: 2.0}}]}}
search: {{early_stopping: {{grace_steps: 2}}}}
budget: {{num_trials: 3, num_steps: 10{budget}}}
storage_path: {storage}
"""
SECTIONS = {"constraints": "constraints: [{metric: loss/val, max: 2.0}]",
            "search": "search: {early_stopping: {grace_steps: 2}}\n"}
PRICED = "cost: {prices: {cpu: {usd_per_hour: 1.8, date: 2026-11-26, source: test}}}\n"  # 2 ranks: $0.001 a second
FINAL = {TPUT: 10.0, "loss/val": 1.5, "progress/steps": 10, "progress/final": 1}
CONFIG = {"lr": 0.005}


class FakeTracker:
    """`SweepTracker`'s verbs, recorded in order (no MLflow)."""

    uri = "fake:///mlflow"

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.pending: list[Any] = []
        self.degraded_reason = ""
        self.runs: dict[str, str] = {}
        self.client = SimpleNamespace(log_batch=lambda run_id, **kw: self.calls.append(("log_batch", run_id)),
                                      log_dict=lambda run_id, d, name: self.calls.append(("log_dict", name)))

    def start_sweep(self, name: str, description: str, spec_text: str, tags: dict[str, str]) -> str:
        self.calls.append(("start_sweep", name, tags))
        return "parent"

    def start_trial(self, trial_id: str, number: int, params: dict[str, Any]) -> None:
        self.calls.append(("start_trial", trial_id, number))
        self.runs[trial_id] = f"run-{trial_id}"

    def run_id(self, trial_id: str) -> str | None:
        return self.runs.get(trial_id)

    def log_result(self, trial_id: str, result: dict[str, Any], step: int) -> None:
        self.calls.append(("log_result", trial_id, dict(result), step))

    def log_files(self, trial_id: str, folder: str, artifact_path: str) -> None:
        self.calls.append(("log_files", trial_id, artifact_path))

    def end_trial(self, trial_id: str, ok: bool, kind: str = "ok", reason: str = "",
                  tags: dict[str, str] | None = None) -> None:
        self.calls.append(("end_trial", trial_id, ok, kind, reason, tags or {}))

    def flush(self) -> bool:
        return True

    def end_sweep(self, status: str, metrics: dict[str, float], tags: dict[str, str],
                  unsaid: tuple[str, ...] = ()) -> None:
        self.calls.append(("end_sweep", status, metrics, tags))
        self.unsaid = unsaid

    def set_note(self, markdown: str, answered: bool = True) -> None:
        self.calls.append(("set_note", markdown.split("\n", 1)[0], answered))

    def said(self, verb: str) -> list[tuple[Any, ...]]:
        return [c[1:] for c in self.calls if c[0] == verb]


class FakeQueue:
    """The warm pool's queue (`sweeps.service.tuning.PoolQueue`): each trial's span, the groups' starts."""

    def __init__(self, spans: dict[str, tuple[float | None, float | None]] | None = None) -> None:
        self.spans = spans or {}
        self.cancelled: list[str] = []

    def cancel(self, trial_id: str) -> None:
        self.cancelled.append(trial_id)

    def span(self, trial_id: str) -> tuple[float | None, float | None]:
        return self.spans.get(trial_id, (None, None))

    def group_starts(self) -> list[tuple[tuple[int, str], float, str]]:
        return []


class FakeTune:
    """`sweeps.service.tuning.RayTune` without Ray: its tuner's `fit` plays `script` on the sweep's callback,
    as Tune calls it."""

    def __init__(self, queue: FakeQueue | None = None, script: Any = None,
                 lives: list[tuple[tuple[int, str], float, bool]] | None = None) -> None:
        self.queue, self.waits, self.lives, self.script = queue, None, lives or [], script
        self.trials_dir = ""  # where the trials keep their traces (`_controller`: in the test's folder)
        self.asked: list[Any] = []

    def start(self, echo: Any) -> None:
        self.asked.append("start")

    def cluster(self) -> dict[str, float]:
        return {"CPU": 4.0}

    def free(self) -> dict[str, float] | None:
        return None

    def tuner(self, callback: Any, restore: bool) -> Any:
        self.asked.append(("tuner", restore))
        return SimpleNamespace(fit=lambda: self.script(callback))

    def first_group_s(self) -> float | None:
        return None

    def probe(self, search: Any, echo: Any) -> dict[str, str] | None:
        return None

    def join(self, stopped: bool) -> None:
        self.asked.append(("join", stopped))


class Clock:
    """Wall and monotonic time, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


class Limits:
    """A speed of light that scores every trial at 40% (and knows no emulated precision)."""

    sources = {"cpu:test": "quick figures"}

    def score_trial(self, metrics: dict[str, Any], params: dict[str, Any]) -> dict[str, float]:
        return {"perf/sol_pct": 40.0}

    def emulated_precisions(self) -> frozenset[str]:
        return frozenset()


def _controller(tmp_path: Path, budget: str = "", extra: str = "", tune: FakeTune | None = None,
                saved: SweepState | None = None, **edits: str) -> tuple[SweepController, FakeTracker, list[str], Clock]:
    """A controller over SPEC (`budget` added to its budget, `extra` sections, each of `edits` replaced) and fakes."""
    text = SPEC.format(budget=budget, storage=tmp_path / "r") + extra
    for old, new in edits.items():
        text = text.replace(SECTIONS[old], new)
    tracker, lines, clock, tune = FakeTracker(), [], Clock(), tune or FakeTune()
    tune.trials_dir = str(tmp_path / "r" / "ctl" / "trials")
    controller = SweepController(parse_spec(text), text, lines.append, saved, tracker,  # type: ignore[arg-type]
                                 tune=tune, speed_of_light=lambda uri: Limits(),  # type: ignore[arg-type,return-value]
                                 clock=clock)
    controller.speed_of_light = Limits()  # type: ignore[assignment]
    return controller, tracker, lines, clock


def _trial(controller: SweepController, trial_id: str, *results: dict[str, Any]) -> None:
    controller.trial_started(trial_id, CONFIG)
    for i, result in enumerate(results, 1):
        controller.trial_reported(trial_id, result, i)


def test_finished_trials_are_ok_infeasible_or_pruned_and_their_runs_closed_so(tmp_path: Path) -> None:
    controller, tracker, lines, clock = _controller(tmp_path)
    (tmp_path / "r" / "ctl" / "trials" / "ctl-ok" / "traces").mkdir(parents=True)  # its ranks kept traces
    for tid, result in (("ok", FINAL), ("bad", {**FINAL, TPUT: 20.0, "loss/val": 3.5}),
                        ("slow", {TPUT: 1.0, "progress/steps": 2, "progress/final": 0})):
        _trial(controller, tid, result)
        clock.now += 10.0
        controller.trial_completed(tid)
    rows = controller.rows
    assert [(r.number, r.status) for r in rows.values()] == [(1, "ok"), (2, "infeasible"), (3, "pruned")]
    assert rows["bad"].reason == "loss/val=3.5 breaks loss/val <= 2" and "INFEASIBLE" in lines[3]
    assert "stopped by ASHA after 2 measured steps" in rows["slow"].reason
    assert lines[0] == "[trial 1/3] ok started: lr=0.005"
    # the fake clock: 10 s a trial, so 20 s elapsed at the second trial's end and an ETA of the third's 10 s
    assert lines[3].endswith("| done 2/3, running 0, failed 0 | best throughput/samples_per_s=10 (trial 1) | "
                             "elapsed 20s, ETA 10s"), lines[3]
    # MLflow: each trial's run opened, its reports logged at their step, the measured ones scored, each closed
    assert tracker.said("start_trial") == [("ok", 1), ("bad", 2), ("slow", 3)]
    assert [c[0] for c in tracker.calls if c[1] == "ok"][-2:] == ["log_files", "end_trial"]  # before its run ends
    assert tracker.said("log_files") == [("ok", "trace")]
    assert tracker.said("log_result")[:2] == [("ok", FINAL, 10), ("ok", {"perf/sol_pct": 40.0}, 10)]
    assert ("slow", {"perf/sol_pct": 40.0}, 2) not in tracker.said("log_result")  # a pruned trial is not scored
    ended = {c[0]: c[1:] for c in tracker.said("end_trial")}
    assert ended["bad"][:3] == (True, "infeasible", "loss/val=3.5 breaks loss/val <= 2")
    assert ended["ok"][3]["sweep.verdict"] == rows["ok"].verdict.split(":")[0] and ended["slow"][:2] == (True, "pruned")
    assert "sweep.verdict" not in ended["slow"][3]
    assert rows["ok"].run_id == "run-ok" and controller.unfinished() == set() and controller.started() == set(rows)


def test_an_objective_no_trial_reports_stops_the_sweep_listing_what_was_reported(tmp_path: Path) -> None:
    controller, tracker, lines, _ = _controller(tmp_path, constraints="constraints: [{metric: eval/accuracy, min: 0.9}]",
                                                search="")
    _trial(controller, "t1", FINAL)
    controller.trial_completed("t1")
    row = controller.rows["t1"]
    assert row.status == "config"
    assert "the trial reported no eval/accuracy" in row.reason and "it reported: loss/val, throughput/samples_per_s" in row.reason
    assert controller.search.tripped.startswith("objective metric not reported")
    assert lines[-1].startswith("STOPPING the sweep: the trial reported no eval/accuracy")
    assert tracker.said("end_trial")[-1][:3] == ("t1", False, "config")


def test_an_oom_bounds_the_search_stops_its_group_and_says_what_it_rules_out(tmp_path: Path) -> None:
    queue = FakeQueue()
    controller, tracker, lines, _ = _controller(tmp_path, tune=FakeTune(queue))
    _trial(controller, "t1", {TPUT: 5.0, "progress/steps": 1})
    controller.trial_errored("t1", TrialFailure("oom", "rank 0: OutOfMemoryError: CUDA out of memory"))
    row = controller.rows["t1"]
    assert (row.status, controller.search.failures["t1"]) == ("oom", "oom") and queue.cancelled == ["t1"]
    batch = row.params["batch_size"]
    assert controller.search.oom_excluded({**row.params, "batch_size": batch}) == batch
    assert lines[-2].startswith("[trial 1/3] FAILED (oom: rank 0: OutOfMemoryError")
    assert lines[-1] == (f"out of memory at batch_size={batch} with precision=32, compile=False, num_workers=2: "
                         "no batch this large or larger will be tried with those settings")
    assert tracker.said("end_trial") == [("t1", False, "oom", "rank 0: OutOfMemoryError: CUDA out of memory", {})]


def test_the_same_error_twice_in_a_row_trips_the_breaker_once(tmp_path: Path) -> None:
    controller, tracker, lines, _ = _controller(tmp_path, budget=", max_identical_failures: 2")
    _trial(controller, "t1")
    controller.trial_errored("t1", None)  # Tune kept no error: said so
    assert controller.rows["t1"].reason == "the trial failed without a stored error" and not controller.search.tripped
    for tid in ("t2", "t3"):
        _trial(controller, tid)
        controller.trial_errored(tid, TrialFailure("error", "rank 0: ValueError: boom"))
    why = "2 trials in a row failed the same way (error: rank 0: ValueError: boom)"
    assert controller.search.tripped == why and lines[-1] == f"STOPPING the sweep: {why}. Fix that, then run the sweep again."
    assert sum(line.startswith("STOPPING") for line in lines) == 1
    assert [c[2] for c in tracker.said("end_trial")] == ["error", "error", "error"]
    # it ended and no trial finished: the parent run FAILED, not FINISHED, and the experiment keeps its last
    # answer beside this one's none (issue 50, item 10)
    controller._conclude(ok=True, wall=3.0, report=False)
    assert tracker.said("end_sweep")[0][0] == "FAILED"
    assert tracker.said("set_note")[0][1] is False


def test_a_halt_a_trial_asks_for_concludes_the_sweep_interrupted_and_resumable(tmp_path: Path) -> None:
    import signal

    controller, tracker, lines, clock = _controller(tmp_path)
    _trial(controller, "t1", {TPUT: 5.0, "progress/steps": 1})
    _trial(controller, "t2")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # no Tune listening: trials are stopped
    try:
        controller.trial_reported("t1", {HALT_KEY: "disk_full: No space left on device"}, 2)
        controller.halt("a second reason")  # only the first halt counts
    finally:
        signal.signal(signal.SIGINT, previous)
    why = "trial 1 disk_full: No space left on device"
    assert controller.halted == why and controller.search.tripped == f"halted: {why}"
    assert [line for line in lines if line.startswith("HALTING")] == [
        f"HALTING the sweep: {why}. Finished trials are kept; trials still running run again when the sweep is resumed."]
    assert not [c for c in tracker.said("log_result") if HALT_KEY in c[1]]  # the ask is not a metric
    clock.now += 30.0
    outcome = controller._conclude(ok=True, wall=30.0, report=False)
    interrupted = f"halted: {why}"
    assert outcome.interrupted == interrupted and [t.status for t in outcome.trials] == ["interrupted", "interrupted"]
    assert tracker.said("end_trial") == [("t1", False, "interrupted", "disk_full: No space left on device", {}),
                                         ("t2", False, "interrupted", interrupted, {})]
    status, _, tags = tracker.said("end_sweep")[0]
    assert status == "KILLED" and tags["sweep.interrupted"] == interrupted and tags["sweep.trials_ok"] == "0"
    assert lines[-1] == (f"the sweep did not finish ({interrupted}); continue it with: "
                         f"sweeps resume ctl --storage-path {tmp_path / 'r'}")


def test_a_resumed_sweep_keeps_its_rows_and_a_trial_no_driver_recorded_is_lost(tmp_path: Path) -> None:
    text = SPEC.format(budget="", storage=tmp_path / "r")
    saved = SweepState(text, "tok", "parent", FakeTracker.uri)
    controller, tracker, lines, _ = _controller(tmp_path, saved=saved)
    params = {"batch_size": 32, "precision": "32", "compile": False, "num_workers": 1}
    controller.resume([TrialRow("t1", 1, params, "run-t1", "ok", "", "balanced", {TPUT: 12.0}),
                       TrialRow("t2", 2, {**params, "batch_size": 64}, "run-t2", "oom", "OutOfMemoryError"),
                       TrialRow("t3", 3, params, "run-t3", "running")])
    assert lines == [f"resuming sweep ctl from {tmp_path / 'r' / 'ctl'}: 2 of 3 trials already ended; "
                     "MLflow parent run parent"]
    assert controller.search.oom_excluded({**params, "batch_size": 64}) == 64  # what it learnt about memory
    _trial(controller, "t4", FINAL)
    controller.trial_completed("t4")
    assert controller.rows["t4"].number == 4 and controller.started() == {"t4"}
    outcome = controller._conclude(ok=True, wall=5.0, report=False)
    assert [(t.number, t.status) for t in outcome.trials] == [(1, "ok"), (2, "oom"), (3, "lost"), (4, "ok")]
    assert tracker.said("end_trial")[-1] == (
        "t3", False, "lost", "the sweep driver died before Tune recorded this trial; another ran in its place", {})
    status, metrics, tags = tracker.said("end_sweep")[0]
    assert status == "FINISHED" and metrics == {TPUT: 12.0} and outcome.interrupted == ""
    assert (tags["sweep.trials_ok"], tags["sweep.trials_total"], tags["sweep.best_run_id"]) == ("2", "4", "run-t1")
    # the resumed sweep ended: what an earlier driver said of its end (stopped, interrupted) no longer holds
    assert set(tracker.unsaid) == {"sweep.stopped", "sweep.interrupted", "sweep.exhausted"}
    assert tracker.calls[-1][0] == "set_note"


def test_each_trial_costs_its_span_and_the_sweep_what_its_groups_held(tmp_path: Path) -> None:
    # the pool says t1 cost from 1005 to 1065 (its actor's and group's start-up are the sweep's): 60 s
    queue = FakeQueue({"t1": (1005.0, 1065.0)})
    controller, tracker, _, clock = _controller(tmp_path, extra=PRICED, tune=FakeTune(queue, lives=[((2, ""), 200.0, True)]))
    controller.resume([TrialRow("t2", 1, {"num_workers": 2}, "run-t2", "interrupted", "halted", "", {TRIAL_USD: 0.5})])
    _trial(controller, "t1", FINAL)
    _trial(controller, "t2")  # run again: its earlier attempt cost $0.50
    clock.now = 1100.0
    controller.trial_completed("t1")
    assert controller.rows["t1"].metrics[TRIAL_USD] == pytest.approx(0.06)
    assert tracker.said("log_result")[1] == ("t1", {TRIAL_USD: pytest.approx(0.06)}, 10)
    clock.now = 1150.0
    for trial_id in controller.unfinished():  # as `_fit` charges an interrupted attempt: to now
        controller.charge(trial_id)
    assert controller.charged == {"t1": pytest.approx(0.06), "t2": pytest.approx(0.15)}
    assert controller.rows["t2"].metrics[TRIAL_USD] == pytest.approx(0.65)  # its attempts add up
    controller._conclude(ok=False, wall=150.0, report=False)
    _, metrics, tags = tracker.said("end_sweep")[0]
    assert metrics[SWEEP_USD] == pytest.approx(0.2)  # its one group held 200 s: what the sweep held
    assert tags["sweep.prices"] == "cpu: $1.8/h, 2026-11-26, test"


def test_a_sweep_runs_start_to_report_on_a_fake_tune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sweeps.results.plots

    published: list[Any] = []
    monkeypatch.setattr(sweeps.results.plots, "publish", lambda outcome, client: published.append(outcome))

    def play(callback: Any) -> None:  # Tune's calls, in its order
        trial = SimpleNamespace(trial_id="t1", config=CONFIG)
        callback.on_trial_start(0, [], trial)
        clock.now += 20.0
        callback.on_trial_result(1, [], trial, FINAL)
        callback.on_step_end(1, [])
        callback.on_trial_complete(1, [], trial)

    tune = FakeTune(script=play)
    controller, tracker, lines, clock = _controller(tmp_path, tune=tune)
    outcome = controller.run()
    assert tune.asked == ["start", ("tuner", False), ("join", False)]
    assert [t.status for t in outcome.trials] == ["ok"] and outcome.parent_run_id == "parent" == controller.parent
    assert lines[1] == "sweep ctl: 3 trials, objective max throughput/samples_per_s subject to loss/val <= 2; MLflow parent run " \
                       "parent at fake:///mlflow" and lines[2] == "speed of light for cpu:test: quick figures"
    assert lines[4] == "[trial 1/3] t1 started: lr=0.005" and lines[5].startswith("[trial 1/3] throughput/samples_per_s=10")
    assert lines[-2] == "report: figures and summary.html logged under report/ on parent run parent"
    assert lines[-1].startswith("one Ray Train run per trial")  # the overhead line, last
    assert published == [outcome]
    assert [c[0] for c in tracker.calls if c[0] != "log_result"] == [
        "start_sweep", "start_trial", "end_trial", "end_sweep", "set_note"]
    state = json.loads((tmp_path / "r" / "ctl" / STATE_FILE).read_text())
    assert state["parent_run_id"] == "parent" and state["drivers"] == [{"began": 1000.0, "held_usd": None}]
