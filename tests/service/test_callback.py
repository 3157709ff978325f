"""The sweep's Tune callback on its own (`sweeps/service/callback.py`).

Tune's hooks reach the live controller with the trial's id, and a pickled callback comes back as the live
controller's; halting interrupts Tune only where Tune listens (`sweeps.service.tuning.interrupt_tune`). The
controller's own work: tests/service/test_controller.py."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cloudpickle
from ray import tune

from sweeps.service.callback import SweepCallback, live


class Recorder:
    """A controller that records what its callback hands it."""

    def __init__(self) -> None:
        self.callback = SweepCallback(self)  # type: ignore[arg-type]
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append((name, *args))


def test_tunes_hooks_reach_the_controller_with_the_trials_id_and_its_stored_error(tmp_path: Path) -> None:
    controller = Recorder()
    cb = controller.callback
    error = tmp_path / "error.pkl"
    error.write_bytes(cloudpickle.dumps(MemoryError("rank 0 ran out")))
    trial = SimpleNamespace(trial_id="t1", config={"lr": 0.005}, pickled_error_file=str(error))
    cb.on_trial_start(0, [], trial)
    cb.on_trial_result(3, [], trial, {"loss/val": 1.5})
    cb.on_step_end(3, [])
    cb.on_trial_complete(4, [], trial)
    cb.on_trial_error(4, [], trial)  # Tune's copy of the error, written in this process, is read back
    stored = SimpleNamespace(trial_id="t2", get_pickled_error=lambda: None)  # none stored locally: Tune's own
    cb.on_trial_error(5, [], stored)
    got = controller.calls
    assert got[:4] == [("trial_started", "t1", {"lr": 0.005}), ("trial_reported", "t1", {"loss/val": 1.5}, 3),
                       ("step_ended",), ("trial_completed", "t1")]
    assert got[4][:2] == ("trial_errored", "t1") and isinstance(got[4][2], MemoryError)
    assert got[5] == ("trial_errored", "t2", None)


def test_a_pickled_callback_comes_back_as_the_live_controllers_or_inert_outside_a_sweep() -> None:
    # Tune writes its RunConfig, callback included, into tuner.pkl: a reference, never a stale copy
    older, running = Recorder(), Recorder()
    with live(running):  # type: ignore[arg-type]
        assert pickle.loads(pickle.dumps(running.callback)) is running.callback
        assert pickle.loads(pickle.dumps(older.callback)) is running.callback  # a resumed driver's copy of an older one
    inert = pickle.loads(pickle.dumps(running.callback))
    assert type(inert) is tune.Callback  # no live sweep (e.g. reading tuner.pkl): an inert callback


def test_halting_interrupts_tune_through_its_sigint_handler_only_when_one_listens() -> None:
    import signal

    from sweeps.service.tuning import interrupt_tune

    heard: list[int] = []
    # a shell's background job starts with SIGINT ignored: set each handler the test needs explicitly
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert interrupt_tune() is False  # no Tune listening: nothing is raised, the caller stops trials instead
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        assert interrupt_tune() is False
        signal.signal(signal.SIGINT, lambda signum, frame: heard.append(signum))
        assert interrupt_tune() is True and heard == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)
