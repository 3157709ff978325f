"""Tune's callback for a sweep, forwarding Tune's trial lifecycle to the sweep's controller.

The controller (`sweeps.service.controller.SweepController`) keeps the sweep's state and ends each trial."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import cloudpickle
from ray import tune

if TYPE_CHECKING:
    from sweeps.service.controller import SweepController

# The running sweep's controller (`live`). Tune pickles its RunConfig into `tuner.pkl`; a callback pickles as
# a reference to the live controller's and unpickles (same process, or a resumed driver that made a new one)
# as it, never as a stale copy; outside a sweep (e.g. reading tuner.pkl) as an inert callback.
_LIVE: ContextVar[SweepController | None] = ContextVar("sweeps_live_controller", default=None)


def _live_callback() -> tune.Callback:
    return controller.callback if (controller := _LIVE.get()) is not None else tune.Callback()


@contextlib.contextmanager
def live(controller: SweepController) -> Iterator[SweepController]:
    """Make `controller`'s callback the one every pickled copy of a sweep callback turns into, while inside."""
    token = _LIVE.set(controller)
    try:
        yield controller
    finally:
        _LIVE.reset(token)


class SweepCallback(tune.Callback):
    """Tune's hooks, handed to `controller` with the trial's id (and config, result or error)."""

    def __init__(self, controller: SweepController) -> None:
        self.controller = controller

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_live_callback, ())

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.controller.trial_started(trial.trial_id, dict(trial.config))

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any) -> None:
        self.controller.trial_reported(trial.trial_id, result, iteration)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.controller.trial_completed(trial.trial_id)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.controller.trial_errored(trial.trial_id, _trial_error(trial))

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        self.controller.step_ended()


def _trial_error(trial: Any) -> BaseException | None:
    """The exception an errored trial raised. Tune writes it to the trial's local dir first
    and syncs it to storage later, so read the local copy Tune just wrote in this process."""
    local = getattr(trial, "pickled_error_file", None)
    if local and os.path.isfile(local):
        with open(local, "rb") as f:
            error = cloudpickle.load(f)
        return error if isinstance(error, BaseException) else None
    return trial.get_pickled_error()  # type: ignore[no-any-return]

