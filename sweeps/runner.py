"""Run a sweep: Ray Tune + seeded OptunaSearch over a driver function that launches one
Ray Train `TorchTrainer` per trial (the Ray 2.60 pattern), tracked in MLflow."""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import cloudpickle
import ray
from ray import tune

from sweeps.failures import failure_of, signature
from sweeps.outcome import MEASURED, NOT_FAILED, UNFINISHED, SweepOutcome, TrialRow
from sweeps.pool import WarmPool
from sweeps.report import rows_from_runs
from sweeps.search import make_scheduler, make_searcher, record_oom, release, shared
from sweeps.space import resolve_trial, trial_params
from sweeps.spec import PARAMS_PREFIX, SpecError, SpecProblem, SweepSpec
from sweeps.state import SweepState, experiment_dir, resume_command
from sweeps.tracking import SweepTracker
from sweeps.trial import HALT_KEY, run_trial
from sweeps.verdict import verdict
from trainables.contract import FINAL, LOOP_S, STEPS

logger = logging.getLogger(__name__)

# The driver only launches and watches the Train workers: it holds no CPU, so a 2-core
# machine can run a 2-worker trial. Ray refuses an empty bundle; 1 byte of memory is not.
_DRIVER_RESOURCES = tune.PlacementGroupFactory([{"CPU": 0, "memory": 1}])


def _knobs(spec: SweepSpec, row: TrialRow) -> dict[str, Any]:
    """A trial's knobs as the searcher names them: its logged params carry the trainable's own as
    `workload.<name>`; the space names them `params.<name>`."""
    own = {f"{PARAMS_PREFIX}{n}": row.params[f"workload.{n}"] for n in spec.space.params if f"workload.{n}" in row.params}
    return {**spec.space.fixed(), **row.params, **own}


class _Breaker(tune.Stopper):
    """Stops every trial, and starts no new one, once the sweep callback's breaker trips."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return bool(shared(self.token).tripped)


def _trial_error(trial: Any) -> BaseException | None:
    """The exception an errored trial raised. Tune writes it to the trial's local dir first
    and syncs it to storage later, so read the local copy Tune just wrote in this process."""
    local = getattr(trial, "pickled_error_file", None)
    if local and os.path.isfile(local):
        with open(local, "rb") as f:
            error = cloudpickle.load(f)
        return error if isinstance(error, BaseException) else None
    return trial.get_pickled_error()  # type: ignore[no-any-return]


# The live callback of each running sweep, by token. Tune pickles its RunConfig into
# `tuner.pkl`; a callback pickles as its token and unpickles (same process, or a resumed
# driver that registered a new one) as the live callback, never as a stale copy.
_LIVE: dict[str, _SweepCallback] = {}


def _live_callback(token: str) -> tune.Callback:
    return _LIVE.get(token) or tune.Callback()  # outside a sweep (e.g. inspecting tuner.pkl): inert


class _SweepCallback(tune.Callback):
    """Mirrors Tune's trial lifecycle into MLflow and prints concise progress lines."""

    def __init__(self, spec: SweepSpec, tracker: SweepTracker, echo: Callable[[str], None], token: str,
                 rows: list[TrialRow] | None = None) -> None:
        self.spec, self.tracker, self.echo, self.token = spec, tracker, echo, token
        self.rows: dict[str, TrialRow] = {r.trial_id: r for r in rows or []}
        self.t0 = time.monotonic()
        self._same_failures: list[tuple[str, str]] = []
        self._started: set[str] = set()  # by this driver; Tune ends each one unless it stops early
        self._ended: set[str] = set()
        self.halted = ""  # why a trial asked to halt the sweep (HALT_KINDS)
        for row in self.rows.values():  # a resumed sweep keeps what it learnt about memory
            if row.status == "oom":
                record_oom(token, _knobs(spec, row))
        _LIVE[token] = self

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_live_callback, (self.token,))

    @property
    def tripped(self) -> str:
        return shared(self.token).tripped

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        params = trial_params(self.spec, resolve_trial(self.spec, dict(trial.config)))
        row = self.rows.get(trial.trial_id)
        if row is None:
            row = TrialRow(trial.trial_id, max((r.number for r in self.rows.values()), default=0) + 1, params)
            self.rows[trial.trial_id] = row
        row.status, row.reason = "running", ""  # a resumed trial starts over in the same MLflow run
        self._started.add(trial.trial_id)
        self.tracker.trial_started(trial.trial_id, row.number, params)
        row.run_id = self.tracker.run_id(trial.trial_id)
        shown = ", ".join(f"{k}={v}" for k, v in trial.config.items())
        self.echo(f"[trial {row.number}/{self.spec.budget.num_trials}] {trial.trial_id} started: {shown}")

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any) -> None:
        row = self.rows[trial.trial_id]
        if result.get(HALT_KEY):
            self._halt(row, str(result[HALT_KEY]))
            return
        row.metrics.update({k: v for k, v in result.items() if "/" in k})
        self.tracker.trial_result(trial.trial_id, result, step=int(result.get(STEPS, iteration)))

    def _halt(self, row: TrialRow, why: str) -> None:
        row.reason = why
        if self.halted:
            return
        self.halted = f"trial {row.number} {why}"
        self.echo(f"HALTING the sweep: trial {row.number} {why}. Finished trials are kept; trials still running "
                  "run again when the sweep is resumed.")
        if not _interrupt_tune():  # not Tune's main thread: stop every trial instead (they end as stopped)
            shared(self.token).tripped = f"halted: {self.halted}"

    def started(self) -> set[str]:
        """Trials this driver started (a resumed sweep's earlier trials are not among them)."""
        return set(self._started)

    def unfinished(self) -> set[str]:
        """Trials this driver started that Tune never ended: it stopped early (a halt, Ctrl+C)."""
        return self._started - self._ended

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        row = self.rows[trial.trial_id]
        obj = self.spec.objective
        missing = [m for m in (*obj.metrics, *(c.metric for c in obj.constraints)) if m not in row.metrics]
        if row.metrics.get(FINAL) == 1 and missing:
            self._unranked(row, missing)
        elif row.metrics.get(FINAL) == 1:
            broken = [f"{c.metric}={row.metrics.get(c.metric)} breaks {c}" for c in obj.constraints
                      if c.violation(row.metrics.get(c.metric)) > 0]
            self._finish(trial.trial_id, "infeasible" if broken else "ok", "; ".join(broken))
        elif self.tripped:
            self._finish(trial.trial_id, "stopped", f"stopped early: {self.tripped}")
        elif self._out_of_time():
            self._finish(trial.trial_id, "stopped", f"the sweep's time budget ({self.spec.budget.time_budget_s:g}s) ran out")
        elif self.spec.search.early_stopping is not None:
            steps = row.metrics.get(STEPS)
            self._finish(trial.trial_id, "pruned", f"stopped by ASHA after {steps} measured steps: "
                         f"{obj.primary}={row.metrics.get(obj.primary, float('nan')):.4g} was behind the others")
        else:
            self._finish(trial.trial_id, "stopped", "ended without its final report")

    def _unranked(self, row: TrialRow, missing: list[str]) -> None:
        """A finished trial without the objective's metrics cannot be ranked, and the next trials of
        the same trainable will not report them either: stop the sweep now and say what is there."""
        reported = sorted(k for k, v in row.metrics.items() if "/" in k and not k.startswith(("progress/", "device/"))
                          and isinstance(v, (int, float)))
        reason = (f"the trial reported no {', '.join(missing)}, so no trial can be ranked; it reported: "
                  f"{', '.join(reported)}. Name one of those in objective (metric or constraints), or make the "
                  "trainable report it (eval_fn for eval/<name>)")
        self._finish(row.trial_id, "config", reason)
        if not self.tripped:
            shared(self.token).tripped = f"objective metric not reported: {reason}"
            self.echo(f"STOPPING the sweep: {reason}")

    def _out_of_time(self) -> bool:
        limit = self.spec.budget.time_budget_s
        return limit is not None and time.monotonic() - self.t0 >= limit * 0.95

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        kind, reason = failure_of(_trial_error(trial))
        shared(self.token).failures[trial.trial_id] = kind  # the searcher learns from it (infeasible or not)
        self._finish(trial.trial_id, kind, reason)

    def _finish(self, trial_id: str, status: str, reason: str) -> None:
        self._ended.add(trial_id)
        row = self.rows[trial_id]
        row.status, row.reason = status, reason
        tags = {}
        if status in MEASURED:
            v = verdict(row.metrics, row.params)
            row.verdict = str(v)
            tags = {"sweep.verdict": v.name, "sweep.verdict_reason": v.reason}
        self.tracker.trial_ended(trial_id, status in (*MEASURED, "pruned"), status, reason, tags)
        row.run_id = row.run_id or self.tracker.run_id(trial_id)
        self.echo(self._progress(row))
        self._count_failure(status, reason)
        if status == "oom":
            knobs = _knobs(self.spec, row)
            record_oom(self.token, knobs)
            self.echo(f"out of memory at batch_size={knobs['batch_size']} ({knobs['precision']}): "
                      "no larger batch will be tried")

    def _count_failure(self, status: str, reason: str) -> None:
        """Circuit breaker: the same error N times in a row will not fix itself (e.g. an ImportError)."""
        if status in NOT_FAILED:
            self._same_failures = []
            return
        limit = self.spec.budget.max_identical_failures
        failure = signature(status, reason)
        if self._same_failures and self._same_failures[-1] != failure:
            self._same_failures = []
        self._same_failures.append(failure)
        if limit and len(self._same_failures) >= limit and not self.tripped:
            shared(self.token).tripped = f"{limit} trials in a row failed the same way ({status}: {reason})"
            self.echo(f"STOPPING the sweep: {self.tripped}. Fix that, then run the sweep again.")

    def _progress(self, row: TrialRow) -> str:
        rows = list(self.rows.values())
        done = [r for r in rows if r.status not in UNFINISHED]
        failed = [r for r in done if r.status not in NOT_FAILED]
        metric, mode = self.spec.objective.primary, self.spec.objective.primary_mode
        if row.status in MEASURED:
            what = f"{metric}={row.metrics.get(metric, float('nan')):.4g} [{row.verdict.split(':')[0]}]"
            what += f" INFEASIBLE: {row.reason}" if row.status == "infeasible" else ""
        else:
            what = f"{'FAILED' if row in failed else row.status.upper()} ({row.status}: {row.reason})"
        elapsed = time.monotonic() - self.t0
        total = self.spec.budget.num_trials
        eta = elapsed / len(done) * (total - len(done)) if done else math.nan
        ranked = [r for r in done if r.status == "ok" and metric in r.metrics]
        best = ""
        if ranked:
            b = (max if mode == "max" else min)(ranked, key=lambda r: r.metrics[metric])
            best = f" | best {metric}={b.metrics[metric]:.4g} (trial {b.number})"
        return (
            f"[trial {row.number}/{total}] {what} | done {len(done)}/{total}, running {len(rows) - len(done)}, "
            f"failed {len(failed)}{best} | elapsed {elapsed:.0f}s, ETA {eta:.0f}s"
        )


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


def _concurrency_note(spec: SweepSpec, resources: dict[str, float]) -> str:
    """How many trials fit the cluster at once (all workers of a trial start together)."""
    need = spec.per_trial()
    fits = min(int(resources.get(k, 0) // v) for k, v in need.items() if v > 0)
    asked = spec.budget.max_concurrent_trials
    loaders = spec.max_loader_workers()
    also = f", with {loaders} loader worker(s) per rank" if loaders and spec.scaling.cpus_per_loader_worker else ""
    note = (f"cluster fits {fits} trial(s) at once ({need['CPU']:g} CPU, {need['GPU']:g} GPU each at most{also}); "
            f"running {asked}")
    if fits == 0:
        return note + " — WARNING: not even one trial fits now; trials wait for the autoscaler or fail"
    if asked > fits:
        return note + f" — WARNING: only {fits} fit, the rest wait; set budget.max_concurrent_trials: {fits}"
    return note


def refuse_if_never_fits(spec: SweepSpec, resources: dict[str, float]) -> None:
    """On a fixed cluster (a local one), a trial that needs more than there is would wait forever."""
    sc, need, loaders = spec.scaling, spec.per_trial(), spec.max_loader_workers()
    problems = []
    have_cpu, have_gpu = resources.get("CPU", 0), resources.get("GPU", 0)
    if need["CPU"] > have_cpu and not (loaders and sc.cpus_per_loader_worker):
        problems.append(SpecProblem("scaling", f"a trial needs num_workers x cpus_per_worker = {sc.num_workers} x "
                                    f"{sc.cpus_per_worker} CPUs but this cluster has {have_cpu:g}; lower them or "
                                    "run on a bigger cluster (ray job submit)"))
    elif need["CPU"] > have_cpu:
        problems.append(SpecProblem("scaling", f"the largest trial needs num_workers x (cpus_per_worker + "
                                    f"num_dataloader_workers x cpus_per_loader_worker) = {sc.num_workers} x "
                                    f"({sc.cpus_per_worker} + {loaders} x {sc.cpus_per_loader_worker:g}) = "
                                    f"{need['CPU']:g} CPUs but this cluster has {have_cpu:g}; search fewer loader "
                                    "workers, or on a small machine declare a smaller share "
                                    "(scaling.cpus_per_loader_worker: 0.5, or 0 to let loaders share their rank's cores)"))
    if need["GPU"] > have_gpu:
        problems.append(SpecProblem("scaling", f"a trial needs {need['GPU']:g} GPUs but this "
                                    f"cluster has {have_gpu:g}; set use_gpu: false or run where GPUs are"))
    if problems:
        raise SpecError(f"sweep {spec.name}", problems)


# Ray Train V2 settings that cut its per-trial start-up and teardown on a local machine (about 3 s
# of ~14 s per trial on 2 vCPU, benchmarks/sweep_overhead.py): no preemption-watcher actor (there
# is nothing to preempt locally), no metrics callbacks, and the controller polls its workers every
# 0.5 s instead of 2 s, so it notices the end of training sooner. A user's own values win.
LEAN_TRAIN_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_TRAIN_METRICS_ENABLED": "0",
                  "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}


# Tune hands the next trial to the finished trial's actor (same resources: always here) instead of
# starting a new process: ~1 s less per trial on 2 vCPU (benchmarks/sweep_overhead.py). The Train
# controller and workers are still new for every trial.
REUSE_TRIAL_ACTORS = True


def _local_runtime_env() -> dict[str, Any] | None:
    """Outside a Ray job, let workers import user trainables from the current directory, as
    `ray job submit --working-dir .` does inside one, and start Ray Train lean."""
    if os.environ.get("RAY_ADDRESS") or os.environ.get("RAY_JOB_ID"):
        return None
    path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    lean = {k: os.environ.get(k, v) for k, v in LEAN_TRAIN_ENV.items()}
    return {"env_vars": {"PYTHONPATH": path, **lean}}


def echo_stdout(line: str) -> None:
    print(line, flush=True)


def run_sweep(spec: SweepSpec, spec_text: str, echo: Callable[[str], None] = echo_stdout,
              restart: bool = False) -> SweepOutcome:
    """Run the sweep on the Ray cluster `ray.init()` finds (or a new local one). A sweep of the
    same name and spec already in `storage_path` is resumed; another spec under that name is
    refused (`SweepExists`); `restart` moves the old one aside and starts afresh."""
    state = SweepState.find(spec, spec_text, restart=restart, echo=echo)
    # Before Ray starts: a dead MLflow server fails here, in seconds (SweepTracker checks it).
    tracker = SweepTracker(spec.tracking.resolved_uri(), spec.tracking.experiment or spec.name,
                           experiment_dir(spec) / "mlflow-pending.jsonl")
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(runtime_env=_local_runtime_env())
    try:
        if started_ray:  # this machine is the whole cluster: no autoscaler will bring more
            refuse_if_never_fits(spec, ray.cluster_resources())
        return _run(spec, spec_text, echo, state, tracker)
    finally:
        if started_ray:
            ray.shutdown()


# Tune saves its experiment state (trials, searcher) every 10 s or more by default; a driver
# killed in between forgets the trials it started since. Small sweeps' state is tiny: save often.
_STATE_PERIOD_S = "2"


def _run(spec: SweepSpec, spec_text: str, echo: Callable[[str], None], state: SweepState | None,
         tracker: SweepTracker) -> SweepOutcome:
    t0 = time.monotonic()
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", _STATE_PERIOD_S)
    # Progress reports carry throughput but not validation loss, which only the final report has;
    # Tune would otherwise refuse the first report of a sweep whose objective is loss/val.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    uri = tracker.uri
    exp_dir = experiment_dir(spec)
    token = state.token if state is not None else uuid.uuid4().hex
    pool = WarmPool(spec, str(exp_dir / "trials"), token) if spec.scaling.reuse_workers else None
    probe_tags: dict[str, str] = {}
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, spec=spec, storage_path=str(exp_dir / "trials"),
                             pool=pool.queue if pool is not None else None), _DRIVER_RESOURCES)
    if state is not None:  # resume: the same parent and child runs, the searcher's state, finished trials
        parent = state.parent_run_id
        rows = rows_from_runs(tracker.resume_sweep(parent))
        callback = _SweepCallback(spec, tracker, echo, token, rows)
        done = sum(r.status not in UNFINISHED for r in rows)
        echo(f"resuming sweep {spec.name} from {exp_dir}: {done} of {spec.budget.num_trials} trials already ended; "
             f"MLflow parent run {parent}")
        tuner = tune.Tuner.restore(str(exp_dir), trainable=trainable, resume_unfinished=True, resume_errored=False)
    else:
        resources = {k: str(v) for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU", "memory")}
        parent = tracker.start_sweep(
            spec.name, spec.description, spec_text,
            tags={f"sweep.cluster.{k}": v for k, v in resources.items()} | {"sweep.objective": spec.objective.describe()},
        )
        SweepState(spec_text, token, parent, uri).write(exp_dir)
        echo(_concurrency_note(spec, ray.cluster_resources()))
        echo(f"sweep {spec.name}: {spec.budget.num_trials} trials, objective {spec.objective.describe()}; "
             f"MLflow parent run {parent} at {uri}")
        callback = _SweepCallback(spec, tracker, echo, token)
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                search_alg=make_searcher(spec, token),
                scheduler=make_scheduler(spec),
                num_samples=spec.budget.num_trials,
                max_concurrent_trials=spec.budget.max_concurrent_trials,
                time_budget_s=spec.budget.time_budget_s,
                reuse_actors=REUSE_TRIAL_ACTORS,
            ),
            run_config=tune.RunConfig(name=spec.name, storage_path=str(exp_dir.parent), callbacks=[callback], verbose=0,
                                      stop=_Breaker(token)),
        )
    ok = False
    try:
        if pool is not None and spec.search.probe_batch_size:  # before the search: bounds what it proposes
            from sweeps.probe import probe_frontier

            probe_tags = probe_frontier(spec, pool.queue, token, echo)
        tuner.fit()
        ok = True
    finally:
        groups = pool.close() if pool is not None else 0
        this_run = [r for r in callback.rows.values() if r.trial_id in callback.started()]
        echo(_overhead_line(this_run, time.monotonic() - t0, groups if pool is not None else None))
        _LIVE.pop(token, None)
        tripped = shared(token).tripped
        release(token)
        # Tune stopped early (a halt, Ctrl+C) and kept its unfinished trials for resume; or it failed.
        interrupted = "" if ok and not callback.unfinished() else (
            f"halted: {callback.halted}" if callback.halted else "the sweep was interrupted before it finished")
        for row in callback.rows.values():
            if row.status not in UNFINISHED:
                continue
            if interrupted:
                row.status, row.reason = "interrupted", row.reason or interrupted
            else:  # Tune never recorded it (the driver died between starting it and saving its state)
                row.status, row.reason = "lost", "the sweep driver died before Tune recorded this trial; another ran in its place"
            tracker.trial_ended(row.trial_id, False, row.status, row.reason, {})
        outcome = SweepOutcome(spec, parent, uri, sorted(callback.rows.values(), key=lambda r: r.number),
                               time.monotonic() - t0, tripped, interrupted)
        best = outcome.best
        metrics = {spec.objective.primary: float(best.metrics[spec.objective.primary])} if best else {}
        tags = {"sweep.trials_ok": str(len(outcome.ranked())), "sweep.trials_total": str(len(outcome.trials)),
                **probe_tags}
        if tripped:
            tags["sweep.stopped"] = tripped[:5000]
        if interrupted:
            tags["sweep.interrupted"] = interrupted[:5000]
        if best is not None and best.run_id:
            tags["sweep.best_run_id"] = best.run_id
        if not tracker.flush():
            path = tracker.dump_pending()
            echo(f"WARNING: MLflow stayed unreachable ({tracker.degraded_reason}); {len(tracker.pending)} tracking "
                 f"calls were not logged and are saved in {path}")
            tags["sweep.tracking"] = f"degraded: {len(tracker.pending)} calls saved in {path}"
        try:
            tracker.end_sweep("KILLED" if interrupted else "FINISHED", metrics, tags)
        except Exception as exc:  # noqa: BLE001 - the trials are done; say what was not recorded
            echo(f"WARNING: could not close the MLflow parent run ({type(exc).__name__}: {exc})")
        if interrupted:
            echo(f"the sweep did not finish ({interrupted}); continue it with: {resume_command(spec)}")
        if outcome.trials and not tracker.pending:
            _publish_report(outcome, tracker, echo)
    return outcome


def _overhead_line(rows: list[TrialRow], wall_s: float, groups: int | None) -> str:
    """What the sweep cost beyond its training: (sweep wall - the trials' own loop time) / trials."""
    loops = [float(r.metrics[LOOP_S]) for r in rows if isinstance(r.metrics.get(LOOP_S), (int, float))]
    mode = (f"warm worker groups: {groups} started for {len(rows)} trial(s)" if groups is not None
            else "one Ray Train run per trial")
    if not loops:
        return f"{mode}; no trial ran its loop to the end, so no overhead figure"
    return (f"{mode}; per-trial overhead (sweep wall {wall_s:.1f} s - loops {sum(loops):.1f} s) / {len(loops)} = "
            f"{(wall_s - sum(loops)) / len(loops):.1f} s")


def _publish_report(outcome: SweepOutcome, tracker: SweepTracker, echo: Callable[[str], None]) -> None:
    from sweeps.plots import publish

    try:
        publish(outcome, tracker.client)
        echo(f"report: figures and summary.html logged under report/ on parent run {outcome.parent_run_id}")
    except Exception as exc:  # noqa: BLE001 - figures are secondary; the runs are already logged
        echo(f"WARNING: could not draw the report figures ({type(exc).__name__}: {exc}); the runs are complete")
