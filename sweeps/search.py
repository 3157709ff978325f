"""The search: which configuration to try next, and when to stop a trial early.

One Optuna study behind Ray Tune's `OptunaSearch`, extended with what a throughput sweep needs:

- **Infeasibility is learned, not ignored.** Optuna drops FAILed trials, so a sampler keeps
  proposing batch sizes that run out of memory. A trial that cannot run (oom, unsupported) or
  breaks a spec constraint (e.g. `loss/val` <= 2.5) is told to Optuna as COMPLETE with a
  positive `Trial.set_constraint` value: constraint-aware TPE puts it in the bad group.
- **Monotone skipping.** Once batch b ran out of memory at a precision, no batch >= b is run
  for it: such proposals are told as infeasible without running, and the sampler asked again.
- **Grid mode** walks every combination once, smallest batch first, with the same skipping.

Tune copies and pickles searchers, stoppers and callbacks (`tuner.pkl`, experiment state), so
they share live state through `shared(token)` rather than through references.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import optuna
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler
from ray.tune.search.optuna import OptunaSearch

from sweeps.space import optuna_space
from sweeps.spec import PARAMS_PREFIX, ConstraintSpec, SweepSpec
from trainables.contract import FINAL, STEPS

logger = logging.getLogger(__name__)

INFEASIBLE_KINDS = ("oom", "unsupported")  # the configuration cannot run here: never worth retrying
_MAX_SKIPS = 25  # proposals in a row at or above an OOM bound before the search gives up
_FITS = "fits"  # constraint name for "the trial could run at all"


@dataclass
class Shared:
    """State of one sweep shared by its callback, searcher and stopper (see module doc)."""

    tripped: str = ""  # why the circuit breaker stopped the sweep
    oom_bounds: dict[tuple[Any, ...], int] = field(default_factory=dict)  # oom_key -> smallest batch that ran out
    failures: dict[str, str] = field(default_factory=dict)  # errored trial id -> failure kind


_SHARED: dict[str, Shared] = {}


def shared(token: str) -> Shared:
    return _SHARED.setdefault(token, Shared())


def release(token: str) -> None:
    _SHARED.pop(token, None)


def oom_key(knobs: dict[str, Any]) -> tuple[Any, ...]:
    """What, besides the batch size, decides whether a trial fits in memory: precision, compile and
    the trainable's own params in the space (a wider model runs out of memory at a smaller batch)."""
    own = tuple(sorted((k, str(v)) for k, v in knobs.items() if k.startswith(PARAMS_PREFIX)))
    return str(knobs["precision"]), bool(knobs["compile"]), own


def record_oom(token: str, knobs: dict[str, Any]) -> None:
    bounds = shared(token).oom_bounds
    key = oom_key(knobs)
    bounds[key] = min(bounds.get(key, int(knobs["batch_size"])), int(knobs["batch_size"]))


def oom_excluded(token: str, knobs: dict[str, Any]) -> int | None:
    """The batch size that already ran out of memory if `knobs` is at or above it."""
    bound = shared(token).oom_bounds.get(oom_key(knobs))
    return bound if bound is not None and int(knobs["batch_size"]) >= bound else None


class SweepSearch(OptunaSearch):
    """OptunaSearch with infeasibility feedback, monotone OOM skipping and grid mode."""

    def __init__(self, *args: Any, token: str, fixed: dict[str, Any], constraints: list[ConstraintSpec],
                 grid: list[dict[str, Any]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._token = token
        self._fixed = fixed
        self._constraints = list(constraints)
        self._grid = list(grid) if grid is not None else None
        self._deferred: dict[str, Any] = {}  # errored trials waiting for the callback to classify them

    # -- proposing ---------------------------------------------------------------------

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]  # FINISHED is a str
        self._settle()
        if self._grid is not None:
            return self._suggest_grid(trial_id)
        for _ in range(_MAX_SKIPS):
            config = super().suggest(trial_id)
            if not isinstance(config, dict):
                return config
            bound = oom_excluded(self._token, {**self._fixed, **config})
            if bound is None:
                return config
            logger.info("skipping %s: batch %d already ran out of memory at that precision", config, bound)
            self._tell_infeasible(self._ot_trials.pop(trial_id), {_FITS: 1.0})
        logger.warning("every proposal is at or above a batch size that ran out of memory; ending the search")
        return self.FINISHED

    def _suggest_grid(self, trial_id: str) -> dict[str, Any] | str | None:
        assert self._grid is not None
        while self._grid:
            point = self._grid.pop(0)
            if oom_excluded(self._token, {**self._fixed, **point}) is None:
                assert self._ot_study is not None
                self._ot_study.enqueue_trial(point)
                return super().suggest(trial_id)
            logger.info("grid: skipping %s, a smaller batch already ran out of memory", point)
        return self.FINISHED

    # -- learning ----------------------------------------------------------------------

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        # The base class indexes result[metric]: intermediate reports may lack the objective.
        if isinstance(self.metric, str) and self.metric in result:
            with warnings.catch_warnings():  # a trial run again after a resume reports its first steps again
                warnings.filterwarnings("ignore", message="The reported value is ignored because", category=UserWarning)
                super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        if trial_id in self._completed_trials or trial_id not in self._ot_trials:
            return
        if error:
            # Tune tells the searcher before its callbacks see the error, so the failure kind
            # is not known yet: settle once the sweep callback has classified it.
            self._deferred[trial_id] = self._ot_trials[trial_id]
            self._completed_trials.add(trial_id)
            return
        result = result or {}
        ot_trial = self._ot_trials[trial_id]
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        values = [result.get(m) for m in metrics]
        finished = result.get(FINAL) == 1  # else stopped early (ASHA, time budget, breaker)
        self._completed_trials.add(trial_id)
        if any(not isinstance(v, (int, float)) for v in values) or not finished:
            assert self._ot_study is not None
            self._ot_study.tell(ot_trial, state=optuna.trial.TrialState.PRUNED)  # stopped early
            return
        for c in self._constraints:
            ot_trial.set_constraint(str(c), c.violation(result.get(c.metric)))
        ot_trial.set_constraint(_FITS, 0.0)
        assert self._ot_study is not None
        try:
            self._ot_study.tell(ot_trial, values if len(values) > 1 else values[0])
        except Exception as exc:  # noqa: BLE001 - e.g. a NaN objective: Optuna marks it FAIL
            logger.warning("Optuna refused trial %s's result: %s", trial_id, exc)

    def _settle(self) -> None:
        """Tell Optuna about errored trials the sweep callback has classified since."""
        failures = shared(self._token).failures
        for trial_id in [t for t in self._deferred if t in failures]:
            ot_trial = self._deferred.pop(trial_id)
            if failures[trial_id] in INFEASIBLE_KINDS:
                self._tell_infeasible(ot_trial, {_FITS: 1.0})
            else:  # a crash or a bug says nothing about the configuration
                assert self._ot_study is not None
                self._ot_study.tell(ot_trial, state=optuna.trial.TrialState.FAIL)

    def _tell_infeasible(self, ot_trial: Any, violations: dict[str, float]) -> None:
        """COMPLETE with constraint violations: TPE ranks it below every feasible trial (the
        value itself is never compared; Optuna needs one, so it is the worst possible)."""
        for c in self._constraints:
            ot_trial.set_constraint(str(c), 1.0)
        for name, v in violations.items():
            ot_trial.set_constraint(name, v)
        assert self._ot_study is not None
        worst = [float("-inf") if d == optuna.study.StudyDirection.MAXIMIZE else float("inf")
                 for d in self._ot_study.directions]
        self._ot_study.tell(ot_trial, worst if len(worst) > 1 else worst[0])


def make_searcher(spec: SweepSpec, token: str) -> SweepSearch | None:
    """Seeded search over the searched knobs; None (Tune's plain repeats) when all are fixed."""
    if not spec.space.searched():
        return None
    if spec.search.algorithm == "random":
        sampler: optuna.samplers.BaseSampler = optuna.samplers.RandomSampler(seed=spec.seed)
    else:  # TPE also serves grid mode, whose points are enqueued in order
        sampler = optuna.samplers.TPESampler(seed=spec.seed)
    obj = spec.objective
    return SweepSearch(
        space=optuna_space(spec),
        metric=list(obj.metrics) if obj.multi else obj.primary,
        mode=list(obj.modes) if obj.multi else obj.primary_mode,
        sampler=sampler,  # seeded; OptunaSearch ignores its own seed when given a sampler
        token=token,
        fixed=spec.space.fixed(),
        constraints=obj.constraints,
        grid=spec.space.grid_points() if spec.search.algorithm == "grid" else None,
    )


def make_scheduler(spec: SweepSpec) -> TrialScheduler:
    """ASHA on measured steps when early stopping is on: every trial is compared with others at
    the same number of steps (rungs at grace_steps * reduction_factor**k)."""
    es = spec.search.early_stopping
    if es is None:
        return FIFOScheduler()
    return ASHAScheduler(
        time_attr=STEPS,
        metric=spec.objective.primary,
        mode=spec.objective.primary_mode,
        max_t=spec.budget.num_steps,
        grace_period=es.grace_steps,
        reduction_factor=es.reduction_factor,
    )
