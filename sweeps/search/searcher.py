"""The search: which configuration to try next, and when to stop a trial early.

One Optuna study, driven through its public ask/tell API from Ray Tune's public `Searcher`
interface, with what a throughput sweep needs:

- **Infeasibility is learned, not ignored.** Optuna drops FAILed trials, so a sampler keeps
  proposing batch sizes that run out of memory. A trial that cannot run (oom, unsupported) or
  breaks a spec constraint (e.g. `loss/val` <= 2.5) is told to Optuna as COMPLETE with a
  positive `Trial.set_constraint` value: constraint-aware TPE puts it in the bad group.
- **Monotone skipping** (`sweeps.search.live_state`): a proposal at or above a batch that ran out of memory
  with the same memory settings is told as infeasible without running, and the sampler asked again.
- **Grid mode** walks every combination once, smallest batch first, with the same skipping.

What it shares with the stopper and the callback (OOM bounds, failure kinds, what is left) is the
sweep's `sweeps.search.live_state.SearchState`, read through `current()`: Tune copies and pickles them all.
"""

from __future__ import annotations

import logging
import pickle
import warnings
from typing import Any

import optuna
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from sweeps.search.distributions import optuna_space
from sweeps.search.live_state import current
from sweeps.search.plan import SIZE, SizeRuns, config_key, finite_points, unvisited
from sweeps.search.trials import fixed_knobs
from sweeps.spec import PARAMS_PREFIX, ConstraintSpec, SweepSpec, TargetSpec
from trainables.contract import ELAPSED_S, FINAL, STEPS, TO_TARGET_METRICS, cv_key_of

logger = logging.getLogger(__name__)

INFEASIBLE_KINDS = ("oom", "unsupported")  # the configuration cannot run here: never worth retrying
_MAX_SKIPS = 25  # proposals in a row at or above an OOM bound before the search gives up
_MAX_REPEATS = 8  # proposals in a row of what already ran before the search picks a configuration not yet run
_FITS = "fits"  # constraint name for "the trial could run at all"


class SweepSearch(Searcher):
    """Tune's public `Searcher` over an Optuna study's public ask/tell.

    With infeasibility feedback, monotone OOM skipping, grid mode, no configuration twice and runs per worker
    count (`sweeps.search.plan`). Nothing of `OptunaSearch` is used."""

    def __init__(self, space: dict[str, Any], metric: str | list[str], mode: str | list[str],
                 *, sampler: optuna.samplers.BaseSampler, fixed: dict[str, Any], constraints: list[ConstraintSpec],
                 grid: list[dict[str, Any]] | None = None, points: list[dict[str, Any]] | None = None,
                 runs: SizeRuns | None = None, when_exhausted: str = "stop", noise_key: str | None = None,
                 seed: int = 0) -> None:
        # Tune's base class keeps one metric and mode; a multi-objective study keeps its own lists
        super().__init__(metric=metric if isinstance(metric, str) else metric[0],
                         mode=mode if isinstance(mode, str) else mode[0])
        self._metrics = [metric] if isinstance(metric, str) else list(metric)
        modes = [mode] if isinstance(mode, str) else list(mode)
        self._space = space
        self._sampler = sampler
        self._study = optuna.create_study(sampler=sampler, directions=[
            "maximize" if m == "max" else "minimize" for m in modes])
        self._fixed = fixed
        self._constraints = list(constraints)
        self._grid = list(grid) if grid is not None else None
        self._skipped: list[dict[str, Any]] = []  # grid points skipped as out of memory bounds
        self._asked: dict[str, optuna.trial.Trial] = {}  # Tune trial id -> its open Optuna trial
        self._deferred: dict[str, optuna.trial.Trial] = {}  # errored trials waiting for the callback to classify them
        self._points, self._runs, self._seed = points, runs, seed
        self._when_exhausted, self._noise_key = when_exhausted, noise_key
        self._handed: dict[tuple[Any, ...], list[str]] = {}  # configuration -> the trials it was handed to
        self._keys: dict[str, tuple[Any, ...]] = {}  # trial id -> its configuration
        self._measured: dict[tuple[Any, ...], tuple[list[float], dict[str, float], float | None]] = {}
        self._publish()

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any) -> bool:
        return True  # metric, mode and space come from the sweep spec, not from Tune

    # -- proposing ---------------------------------------------------------------------

    def _ask(self, trial_id: str, size: int | None = None) -> dict[str, Any]:
        """A new Optuna trial's configuration; with `size`, its worker count held there (Optuna's
        `PartialFixedSampler` over the sweep's own sampler)."""
        if size is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                self._study.sampler = optuna.samplers.PartialFixedSampler({SIZE: size}, self._sampler)
        try:
            trial = self._study.ask(fixed_distributions=self._space)
        finally:
            self._study.sampler = self._sampler
        self._asked[trial_id] = trial
        return dict(trial.params)

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        self._settle()
        if self._grid is not None:
            return self._suggest_grid(trial_id)
        try:
            config = self._new(trial_id)
            if config is None:
                config = self._replicate(trial_id)
            if config is None:
                return Searcher.FINISHED  # type: ignore[return-value]  # Tune's sentinel is a str
            self._hand_out(trial_id, config)
            return config
        finally:
            self._publish()

    def _new(self, trial_id: str) -> dict[str, Any] | None:
        """A configuration not handed out before, of the worker count the runs hold (trying the next count
        when one has none left); None when the space has none left (or the sampler finds none)."""
        while True:
            size = self._runs.pinned() if self._runs is not None else None
            config = self._propose(trial_id, size)
            if config is not None or size is None or self._runs is None:
                return config
            self._runs.exhausted.add(size)  # every configuration of this count has run

    def _propose(self, trial_id: str, size: int | None) -> dict[str, Any] | None:
        repeats = 0
        for _ in range(_MAX_SKIPS):
            config = self._ask(trial_id, size)
            key = config_key(config)
            if key in self._handed:  # the sampler proposed what ran (or runs): told so, asked again
                self._tell_repeat(trial_id, key)
                repeats += 1
                if repeats >= _MAX_REPEATS:
                    break
                continue
            knobs = {**self._fixed, **config}
            if current().oom_excluded(knobs) is None:
                return config
            logger.info("skipping %s: %s", config, current().oom_skip_reason(knobs))
            self._tell_infeasible(self._asked.pop(trial_id), {_FITS: 1.0})
        if self._points is None:
            if repeats:
                logger.warning("the sampler proposed only configurations already run (%d in a row)", repeats)
            else:
                logger.warning("every proposal is at or above a batch size that ran out of memory; ending the search")
            return None
        # a finite space: a configuration not yet run, that fits the memory bounds
        for point in unvisited(self._points, set(self._handed), self._seed + len(self._handed), size):
            if current().oom_excluded({**self._fixed, **point}) is None:
                self._study.enqueue_trial(point)
                return self._ask(trial_id, size)
        return None

    def _tell_repeat(self, trial_id: str, key: tuple[Any, ...]) -> None:
        """Tell Optuna a proposal it made again: the value that configuration measured (the FAQ's way: the
        sampler learns nothing new, but its count is right), or FAIL while it still runs."""
        ot_trial = self._asked.pop(trial_id)
        ot_trial.set_user_attr("repeat_of", self._handed[key][0])
        measured = self._measured.get(key)
        if measured is None:
            self._study.tell(ot_trial, state=optuna.trial.TrialState.FAIL)
            return
        values, constraints, _ = measured
        for name, v in constraints.items():
            ot_trial.set_constraint(name, v)
        self._study.tell(ot_trial, values if len(values) > 1 else values[0])

    def _hand_out(self, trial_id: str, config: dict[str, Any]) -> None:
        key = config_key(config)
        self._handed.setdefault(key, []).append(trial_id)
        self._keys[trial_id] = key
        if self._runs is not None and SIZE in config:
            self._runs.handed(int(config[SIZE]))

    def _replicate(self, trial_id: str) -> dict[str, Any] | None:
        """The space is exhausted: with `when_exhausted: replicate`, a replicate of the best configuration or
        of one within noise of it (the least replicated first); None (the search ends, saying why) when not
        asked, or when the best is clear of the rest."""
        ran = len(self._handed)
        why = (f"every one of the space's {len(self._points)} configurations has run" if self._points is not None
               else "the sampler proposed only configurations that already ran")
        close = self._close_calls() if self._when_exhausted == "replicate" else []
        if not close:
            extra = ("" if self._when_exhausted != "replicate" else
                     "; the best configuration is clear of the others beyond their noise: nothing to replicate")
            current().exhausted = f"{why} ({ran} trials){extra}"
            return None
        key = min(close, key=lambda k: len(self._handed[k]))
        config = dict(key)
        self._study.enqueue_trial(config)
        asked = self._ask(trial_id)
        current().replicate_of[trial_id] = self._handed[key][0]
        current().exhausted = f"{why}: the rest of the trials replicate the close calls"
        return asked

    def _close_calls(self) -> list[tuple[Any, ...]]:
        """The best measured configuration and those within noise of it (single objective, cv known): the
        gap between their values is smaller than the larger of their sub-window spreads."""
        if len(self._metrics) != 1:
            return []
        sign = 1.0 if self._study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
        done = {k: (v[0][0], v[2]) for k, v in self._measured.items() if all(c <= 0 for c in v[1].values())}
        if not done:
            return []
        best = max(done, key=lambda k: sign * done[k][0])
        value, cv = done[best]

        def tie(other: tuple[Any, ...]) -> bool:
            v, c = done[other]
            low = min(abs(v), abs(value))
            return cv is not None and c is not None and low > 0 and abs(v - value) / low * 100 < max(cv, c)

        ties = [k for k in done if k != best and tie(k)]
        return [best, *ties] if ties else []

    def _suggest_grid(self, trial_id: str) -> dict[str, Any] | None:
        assert self._grid is not None
        try:
            while self._grid:
                point = self._grid.pop(0)
                knobs = {**self._fixed, **point}
                if current().oom_excluded(knobs) is None:
                    self._study.enqueue_trial(point)
                    return self._ask(trial_id)
                logger.info("grid: skipping %s: %s", point, current().oom_skip_reason(knobs))
                self._skipped.append(point)
            return Searcher.FINISHED  # type: ignore[return-value]
        finally:
            self._publish()

    def _publish(self) -> None:
        """What is left of the grid and the worker count's runs, for the progress lines (`grid_skips`, the ETA)."""
        s = current()
        s.grid_left, s.grid_skipped = list(self._grid or []), list(self._skipped)
        s.runs = self._runs
        s.space_left = (len(self._points) - len(self._handed) if self._points is not None
                        and self._when_exhausted == "stop" else None)

    # -- learning ----------------------------------------------------------------------

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        ot_trial = self._asked.pop(trial_id, None)
        if ot_trial is None:  # told already (e.g. a trial run again after a resume)
            return
        if error:
            # Tune tells the searcher before its callbacks see the error, so the failure kind
            # is not known yet: settle once the sweep callback has classified it.
            self._deferred[trial_id] = ot_trial
            return
        result = result or {}
        raw = [result.get(m) for m in self._metrics]
        finished = result.get(FINAL) == 1  # else stopped early (ASHA, time budget, breaker)
        if finished and any(m in self._metrics and m not in result for m in TO_TARGET_METRICS):
            # ran its whole budget without reaching the target: infeasible by the target's gap
            self._tell_infeasible(ot_trial, {str(c): max(c.violation(result.get(c.metric)), 1e-12)
                                             for c in self._constraints if isinstance(c, TargetSpec)})
            return
        if any(not isinstance(v, (int, float)) for v in raw) or not finished:
            self._study.tell(ot_trial, state=optuna.trial.TrialState.PRUNED)  # stopped early
            return
        values = [float(v) for v in raw]  # type: ignore[arg-type]  # numbers, checked above
        constraints = {str(c): c.violation(result.get(c.metric)) for c in self._constraints} | {_FITS: 0.0}
        for name, v in constraints.items():
            ot_trial.set_constraint(name, v)
        try:
            self._study.tell(ot_trial, values if len(values) > 1 else values[0])
        except Exception as exc:  # noqa: BLE001 - e.g. a NaN objective: Optuna marks it FAIL
            logger.warning("Optuna refused trial %s's result: %s", trial_id, exc)
            return
        key = self._keys.get(trial_id)
        if key is not None and key not in self._measured:  # what a repeat of it is told
            cv = result.get(self._noise_key) if self._noise_key else None
            self._measured[key] = (values, constraints, float(cv) if isinstance(cv, (int, float)) else None)

    def _settle(self) -> None:
        """Tell Optuna about errored trials the sweep callback has classified since."""
        failures = current().failures
        for trial_id in [t for t in self._deferred if t in failures]:
            ot_trial = self._deferred.pop(trial_id)
            if failures[trial_id] in INFEASIBLE_KINDS:
                self._tell_infeasible(ot_trial, {_FITS: 1.0})
            else:  # a crash or a bug says nothing about the configuration
                self._study.tell(ot_trial, state=optuna.trial.TrialState.FAIL)

    def _tell_infeasible(self, ot_trial: optuna.trial.Trial, violations: dict[str, float]) -> None:
        """COMPLETE with constraint violations: TPE ranks it below every feasible trial (the
        value itself is never compared; Optuna needs one, so it is the worst possible)."""
        for c in self._constraints:
            ot_trial.set_constraint(str(c), 1.0)
        for name, v in violations.items():
            ot_trial.set_constraint(name, v)
        worst = [float("-inf") if d == optuna.study.StudyDirection.MAXIMIZE else float("inf")
                 for d in self._study.directions]
        self._study.tell(ot_trial, worst if len(worst) > 1 else worst[0])

    # -- Tune's experiment state (resume) ---------------------------------------------------

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))
        # saved before they were kept: the points skipped then are unknown, so the ETA counts them as to come;
        # what was handed out then is unknown too (a repeat of it is not recognised)
        for name, empty in (("_skipped", []), ("_handed", {}), ("_keys", {}), ("_measured", {})):
            self.__dict__.setdefault(name, empty)
        for name in ("_points", "_runs", "_noise_key"):
            self.__dict__.setdefault(name, None)
        self.__dict__.setdefault("_when_exhausted", "stop")
        self.__dict__.setdefault("_seed", 0)
        self.__dict__.setdefault("_sampler", self._study.sampler)
        self._publish()

    @property
    def study(self) -> optuna.study.Study:
        """The Optuna study behind the search (read-only use: reports, tests)."""
        return self._study


def make_searcher(spec: SweepSpec) -> SweepSearch | None:
    """Seeded search over the searched knobs; None (Tune's plain repeats) when all are fixed."""
    if not spec.space.searched():
        return None
    if spec.search.algorithm == "random":
        sampler: optuna.samplers.BaseSampler = optuna.samplers.RandomSampler(seed=spec.seed)
    else:  # TPE also serves grid mode, whose points are enqueued in order
        sampler = optuna.samplers.TPESampler(seed=spec.seed)
    obj = spec.objective
    grid = spec.search.algorithm == "grid"
    return SweepSearch(
        space=optuna_space(spec),
        metric=list(obj.metrics) if obj.multi else obj.primary,
        mode=list(obj.modes) if obj.multi else obj.primary_mode,
        sampler=sampler,  # seeded
        fixed=fixed_knobs(spec),
        # a target is a constraint too: a trial that misses it is infeasible, by how far it stayed
        constraints=[*obj.constraints, *([obj.target] if obj.target is not None else [])],
        grid=spec.space.grid_points() if grid else None,
        points=None if grid else finite_points(spec),
        runs=SizeRuns.of(spec) if spec.scaling.reuse_workers else None,
        when_exhausted=spec.search.when_exhausted,
        noise_key=cv_key_of(obj.primary),
        seed=spec.seed,
    )



def make_scheduler(spec: SweepSpec) -> TrialScheduler:
    """Build ASHA on measured steps when early stopping is on.

    Every trial is compared with others at the same number of steps (rungs at grace_steps *
    reduction_factor**k). With a time-to-target objective, on the target metric at the same training time
    (rungs at grace_s * reduction_factor**k on the time-to-target clock, the report after each evaluation
    carries both): a trial whose quality is behind the others' at equal time is unlikely to reach the target
    first."""
    es = spec.search.early_stopping
    if es is None:
        return FIFOScheduler()
    obj = spec.objective
    if obj.target is not None and obj.time_to_target:
        # seconds: four rungs, grace_s * rf**k for k = 0..3 (the top one cuts too); the factor keeps Ray's
        # float rung count, int(log(max_t / grace) / log(rf) + 1), from rounding down to three. A trial
        # is recorded at the highest rung its first report past it reaches: grace_s should span several
        # evaluations of the slowest-evaluating trial, or a late report is compared with on-time ones.
        grace: float = es.grace_s or 1.0  # the spec gives grace_s for a time-to-target objective
        time_attr, metric, mode = ELAPSED_S, obj.target.metric, "min" if obj.target.max is not None else "max"
        max_t, last = grace * es.reduction_factor ** 3 * (1 + 1e-9), False  # past the top rung a trial runs on
    else:
        grace = es.grace_steps or 1  # the spec gives grace_steps otherwise, and num_steps
        time_attr, metric, mode = STEPS, obj.primary, obj.primary_mode
        max_t, last = spec.budget.num_steps or 1, True
    return ASHAScheduler(
        time_attr=time_attr,
        metric=metric,
        mode=mode,
        max_t=max_t,  # type: ignore[arg-type]  # seconds are floats: Ray's rung arithmetic takes them
        grace_period=grace,  # type: ignore[arg-type]  # (annotated int)
        reduction_factor=es.reduction_factor,
        stop_last_trials=last,
    )


def knobs_of(spec: SweepSpec, row: Any) -> dict[str, Any]:
    """Return a trial's knobs as the searcher names them.

    Its logged params carry the trainable's own as `workload.<name>`; the space names them `params.<name>`."""
    own = {f"{PARAMS_PREFIX}{n}": row.params[f"workload.{n}"] for n in spec.space.params if f"workload.{n}" in row.params}
    return {**fixed_knobs(spec), **row.params, **own}
