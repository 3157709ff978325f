"""The sweep's Tune callback: Tune's trial lifecycle, mirrored into MLflow, the progress lines,
the circuit breaker, OOM bounds, verdicts and each trial's final status."""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import cloudpickle
import ray
from ray import tune

from sweeps.results.contention import CONTENDED_TAG, contended
from sweeps.results.money import trial_usd
from sweeps.results.outcome import MEASURED, REPLICATE_TAG, TrialRow, end_status
from sweeps.results.sol import SpeedOfLight
from sweeps.results.verdict import verdict
from sweeps.search.live_state import SearchState, oom_label
from sweeps.search.plan import SIZE, size_changes
from sweeps.search.searcher import knobs_of
from sweeps.search.trials import fixed_knobs, resolve_trial, trial_params
from sweeps.service.breaker import FailureStreak
from sweeps.service.failures import failure_of
from sweeps.service.progress import Costs, TrialCost, conditions, progress_line
from sweeps.service.trial import HALT_KEY, trace_dir
from sweeps.spec import SweepSpec
from sweeps.tracking import SweepTracker
from trainables.contract import DEVICE_PREFIX, PROGRESS_PREFIX, STEPS, TRIAL_USD


def _trial_error(trial: Any) -> BaseException | None:
    """The exception an errored trial raised. Tune writes it to the trial's local dir first
    and syncs it to storage later, so read the local copy Tune just wrote in this process."""
    local = getattr(trial, "pickled_error_file", None)
    if local and os.path.isfile(local):
        with open(local, "rb") as f:
            error = cloudpickle.load(f)
        return error if isinstance(error, BaseException) else None
    return trial.get_pickled_error()  # type: ignore[no-any-return]


# The running sweep's callback (`live`). Tune pickles its RunConfig into `tuner.pkl`; a callback pickles
# as a reference to the live one and unpickles (same process, or a resumed driver that made a new one) as
# it, never as a stale copy; outside a sweep (e.g. reading tuner.pkl) as an inert callback.
_LIVE: ContextVar[SweepCallback | None] = ContextVar("sweeps_live_callback", default=None)


def _live_callback() -> tune.Callback:
    return _LIVE.get() or tune.Callback()


@contextlib.contextmanager
def live(callback: SweepCallback) -> Iterator[SweepCallback]:
    """Make `callback` the one every pickled copy of a sweep callback turns into, while inside."""
    token = _LIVE.set(callback)
    try:
        yield callback
    finally:
        _LIVE.reset(token)


class SweepCallback(tune.Callback):
    """Mirrors Tune's trial lifecycle into MLflow and prints concise progress lines."""

    def __init__(self, spec: SweepSpec, tracker: SweepTracker, echo: Callable[[str], None], state: SearchState,
                 rows: list[TrialRow] | None = None) -> None:
        self.spec, self.tracker, self.echo, self.state = spec, tracker, echo, state
        self.rows: dict[str, TrialRow] = {r.trial_id: r for r in rows or []}
        self.t0 = time.monotonic()
        self._streak = FailureStreak(spec.budget.max_identical_failures)
        self._started: set[str] = set()  # by this driver; Tune ends each one unless it stops early
        self._ended: set[str] = set()
        self._began: dict[str, float] = {}  # monotonic time each trial started (this driver)
        self._cost: dict[str, float] = {}  # each ended trial's own wall time, start to end: what the ETA uses (`Costs`)
        self._prior_usd: dict[str, float] = {}  # what a trial run again (after a resume) cost in its earlier attempts
        self.charged: dict[str, float] = {}  # what each trial this driver ran cost in it (`charge`)
        self.halted = ""  # why the sweep halts: a trial's HALT_KINDS, or a wait over budget.max_queue_s
        self.queue: Any = None  # the warm pool's queue, when the sweep has one
        self.waits: Any = None  # the sweep's wait watcher (sweeps.service.waits), whose `over` halts the sweep
        self.trials_dir = ""  # where the trials keep their checkpoints and traces (the controller sets it)
        self.speed_of_light: SpeedOfLight | None = None  # measured limits to score finished trials against
        for row in self.rows.values():  # a resumed sweep keeps what it learnt about memory
            if row.status == "oom":
                state.record_oom(knobs_of(spec, row))

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_live_callback, ())

    @property
    def tripped(self) -> str:
        return self.state.tripped

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        params = trial_params(self.spec, resolve_trial(self.spec, dict(trial.config)))
        row = self.rows.get(trial.trial_id)
        if row is None:
            row = TrialRow(trial.trial_id, max((r.number for r in self.rows.values()), default=0) + 1, params)
            self.rows[trial.trial_id] = row
        row.status, row.reason = "running", ""  # a resumed trial starts over in the same MLflow run
        prior = row.metrics.get(TRIAL_USD)
        if isinstance(prior, (int, float)):  # its interrupted attempt cost money too: its cost adds up
            self._prior_usd[trial.trial_id] = float(prior)
        self._started.add(trial.trial_id)
        self._began[trial.trial_id] = time.time()  # wall clock: compared with the queue's (same node)
        self.tracker.start_trial(trial.trial_id, row.number, params)
        row.run_id = self.tracker.run_id(trial.trial_id)
        shown = ", ".join(f"{k}={v}" for k, v in trial.config.items())
        first = self.state.replicate_of.get(trial.trial_id)
        if first in self.rows:
            row.replicate_of = self.rows[first].number
        again = f" (a replicate of trial {row.replicate_of})" if row.replicate_of else ""
        self.echo(f"[trial {row.number}/{self.spec.budget.num_trials}] {trial.trial_id} started{again}: {shown}")

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any) -> None:
        row = self.rows[trial.trial_id]
        if result.get(HALT_KEY):
            self._halt(row, str(result[HALT_KEY]))
            return
        row.metrics.update({k: v for k, v in result.items() if "/" in k})
        self.tracker.log_result(trial.trial_id, result, step=int(result.get(STEPS, iteration)))

    def _halt(self, row: TrialRow, why: str) -> None:
        row.reason = why
        self.halt(f"trial {row.number} {why}")

    def halt(self, why: str) -> None:
        """Stop the sweep, resumable: the trials still running run again when it is resumed."""
        if self.halted:
            return
        self.halted = why
        self.echo(f"HALTING the sweep: {why}. Finished trials are kept; trials still running "
                  "run again when the sweep is resumed.")
        if not _interrupt_tune():  # not Tune's main thread: stop every trial instead (they end as stopped)
            self.state.tripped = f"halted: {self.halted}"

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        # budget.max_queue_s: once trials are out (a halt before any would end the sweep as if finished)
        over = getattr(self.waits, "over", "")
        if over and self.unfinished():
            self.halt(over)

    def started(self) -> set[str]:
        """Trials this driver started (a resumed sweep's earlier trials are not among them)."""
        return set(self._started)

    def unfinished(self) -> set[str]:
        """Trials this driver started that Tune never ended: it stopped early (a halt, Ctrl+C)."""
        return self._started - self._ended

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        row = self.rows[trial.trial_id]
        status, reason, missing = end_status(self.spec, row.metrics, self.tripped, self._out_of_time())
        if missing:
            self._unranked(row, missing)
        else:
            self._finish(trial.trial_id, status, reason)

    def _unranked(self, row: TrialRow, missing: list[str]) -> None:
        """A finished trial without the objective's metrics cannot be ranked, and the next trials of
        the same trainable will not report them either: stop the sweep now and say what is there."""
        reported = sorted(k for k, v in row.metrics.items() if "/" in k and not k.startswith((PROGRESS_PREFIX, DEVICE_PREFIX))
                          and isinstance(v, (int, float)))
        reason = (f"the trial reported no {', '.join(missing)}, so no trial can be ranked; it reported: "
                  f"{', '.join(reported)}. Name one of those in objective (metric or constraints), or make the "
                  "trainable report it (eval_fn for eval/<name>)")
        self._finish(row.trial_id, "config", reason)
        if not self.tripped:
            self.state.tripped = f"objective metric not reported: {reason}"
            self.echo(f"STOPPING the sweep: {reason}")

    def _out_of_time(self) -> bool:
        limit = self.spec.budget.time_budget_s
        return limit is not None and time.monotonic() - self.t0 >= limit * 0.95

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        kind, reason = failure_of(_trial_error(trial))
        self.state.failures[trial.trial_id] = kind  # the searcher learns from it (infeasible or not)
        self._finish(trial.trial_id, kind, reason)

    def charge(self, trial_id: str) -> None:
        """What the trial held, from its start in this driver to its end (or now, for one interrupted), at its
        price, added to what its earlier attempts cost: `cost/trial_usd` (a failed trial costs money too)."""
        if trial_id not in self._began:
            return
        row = self.rows[trial_id]
        began, ended = self._pool_span(trial_id)
        self._cost[trial_id] = (ended or time.time()) - max(self._began[trial_id], began or 0.0)
        spent = trial_usd(self.spec, row.params, self._cost[trial_id])
        if spent:
            self.charged[trial_id] = spent[TRIAL_USD]
            spent[TRIAL_USD] += self._prior_usd.get(trial_id, 0.0)
            row.metrics.update(spent)
            self.tracker.log_result(trial_id, spent, step=int(row.metrics.get(STEPS, 0)))

    def _finish(self, trial_id: str, status: str, reason: str) -> None:
        self._ended.add(trial_id)
        row = self.rows[trial_id]
        self.charge(trial_id)
        if self.queue is not None:  # Tune ended it: a warm group still running (or queueing) it stops
            self.queue.cancel.remote(trial_id)
        row.status, row.reason = status, reason
        tags = {REPLICATE_TAG: str(row.replicate_of)} if row.replicate_of else {}
        if status in MEASURED:
            sol = self.speed_of_light.score_trial(row.metrics, row.params) if self.speed_of_light else {}
            if sol:  # against this hardware's measured peaks: logged like the trial's own metrics
                row.metrics.update(sol)
                self.tracker.log_result(trial_id, sol, step=int(row.metrics.get(STEPS, 0)))
            v = verdict(row.metrics, row.params)
            row.verdict = str(v)
            tags |= {"sweep.verdict": v.name, "sweep.verdict_reason": v.reason}
            shared = contended(row.metrics)
            if shared:  # measured while other work used its node or GPUs: said on its run, in its verdict
                tags[CONTENDED_TAG] = shared
        traces = trace_dir(self.trials_dir, f"{self.spec.name}-{trial_id}") if self.trials_dir else ""
        if traces and Path(traces).is_dir():  # each rank's trace of its last warm-up steps (trainables.trace)
            self.tracker.log_files(trial_id, traces, "trace")
        self.tracker.end_trial(trial_id, status in (*MEASURED, "pruned"), status, reason, tags)
        row.run_id = row.run_id or self.tracker.run_id(trial_id)
        knobs = knobs_of(self.spec, row) if status == "oom" else {}
        if knobs:  # before the progress line: the grid points it rules out are no longer to come
            self.state.record_oom(knobs)
        self.echo(self._progress(row))
        self._count_failure(status, reason)
        if knobs:
            self.echo(f"out of memory at batch_size={knobs['batch_size']} with {oom_label(knobs)}: "
                      "no batch this large or larger will be tried with those settings")

    def _pool_span(self, trial_id: str) -> tuple[float | None, float | None]:
        """When a warm group's trial began and ended costing (`Queue.span`; nothing without a pool): the
        first trial's Tune actor and group start-up, and a final report's way on to this driver, are the
        sweep's, so the ETA leaves them out."""
        if self.queue is None:
            return None, None
        try:
            began, ended = ray.get(self.queue.span.remote(trial_id), timeout=10)
            return began, ended
        except Exception:  # noqa: BLE001 - only the ETA depends on it
            return None, None

    def _count_failure(self, status: str, reason: str) -> None:
        """Circuit breaker: the same error N times in a row will not fix itself (e.g. an ImportError)."""
        why = self._streak.add(status, reason)
        if why and not self.tripped:
            self.state.tripped = why
            self.echo(f"STOPPING the sweep: {why}. Fix that, then run the sweep again.")

    def _progress(self, row: TrialRow) -> str:
        now = time.time()
        ended = [TrialCost.of(self._precision(k), cost, self.rows[k].metrics) for k, cost in self._cost.items()]
        running = [(self._precision(k), now - t) for k, t in self._began.items() if k not in self._ended]
        slow = self.speed_of_light.emulated_precisions() \
            if self.speed_of_light is not None and not self.spec.scaling.use_gpu else frozenset()
        skipped = [str(k.get("precision")) for k in self.state.grid_skips(fixed_knobs(self.spec))]
        group_s, restarts = self._restarts()
        # the conditions now: what the running trials' latest reports measured (None where none did yet)
        shared = [c for k in self._began if k not in self._ended if (c := conditions(self.rows[k].metrics)) is not None]
        return progress_line(self.spec, row, list(self.rows.values()), time.monotonic() - self.t0,
                             Costs(ended, running, slow, skipped, group_s, restarts, self.state.space_left,
                                   any(shared) if shared else None))

    def _restarts(self) -> tuple[float, float]:
        """(what a warm group's start cost on this cluster, the restarts the trials to come are expected to
        need): a restart's measured start where one was made, else the first group's."""
        if self.queue is None:
            return 0.0, 0.0
        try:
            starts = ray.get(self.queue.group_starts.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - only the ETA depends on it
            return 0.0, 0.0
        took = [s for _, s, why in starts if why != "first"] or [s for _, s, _ in starts]
        if not took:
            return 0.0, 0.0
        n = max(0, self.spec.budget.num_trials - len(self.rows))
        state = self.state
        if state.runs is not None:
            return statistics.fmean(took), state.runs.expected_restarts(n)
        latest = max(self.rows.values(), key=lambda r: r.number, default=None)
        current = int(latest.params["num_workers"]) if latest is not None and "num_workers" in latest.params else None
        sizes = [int(p[SIZE]) for p in state.grid_left if SIZE in p][:n]
        return statistics.fmean(took), float(size_changes(current, sizes))

    def _precision(self, trial_id: str) -> str:
        return str(self.rows[trial_id].params.get("precision"))



def _interrupt_tune() -> bool:
    """End the Tune run as Ctrl+C does: Tune saves its state with the running trials unfinished,
    and `Tuner.restore` runs them again. Tune listens for SIGINT only when it runs in the main
    thread, where it replaces Python's default handler; anywhere else (or with the default handler
    still in place) there is nobody to tell, and the caller stops the trials another way."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, signal.SIG_DFL, signal.SIG_IGN, None):
        return False
    signal.raise_signal(signal.SIGINT)
    return True
