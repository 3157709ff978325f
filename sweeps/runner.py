"""Run a sweep: Ray Tune + seeded OptunaSearch over a driver function that launches one
Ray Train `TorchTrainer` per trial (the Ray 2.60 pattern), tracked in MLflow."""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import optuna
import ray
from ray import tune
from ray.tune.search.optuna import OptunaSearch

from sweeps.failures import TRANSIENT_KINDS, TrialFailure, classify, failure_of, signature
from sweeps.outcome import SweepOutcome, TrialRow
from sweeps.space import optuna_space, resolve_trial, trial_params
from sweeps.spec import ScalingSpec, SweepSpec
from sweeps.tracking import SweepTracker, check_reachable
from sweeps.verdict import verdict
from trainables.contract import STEPS, TrialConfig

logger = logging.getLogger(__name__)

# The driver only launches and watches the Train workers: it holds no CPU, so a 2-core
# machine can run a 2-worker trial. Ray refuses an empty bundle; 1 byte of memory is not.
_DRIVER_RESOURCES = tune.PlacementGroupFactory([{"CPU": 0, "memory": 1}])


def make_trainer(cfg: TrialConfig, scaling: ScalingSpec, name: str, storage_path: str, callbacks: list[Any]) -> Any:
    """A Ray Train `TorchTrainer` running the shared loop for one trial config."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from trainables.ray_worker import train_worker

    return TorchTrainer(
        train_worker,
        train_loop_config=cfg.to_dict(),
        torch_config=TorchConfig(backend="nccl" if scaling.use_gpu else "gloo"),
        scaling_config=ray.train.ScalingConfig(
            num_workers=scaling.num_workers,
            use_gpu=scaling.use_gpu,
            resources_per_worker={"CPU": scaling.cpus_per_worker, "GPU": scaling.gpus_per_worker},
        ),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=storage_path,
            callbacks=callbacks,
            failure_config=ray.train.FailureConfig(max_failures=0),
        ),
    )


def run_trial(config: dict[str, Any], spec: SweepSpec, storage_path: str) -> None:
    """One Tune trial: a Ray Train run of the shared loop with the sampled config."""
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = tune.get_context().get_trial_id()
    cfg = resolve_trial(spec, config)
    for attempt in range(spec.budget.max_retries + 1):
        name = f"{spec.name}-{trial_id}" + (f"-retry{attempt}" if attempt else "")
        trainer = make_trainer(cfg, spec.scaling, name, storage_path, callbacks=[TuneReportCallback()])
        try:
            trainer.fit()
            return
        except Exception as exc:  # noqa: BLE001 - every failure is classified; only transient ones retried
            kind, reason = classify(exc)
            if kind not in TRANSIENT_KINDS or attempt == spec.budget.max_retries:
                raise TrialFailure(kind, reason) from None
            logger.warning("trial %s attempt %d: %s (%s); retrying", trial_id, attempt + 1, kind, reason)


# Tripped circuit breakers by sweep token. Tune works on a copy of the RunConfig (and so of the
# stopper), so the stopper cannot hold a reference to the live callback; both share this instead.
_TRIPPED: dict[str, str] = {}


class _Breaker(tune.Stopper):
    """Stops every trial, and starts no new one, once the sweep callback's breaker trips."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.token in _TRIPPED


def _trial_error(trial: Any) -> BaseException | None:
    """The exception an errored trial raised. Tune writes it to the trial's local dir first
    and syncs it to storage later, so read the local copy Tune just wrote in this process."""
    local = getattr(trial, "pickled_error_file", None)
    if local and os.path.isfile(local):
        with open(local, "rb") as f:
            error = cloudpickle.load(f)
        return error if isinstance(error, BaseException) else None
    return trial.get_pickled_error()  # type: ignore[no-any-return]


class _SweepCallback(tune.Callback):
    """Mirrors Tune's trial lifecycle into MLflow and prints concise progress lines."""

    def __init__(self, spec: SweepSpec, tracker: SweepTracker, echo: Callable[[str], None]) -> None:
        self.spec, self.tracker, self.echo = spec, tracker, echo
        self.rows: dict[str, TrialRow] = {}
        self.t0 = time.monotonic()
        self._same_failures: list[tuple[str, str]] = []
        self.token = uuid.uuid4().hex
        self.tripped = ""  # why the circuit breaker stopped the sweep

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        params = trial_params(self.spec, resolve_trial(self.spec, dict(trial.config)))
        row = TrialRow(trial.trial_id, len(self.rows) + 1, params)
        self.rows[trial.trial_id] = row
        self.tracker.trial_started(trial.trial_id, row.number, params)
        row.run_id = self.tracker.run_id(trial.trial_id)
        shown = ", ".join(f"{k}={v}" for k, v in trial.config.items())
        self.echo(f"[trial {row.number}/{self.spec.budget.num_trials}] {trial.trial_id} started: {shown}")

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any) -> None:
        row = self.rows[trial.trial_id]
        row.metrics.update({k: v for k, v in result.items() if "/" in k})
        self.tracker.trial_result(trial.trial_id, result, step=int(result.get(STEPS, iteration)))

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        if self.spec.objective.metric in self.rows[trial.trial_id].metrics:
            self._finish(trial.trial_id, "ok", "")
        else:  # ended (e.g. stopped by the circuit breaker) before reporting its result
            why = f"stopped early: {self.tripped}" if self.tripped else "ended without reporting the objective"
            self._finish(trial.trial_id, "stopped", why)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        kind, reason = failure_of(_trial_error(trial))
        self._finish(trial.trial_id, kind, reason)

    def _finish(self, trial_id: str, status: str, reason: str) -> None:
        row = self.rows[trial_id]
        row.status, row.reason = status, reason
        tags = {}
        if status == "ok":
            v = verdict(row.metrics, row.params)
            row.verdict = str(v)
            tags = {"sweep.verdict": v.name, "sweep.verdict_reason": v.reason}
        self.tracker.trial_ended(trial_id, status == "ok", status, reason, tags)
        row.run_id = row.run_id or self.tracker.run_id(trial_id)
        self.echo(self._progress(row))
        self._count_failure(status, reason)
        if status == "oom":
            knobs = {**self.spec.space.fixed(), **row.params}
            bounds = _OOM_BOUNDS.setdefault(self.token, {})
            key = _oom_key(knobs)
            bounds[key] = min(bounds.get(key, int(knobs["batch_size"])), int(knobs["batch_size"]))
            self.echo(f"out of memory at batch_size={knobs['batch_size']} ({key[0]}): no larger batch will be tried")

    def _count_failure(self, status: str, reason: str) -> None:
        """Circuit breaker: the same error N times in a row will not fix itself (e.g. an ImportError)."""
        limit = self.spec.budget.max_identical_failures
        failure = signature(status, reason)
        if status == "ok" or (self._same_failures and self._same_failures[-1] != failure):
            self._same_failures = []
        if status != "ok":
            self._same_failures.append(failure)
        if limit and len(self._same_failures) >= limit and not self.tripped:
            self.tripped = f"{limit} trials in a row failed the same way ({status}: {reason})"
            _TRIPPED[self.token] = self.tripped
            self.echo(f"STOPPING the sweep: {self.tripped}. Fix that, then run the sweep again.")

    def _progress(self, row: TrialRow) -> str:
        rows = list(self.rows.values())
        done = [r for r in rows if r.status != "running"]
        failed = [r for r in done if r.status != "ok"]
        metric = self.spec.objective.metric
        what = (f"{metric}={row.metrics.get(metric, float('nan')):.4g} [{row.verdict.split(':')[0]}]"
                if row.status == "ok" else f"FAILED ({row.status}: {row.reason})")
        elapsed = time.monotonic() - self.t0
        total = self.spec.budget.num_trials
        eta = elapsed / len(done) * (total - len(done)) if done else math.nan
        ranked = [r for r in done if r.status == "ok" and metric in r.metrics]
        best = ""
        if ranked:
            pick = max if self.spec.objective.mode == "max" else min
            b = pick(ranked, key=lambda r: r.metrics[metric])
            best = f" | best {metric}={b.metrics[metric]:.4g} (trial {b.number})"
        return (
            f"[trial {row.number}/{total}] {what} | done {len(done)}/{total}, running {len(rows) - len(done)}, "
            f"failed {len(failed)}{best} | elapsed {elapsed:.0f}s, ETA {eta:.0f}s"
        )


def _concurrency_note(spec: SweepSpec, resources: dict[str, float]) -> str:
    """How many trials fit the cluster at once (all workers of a trial start together)."""
    sc = spec.scaling
    need = {"CPU": sc.num_workers * sc.cpus_per_worker, "GPU": sc.num_workers * sc.gpus_per_worker}
    fits = min(int(resources.get(k, 0) // v) for k, v in need.items() if v > 0)
    asked = spec.budget.max_concurrent_trials
    note = f"cluster fits {fits} trial(s) at once ({need['CPU']} CPU, {need['GPU']:g} GPU each); running {asked}"
    if fits == 0:
        return note + " — WARNING: not even one trial fits now; trials wait for the autoscaler or fail"
    if asked > fits:
        return note + f" — WARNING: only {fits} fit, the rest wait; set budget.max_concurrent_trials: {fits}"
    return note


# Smallest batch size that ran out of memory, per sweep token and (precision, compile).
_OOM_BOUNDS: dict[str, dict[tuple[str, bool], int]] = {}
_MAX_SKIPS = 25


def _oom_key(knobs: dict[str, Any]) -> tuple[str, bool]:
    return str(knobs["precision"]), bool(knobs["compile"])


class _OomAwareSearch(OptunaSearch):
    """OptunaSearch that never proposes a batch size at or above one that ran out of memory
    for the same precision (monotone skipping): such proposals are told to Optuna as failed
    and it is asked again; when nothing feasible is left, the search ends."""

    def __init__(self, *args: Any, token: str, fixed: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._token = token
        self._fixed = fixed

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]  # FINISHED is a str
        for _ in range(_MAX_SKIPS):
            config = super().suggest(trial_id)
            if not isinstance(config, dict):
                return config
            knobs = {**self._fixed, **config}
            bound = _OOM_BOUNDS.get(self._token, {}).get(_oom_key(knobs))
            if bound is None or int(knobs["batch_size"]) < bound:
                return config
            logger.info("skipping batch_size=%s (precision %s): batch %d already ran out of memory",
                        knobs["batch_size"], knobs["precision"], bound)
            assert self._ot_study is not None, "suggest() returned a config, so the study exists"
            self._ot_study.tell(self._ot_trials.pop(trial_id), state=optuna.trial.TrialState.FAIL)
        logger.warning("every proposal is at or above a batch size that ran out of memory; ending the search")
        return self.FINISHED


def _searcher(spec: SweepSpec, token: str) -> OptunaSearch | None:
    """Seeded TPE over the searched knobs; None (Tune's plain repeats) when all are fixed."""
    if not spec.space.searched():
        return None
    sampler = optuna.samplers.TPESampler(seed=spec.seed)
    return _OomAwareSearch(
        space=optuna_space(spec),
        metric=spec.objective.metric,
        mode=spec.objective.mode,
        sampler=sampler,
        seed=spec.seed,
        token=token,
        fixed=spec.space.fixed(),
    )


def _local_runtime_env() -> dict[str, Any] | None:
    """Outside a Ray job, let workers import user trainables from the current directory, as
    `ray job submit --working-dir .` does inside one."""
    if os.environ.get("RAY_ADDRESS") or os.environ.get("RAY_JOB_ID"):
        return None
    path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"PYTHONPATH": path}}


def echo_stdout(line: str) -> None:
    print(line, flush=True)


def run_sweep(spec: SweepSpec, spec_text: str, echo: Callable[[str], None] = echo_stdout) -> SweepOutcome:
    """Run the sweep on the Ray cluster `ray.init()` finds (or a new local one)."""
    check_reachable(spec.tracking.resolved_uri())  # before Ray starts: a dead store fails in seconds
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(runtime_env=_local_runtime_env())
    try:
        return _run(spec, spec_text, echo)
    finally:
        if started_ray:
            ray.shutdown()


def _run(spec: SweepSpec, spec_text: str, echo: Callable[[str], None]) -> SweepOutcome:
    t0 = time.monotonic()
    uri = spec.tracking.resolved_uri()
    storage = str(Path(spec.storage_path).resolve())
    tracker = SweepTracker(uri, spec.tracking.experiment or spec.name, Path(storage) / spec.name / "mlflow-pending.jsonl")
    resources = {k: str(v) for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU", "memory")}
    parent = tracker.start_sweep(
        spec.name, spec.description, spec_text,
        tags={f"sweep.cluster.{k}": v for k, v in resources.items()} | {"sweep.objective": f"{spec.objective.mode} {spec.objective.metric}"},
    )
    echo(_concurrency_note(spec, ray.cluster_resources()))
    echo(f"sweep {spec.name}: {spec.budget.num_trials} trials, objective {spec.objective.mode} "
         f"{spec.objective.metric}; MLflow parent run {parent} at {uri}")
    callback = _SweepCallback(spec, tracker, echo)
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(run_trial, spec=spec, storage_path=f"{storage}/{spec.name}/trials"), _DRIVER_RESOURCES),
        tune_config=tune.TuneConfig(
            search_alg=_searcher(spec, callback.token),
            num_samples=spec.budget.num_trials,
            max_concurrent_trials=spec.budget.max_concurrent_trials,
        ),
        run_config=tune.RunConfig(name=spec.name, storage_path=storage, callbacks=[callback], verbose=0,
                                  stop=_Breaker(callback.token)),
    )
    ok = False
    try:
        tuner.fit()
        ok = True
    finally:
        _TRIPPED.pop(callback.token, None)
        _OOM_BOUNDS.pop(callback.token, None)
        outcome = SweepOutcome(spec, parent, uri, list(callback.rows.values()), time.monotonic() - t0, callback.tripped)
        best = outcome.best
        metrics = {spec.objective.metric: float(best.metrics[spec.objective.metric])} if best else {}
        tags = {"sweep.trials_ok": str(len(outcome.ranked())), "sweep.trials_total": str(len(outcome.trials))}
        if callback.tripped:
            tags["sweep.stopped"] = callback.tripped[:5000]
        if best is not None and best.run_id:
            tags["sweep.best_run_id"] = best.run_id
        if not tracker.flush():
            path = tracker.dump_pending()
            echo(f"WARNING: MLflow stayed unreachable ({tracker.degraded_reason}); {len(tracker.pending)} tracking "
                 f"calls were not logged and are saved in {path}")
            tags["sweep.tracking"] = f"degraded: {len(tracker.pending)} calls saved in {path}"
        try:
            tracker.end_sweep(ok, metrics, tags)
        except Exception as exc:  # noqa: BLE001 - the trials are done; say what was not recorded
            echo(f"WARNING: could not close the MLflow parent run ({type(exc).__name__}: {exc})")
        if outcome.trials and not tracker.pending:
            _publish_report(outcome, tracker, echo)
    return outcome


def _publish_report(outcome: SweepOutcome, tracker: SweepTracker, echo: Callable[[str], None]) -> None:
    from sweeps.plots import publish

    try:
        publish(outcome, tracker.client)
        echo(f"report: figures and summary.html logged under report/ on parent run {outcome.parent_run_id}")
    except Exception as exc:  # noqa: BLE001 - figures are secondary; the runs are already logged
        echo(f"WARNING: could not draw the report figures ({type(exc).__name__}: {exc}); the runs are complete")
