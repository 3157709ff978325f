"""The sweep callback on its own, fed Tune's lifecycle calls: how a trial's end is classified."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from sweeps.search.live_state import SearchState
from sweeps.service.callback import SweepCallback, live
from sweeps.spec import parse_spec
from sweeps.tracking import SweepTracker

SPEC = """\
name: cb
trainable: {name: mlp-tabular}
space: {lr: {type: float, low: 1.0e-3, high: 1.0e-2}}
objective: {metric: throughput/samples_per_s, mode: max, constraints: [{metric: loss/val, max: 2.0}]}
search: {early_stopping: {grace_steps: 2}}
budget: {num_trials: 3, num_steps: 10}
"""


def _callback(tmp_path: Path, text: str) -> tuple[SweepCallback, SweepTracker, list[str]]:
    """A sweep callback over a real MLflow store, as the sweep's controller builds it."""
    tracker = SweepTracker(f"sqlite:///{tmp_path / 'm.db'}", "cb")
    tracker.start_sweep("cb", "", text, {})
    lines: list[str] = []
    return SweepCallback(parse_spec(text), tracker, lines.append, SearchState()), tracker, lines


def test_final_infeasible_and_pruned_trials(tmp_path: Path) -> None:
    spec = parse_spec(SPEC)
    cb, tracker, lines = _callback(tmp_path, SPEC)
    for tid, result in (
        ("ok", {"throughput/samples_per_s": 10.0, "loss/val": 1.5, "progress/steps": 10, "progress/final": 1}),
        ("bad", {"throughput/samples_per_s": 20.0, "loss/val": 3.5, "progress/steps": 10, "progress/final": 1}),
        ("slow", {"throughput/samples_per_s": 1.0, "progress/steps": 2, "progress/final": 0}),
    ):
        trial = SimpleNamespace(trial_id=tid, config={"lr": 0.005})
        cb.on_trial_start(0, [], trial)
        cb.on_trial_result(1, [], trial, result)
        cb.on_trial_complete(1, [], trial)
    rows = cb.rows
    assert (rows["ok"].status, rows["bad"].status, rows["slow"].status) == ("ok", "infeasible", "pruned")
    assert rows["bad"].reason == "loss/val=3.5 breaks loss/val <= 2" and "INFEASIBLE" in lines[3]
    assert "stopped by ASHA after 2 measured steps" in rows["slow"].reason
    run = tracker.client.get_run(rows["bad"].run_id)
    assert run.data.tags["sweep.status"] == "infeasible" and run.info.status == "FINISHED"
    # a callback pickles as a reference (Tune writes it into tuner.pkl) and comes back as the live one
    import pickle

    cb2 = SweepCallback(spec, tracker, lines.append, SearchState())
    with live(cb2):
        assert pickle.loads(pickle.dumps(cb2)) is cb2
        assert pickle.loads(pickle.dumps(cb)) is cb2  # (a resumed driver's copy of an older one: the live one)
    assert type(pickle.loads(pickle.dumps(cb2))) is not SweepCallback  # no live sweep: an inert callback


def test_an_objective_no_trial_reports_stops_the_sweep_listing_what_was_reported(tmp_path: Path) -> None:
    text = SPEC.replace("constraints: [{metric: loss/val, max: 2.0}]", "constraints: [{metric: eval/accuracy, min: 0.9}]")
    text = text.replace("search: {early_stopping: {grace_steps: 2}}\n", "")
    cb, _, lines = _callback(tmp_path, text)
    trial = SimpleNamespace(trial_id="t1", config={"lr": 0.005})
    cb.on_trial_start(0, [], trial)
    cb.on_trial_result(1, [], trial, {"throughput/samples_per_s": 10.0, "loss/val": 1.5, "progress/steps": 10,
                                      "progress/final": 1})
    cb.on_trial_complete(1, [], trial)
    tripped = cb.tripped
    row = cb.rows["t1"]
    assert row.status == "config"
    assert "the trial reported no eval/accuracy" in row.reason and "it reported: loss/val, throughput/samples_per_s" in row.reason
    assert tripped.startswith("objective metric not reported") and any("STOPPING the sweep" in line for line in lines)


def test_halting_interrupts_tune_through_its_sigint_handler_only_when_one_listens() -> None:
    import signal

    from sweeps.service.callback import _interrupt_tune

    heard: list[int] = []
    # a shell's background job starts with SIGINT ignored: set each handler the test needs explicitly
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert _interrupt_tune() is False  # no Tune listening: nothing is raised, the caller stops trials instead
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        assert _interrupt_tune() is False
        signal.signal(signal.SIGINT, lambda signum, frame: heard.append(signum))
        assert _interrupt_tune() is True and heard == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)
