"""Run a sweep, the table of contents: the spec's state (new or resumed), MLflow, Ray, the warm
pool, the memory probe, then Ray Tune with the sweep's searcher (`sweeps.search.searcher`), scheduler,
stopper (`sweeps.service.breaker`) and callback (`sweeps.service.callback`: MLflow, progress, verdicts, statuses)
over the trial driver (`sweeps.service.trial`); at the end the outcome, the parent run and the report."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable

import ray
from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

from sweeps.results.outcome import UNFINISHED, SweepOutcome
from sweeps.results.quality import annotate, log_updates
from sweeps.results.report import rows_from_runs, sweep_note
from sweeps.results.sol import SpeedOfLight
from sweeps.results.verdict import revise_verdicts
from sweeps.search.searcher import make_scheduler, make_searcher, release, shared
from sweeps.service.breaker import BreakerStopper
from sweeps.service.callback import _LIVE, SweepCallback
from sweeps.service.connect import connect_ray, sigterm_as_sigint
from sweeps.service.pool import WarmPool
from sweeps.service.progress import TERMINAL, overhead_line, planned_cost
from sweeps.service.resources import DRIVER_RESOURCES, concurrency_note, local_runtime_env, refuse_if_never_fits
from sweeps.service.state import (
    SweepExists,
    SweepState,
    experiment_dir,
    in_uploaded_job,
    outputs_root,
    resume_command,
    sweep_lock,
)
from sweeps.service.trial import run_trial
from sweeps.spec import SweepSpec
from sweeps.store import absolute_uri
from sweeps.tracking import SweepTracker

logger = logging.getLogger(__name__)

# Tune hands the next trial to the finished trial's actor (same resources: always here) instead of
# starting a new process: ~1 s less per trial on 2 vCPU (benchmarks/sweep_overhead.py). The Train
# controller and workers are still new for every trial.
REUSE_TRIAL_ACTORS = True


def echo_stdout(line: str) -> None:
    TERMINAL(line)  # one line per event; on a terminal also a live status line (sweeps.service.progress)


def run_sweep(spec: SweepSpec, spec_text: str, echo: Callable[[str], None] = echo_stdout,
              restart: bool = False) -> SweepOutcome:
    """Run the sweep on the Ray cluster `ray.init()` finds (or a new local one). A sweep of the
    same name and spec already in `storage_path` is resumed; another spec under that name is
    refused (`SweepExists`); `restart` moves the old one aside and starts afresh. The sweep's lock is
    held throughout: a second run of it refuses at once (`SweepLocked`)."""
    uri = spec.tracking.resolved_uri()
    if in_uploaded_job():  # the job's working directory is a temporary copy of the upload
        uri = absolute_uri(uri, outputs_root())
        echo(f"inside a Ray job: the sweep's state ({experiment_dir(spec)}) and a local MLflow store ({uri}) live "
             "outside the job's temporary working copy ($SWEEPS_HOME, default ~/sweeps, on this node)")
    with sweep_lock(spec):
        state = SweepState.find(spec, spec_text, restart=restart, echo=echo)
        # Before Ray starts: a dead MLflow server or an unusable store fails here, in seconds (sweeps.store).
        tracker = SweepTracker(uri, spec.tracking.experiment or spec.name, experiment_dir(spec) / "mlflow-pending.jsonl")
        if state is not None and not tracker.has_run(state.parent_run_id):
            # e.g. its mlflow.db was deleted to start afresh: resuming would fail at the first trial
            raise SweepExists(f"the sweep {spec.name} in {experiment_dir(spec)} was tracked as MLflow run "
                              f"{state.parent_run_id} at {uri}, which that store no longer "
                              "has (was it deleted, or tracking.uri changed?). Run the sweep with --restart to start it "
                              "afresh (the old folder is moved aside), or point tracking.uri at the store that has it")
        started_ray = connect_ray(local_runtime_env, echo)
        try:
            with sigterm_as_sigint():  # after ray.init, whose own SIGTERM handler aborts the process
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
    # Tune's own result files: CSV and JSON (its ResultGrid reads them), not TensorBoard's (MLflow is the
    # record; importing tensorboardX cost the first trial's result ~1 s on this 2-core machine)
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    uri = tracker.uri
    exp_dir = experiment_dir(spec)
    token = state.token if state is not None else uuid.uuid4().hex
    # Every rank works here, as under torchrun: the user's relative paths resolve as they do for them
    # (inside `ray job submit`, this is the job's working directory).
    workdir = os.getcwd()
    pool = WarmPool(spec, str(exp_dir / "trials"), token, workdir) if spec.scaling.reuse_workers else None
    probe_tags: dict[str, str] = {}
    probe_s = 0.0
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, spec=spec, storage_path=str(exp_dir / "trials"),
                             pool=pool.queue if pool is not None else None, workdir=workdir), DRIVER_RESOURCES)
    if state is not None:  # resume: the same parent and child runs, the searcher's state, finished trials
        parent = state.parent_run_id
        rows = rows_from_runs(tracker.resume_sweep(parent))
        callback = SweepCallback(spec, tracker, echo, token, rows)
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
        echo(concurrency_note(spec, ray.cluster_resources()))
        echo(f"sweep {spec.name}: {spec.budget.num_trials} trials, objective {spec.objective.describe()}; "
             f"MLflow parent run {parent} at {uri}")
        callback = SweepCallback(spec, tracker, echo, token)
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
            run_config=tune.RunConfig(name=spec.name, storage_path=str(exp_dir.parent), verbose=0,
                                      callbacks=[callback, CSVLoggerCallback(), JsonLoggerCallback()],
                                      stop=BreakerStopper(token)),
        )
    callback.queue = pool.queue if pool is not None else None
    callback.speed_of_light = SpeedOfLight.for_sweep(uri)  # before the trials: a quick measurement competes with none
    for key, source in callback.speed_of_light.sources.items():
        echo(f"speed of light for {key}: {source}")
    if state is None:  # a new sweep: what it will cost, with a warm group's start measured on this cluster
        echo(planned_cost(spec, _first_group_s(pool)))
    ok = hurried = False
    try:
        if pool is not None and spec.search.probe_batch_size:  # before the search: bounds what it proposes
            from sweeps.service.probe import probe_frontier

            probe_t0 = time.monotonic()
            probe_tags = probe_frontier(spec, pool.queue, token, echo)
            probe_s = time.monotonic() - probe_t0
        tuner.fit()
        ok = True
    except KeyboardInterrupt:  # a second signal: stop at once (the trials' state is kept, the figures are not drawn)
        hurried = True
        raise
    finally:
        wall = time.monotonic() - t0
        try:
            if pool is not None:  # its groups wind down (~1.5 s of Ray Train teardown) while the results are written
                pool.close()
            outcome = _conclude(spec, callback, tracker, echo, token, parent, uri, ok, wall, probe_tags, not hurried)
        finally:
            groups = pool.join(timeout_s=10.0 if hurried else 30.0) if pool is not None else None
            this_run = [r for r in callback.rows.values() if r.trial_id in callback.started()]
            if not hurried:  # its groups were not waited for: no count to give
                echo(overhead_line(this_run, wall, groups, probe_s))
            TERMINAL.close()  # the live status line gives way to the final output
    return outcome


def _first_group_s(pool: WarmPool | None, timeout_s: float = 120.0) -> float | None:
    """What the pool's first warm group took to start (waiting for it, at most `timeout_s`: an autoscaling
    cluster may still be adding its nodes); None without a pool or in time."""
    if pool is None:
        return None
    starts = ray.get(pool.queue.wait_started.remote(timeout_s))
    return float(starts[0][1]) if starts else None


def _conclude(spec: SweepSpec, callback: SweepCallback, tracker: SweepTracker, echo: Callable[[str], None],
              token: str, parent: str, uri: str, ok: bool, wall: float, probe_tags: dict[str, str],
              report: bool = True) -> SweepOutcome:
    """The trials are over (or the sweep was stopped): settle the unfinished ones, write the sweep-level
    figures and the parent run's answer to MLflow, and publish the report."""
    _LIVE.pop(token, None)
    tripped, exhausted_said = shared(token).tripped, shared(token).exhausted
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
    exhausted = exhausted_said if not interrupted else ""
    outcome = SweepOutcome(spec, parent, uri, sorted(callback.rows.values(), key=lambda r: r.number),
                           wall, tripped, interrupted, exhausted)
    quality_note, quality_updates = annotate(outcome)  # guardrail and predicted time to target: across trials
    for run_id, tags in revise_verdicts(outcome).items():  # next steps another trial measured worse: cited
        metrics, logged = quality_updates.get(run_id, ({}, {}))
        quality_updates[run_id] = (metrics, {**logged, **tags})
    best = outcome.best
    metrics = {spec.objective.primary: float(best.metrics[spec.objective.primary])} if best else {}
    tags = {"sweep.trials_ok": str(len(outcome.ranked())), "sweep.trials_total": str(len(outcome.trials)),
            **probe_tags}
    if tripped:
        tags["sweep.stopped"] = tripped[:5000]
    if interrupted:
        tags["sweep.interrupted"] = interrupted[:5000]
    if exhausted:
        tags["sweep.exhausted"] = exhausted[:5000]
    if best is not None and best.run_id:
        tags["sweep.best_run_id"] = best.run_id
    tags["sweep.quality_guardrail"] = quality_note
    if quality_updates and not tracker.pending:
        try:
            log_updates(tracker.client, quality_updates)
        except Exception as exc:  # noqa: BLE001 - the trials are done; say what was not recorded
            echo(f"WARNING: could not log the sweep-level figures (quality, revised verdicts) to MLflow ({type(exc).__name__}: {exc})")
    if not tracker.flush():
        path = tracker.dump_pending()
        echo(f"WARNING: MLflow stayed unreachable ({tracker.degraded_reason}); {len(tracker.pending)} tracking "
             f"calls were not logged and are saved in {path}")
        tags["sweep.tracking"] = f"degraded: {len(tracker.pending)} calls saved in {path}"
    try:
        tracker.end_sweep("KILLED" if interrupted else "FINISHED", metrics, tags)
        tracker.set_note(sweep_note(outcome))  # the run's description in the UI: the answer, in words
    except Exception as exc:  # noqa: BLE001 - the trials are done; say what was not recorded
        echo(f"WARNING: could not close the MLflow parent run ({type(exc).__name__}: {exc})")
    if interrupted:
        echo(f"the sweep did not finish ({interrupted}); continue it with: {resume_command(spec)}")
    if outcome.trials and not tracker.pending and report:
        _publish_report(outcome, tracker, echo)
    return outcome


def _publish_report(outcome: SweepOutcome, tracker: SweepTracker, echo: Callable[[str], None]) -> None:
    from sweeps.results.plots import publish

    try:
        publish(outcome, tracker.client)
        echo(f"report: figures and summary.html logged under report/ on parent run {outcome.parent_run_id}")
    except Exception as exc:  # noqa: BLE001 - figures are secondary; the runs are already logged
        echo(f"WARNING: could not draw the report figures ({type(exc).__name__}: {exc}); the runs are complete")
