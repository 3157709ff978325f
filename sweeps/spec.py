"""Sweep spec: strict YAML -> typed, frozen models.

Every problem is reported at once, each with its field path, YAML line, the bad value and
what is allowed. Loading runs no code: `yaml.safe_load` semantics, aliases refused.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from sweeps.errors import InputError
from sweeps.store import DEFAULT_URI, file_store_problem
from trainables import registry
from trainables.contract import (
    KNOWN_METRICS,
    LR_SCHEDULES,
    PRECISIONS,
    SWEEP_LEVEL_METRICS,
    TIME_TO_TARGET_S,
    is_final_only,
    is_known_metric,
    throughput_key,
)
from trainables.errors import WorkloadError

_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)
Scalar = bool | int | float | str
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # matched whole (fullmatch): "abc\n" is refused


@dataclass(frozen=True)
class SpecProblem:
    path: str
    message: str
    value: Any = None
    line: int | None = None

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        shown = "" if self.value is None else f" (got {self.value!r})"
        return f"{where}{self.path or '<root>'}: {self.message}{shown}"


class SpecError(InputError):
    """A spec that cannot run; `problems` lists every issue found."""

    def __init__(self, source: str, problems: list[SpecProblem]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s)\n" + "\n".join(f"  {p}" for p in problems))


# --- parameter vocabulary (Optuna's) ---------------------------------------------------


class FloatParam(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = None

    @model_validator(mode="after")
    def _range(self) -> FloatParam:
        if not self.low <= self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError("log=true needs low > 0")
        if self.log and self.step is not None:
            raise ValueError("log and step cannot be combined (Optuna)")
        return self


class IntParam(BaseModel):
    model_config = _STRICT
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = 1

    @model_validator(mode="after")
    def _range(self) -> IntParam:
        if not self.low <= self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError("log=true needs low >= 1 and step 1 (Optuna)")
        return self


class CategoricalParam(BaseModel):
    model_config = _STRICT
    type: Literal["categorical"]
    choices: list[Scalar] = Field(min_length=1)


class FixedParam(BaseModel):
    """A plain value in the spec (`pin_memory: false`): held constant, still logged."""

    model_config = _STRICT
    type: Literal["fixed"]
    value: Scalar


Param = Annotated[FloatParam | IntParam | CategoricalParam | FixedParam, Field(discriminator="type")]


def _wrap_fixed(value: Any) -> Any:
    return value if isinstance(value, dict) else {"type": "fixed", "value": value}


# Loop knobs a sweep may search: default, the type of a value, the rule it must meet.
KNOBS: dict[str, tuple[Scalar, type, str]] = {
    # ranks per trial (one GPU each with use_gpu); not in the space: scaling.num_workers
    "num_workers": (2, int, "an integer >= 1 (ranks per trial, one GPU each with use_gpu)"),
    "batch_size": (32, int, "an integer >= 1 (per worker)"),
    "precision": ("32", str, f"one of {list(PRECISIONS)}"),
    "lr": (1e-3, float, "a number > 0"),
    "num_dataloader_workers": (0, int, "an integer >= 0"),
    "pin_memory": (False, bool, "true or false"),
    "prefetch_factor": (2, int, "an integer >= 1 (batches per loader worker in flight)"),
    "persistent_workers": (True, bool, "true or false"),
    "compile": (False, bool, "true or false"),
    "tf32_under_autocast": (False, bool, "true or false (mixed precisions on CUDA: fp32 matmuls left by autocast use TF32)"),
    # Optimisation knobs: a spec that does not name one gets the default (and it is still logged).
    "grad_accum_steps": (1, int, "an integer >= 1 (micro-batches per optimizer step)"),
    "max_grad_norm": (0.0, float, "a number >= 0 (0: no clipping)"),
    "lr_warmup_steps": (0, int, "an integer >= 0 (optimizer steps of linear LR warm-up)"),
    "lr_schedule": ("constant", str, f"one of {list(LR_SCHEDULES)}"),
}
OPTIM_KNOBS = ("grad_accum_steps", "lr_schedule", "lr_warmup_steps", "max_grad_norm")
PARAMS_PREFIX = "params."  # space.params.<name>: the trainable's own hyperparameters
_MINIMUM = {"num_dataloader_workers": 0, "lr_warmup_steps": 0, "max_grad_norm": 0.0}  # else > 0 (float), >= 1 (int)


def _knob_ok(knob: str, value: Any) -> bool:
    kind = KNOBS[knob][1]
    if kind is float:
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return number and (value >= _MINIMUM[knob] if knob in _MINIMUM else value > 0)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        return False
    if kind is int:
        return isinstance(value, int) and value >= _MINIMUM.get(knob, 1)
    if knob == "precision":
        return value in PRECISIONS
    if knob == "lr_schedule":
        return value in LR_SCHEDULES
    return True


def _param_values(p: Any) -> list[Any]:
    if isinstance(p, (FloatParam, IntParam)):
        return [p.low, p.high]
    if isinstance(p, CategoricalParam):
        return list(p.choices)
    return [p.value]


class SpaceSpec(BaseModel):
    """The loop's knobs and the trainable's own params (`params.<name>`), each fixed or searched."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    num_workers: Param | None = None  # None: scaling.num_workers
    batch_size: Param = FixedParam(type="fixed", value=32)
    precision: Param = FixedParam(type="fixed", value="32")
    lr: Param = FixedParam(type="fixed", value=1e-3)
    num_dataloader_workers: Param = FixedParam(type="fixed", value=0)
    pin_memory: Param = FixedParam(type="fixed", value=False)
    prefetch_factor: Param = FixedParam(type="fixed", value=2)
    persistent_workers: Param = FixedParam(type="fixed", value=True)
    compile: Param = FixedParam(type="fixed", value=False)
    tf32_under_autocast: Param | None = None
    grad_accum_steps: Param | None = None
    max_grad_norm: Param | None = None
    lr_warmup_steps: Param | None = None
    lr_schedule: Param | None = None
    params: dict[str, Param] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _fixed_scalars(cls, data: Any) -> Any:
        """Plain values are fixed params; `params.<name>: ...` keys go under `params`."""
        if not isinstance(data, dict):
            return data
        out: dict[str, Any] = {k: v if k == "params" else _wrap_fixed(v) for k, v in data.items()
                               if not str(k).startswith(PARAMS_PREFIX)}
        own = data.get("params", {})
        if not isinstance(own, dict):
            return out
        own = dict(own)
        for key, value in data.items():
            if str(key).startswith(PARAMS_PREFIX):
                name = str(key)[len(PARAMS_PREFIX):]
                if name in own:
                    raise ValueError(f"params.{name} is given twice (as params.{name} and under params:); keep one")
                own[name] = value
        if own:
            out["params"] = {k: _wrap_fixed(v) for k, v in own.items()}
        return out

    @field_validator(*KNOBS)
    @classmethod
    def _knob_values(cls, p: Any, info: ValidationInfo) -> Any:
        knob = str(info.field_name)
        kind, rule = KNOBS[knob][1], KNOBS[knob][2]
        if p is None:
            return p
        if isinstance(p, (FloatParam, IntParam)) and kind not in (int, float):
            raise ValueError(f"a {p.type} range is not allowed here; values must be {rule}")
        if isinstance(p, FloatParam) and kind is int:
            raise ValueError(f"type float is not allowed; values must be {rule} (use type: int)")
        bad = [v for v in _param_values(p) if not _knob_ok(knob, v)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not allowed; values must be {rule}")
        return p

    def _all(self) -> dict[str, Param]:
        """Every knob the spec sets (built-in or its own, `params.<name>`), fixed or searched."""
        knobs = {k: getattr(self, k) for k in KNOBS if getattr(self, k) is not None}
        return knobs | {PARAMS_PREFIX + k: v for k, v in self.params.items()}

    def searched(self) -> dict[str, Param]:
        return {k: p for k, p in self._all().items() if not isinstance(p, FixedParam)}

    def fixed(self) -> dict[str, Scalar]:
        return {k: p.value for k, p in self._all().items() if isinstance(p, FixedParam)}

    def grid_values(self) -> dict[str, list[Scalar]]:
        """Each searched knob's values for grid search, smallest batch first."""
        values: dict[str, list[Scalar]] = {}
        for k, p in self.searched().items():
            if isinstance(p, CategoricalParam):
                values[k] = sorted(p.choices) if k == "batch_size" else list(p.choices)  # type: ignore[type-var]
            elif isinstance(p, IntParam) and not p.log:
                values[k] = list(range(p.low, p.high + 1, p.step))
            elif isinstance(p, FloatParam) and p.step is not None:
                n = int(round((p.high - p.low) / p.step))
                values[k] = [round(p.low + i * p.step, 12) for i in range(n + 1)]
            else:
                raise ValueError(f"search.algorithm: grid needs a finite set of values, but space.{k} is a "
                                 "continuous or log range; give it choices (type: categorical) or a step")
        return values

    def grid_points(self) -> list[dict[str, Scalar]]:
        """Every combination once; batch size varies fastest (ascending), so an out-of-memory
        batch is met before the larger ones it rules out (the classic precision x batch table);
        the worker count slowest, so a warm group serves all trials of its size before it is resized."""
        values = self.grid_values()
        rank = {k: i for i, k in enumerate(self._all())}
        order = sorted(values, key=lambda k: (k != "num_workers", k == "batch_size", rank[k]))
        return [dict(zip(order, combo, strict=True)) for combo in itertools.product(*(values[k] for k in order))]


# --- the other sections ----------------------------------------------------------------


class TrainableSpec(BaseModel):
    model_config = _STRICT
    name: str
    params: dict[str, Any] = {}

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        registry.check_name(name)
        return name

    @field_validator("params")
    @classmethod
    def _params(cls, params: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("name")
        problems = registry.check_params(name, params) if name else []
        if problems:
            raise ValueError("; ".join(problems))
        return params


Mode = Literal["max", "min"]


def _known_metric(metric: str) -> str:
    if not is_known_metric(metric):
        raise ValueError(f"unknown metric {metric!r}; choose one of {list(KNOWN_METRICS)}, or eval/<name> for a "
                         "metric of the trainable's eval_fn")
    return metric


class ConstraintSpec(BaseModel):
    """A bound a trial must meet to count (e.g. `loss/val` <= 2.5); the search learns where it fails."""

    model_config = _STRICT
    metric: str
    max: float | None = Field(default=None, allow_inf_nan=False)
    min: float | None = Field(default=None, allow_inf_nan=False)

    @field_validator("metric")
    @classmethod
    def _known(cls, metric: str) -> str:
        return _known_metric(metric)

    @model_validator(mode="after")
    def _bound(self) -> ConstraintSpec:
        if self.max is None and self.min is None:
            raise ValueError("give max: and/or min: (e.g. {metric: loss/val, max: 2.5})")
        if self.max is not None and self.min is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self

    def violation(self, value: float | None) -> float:
        """> 0 when violated (by how much), <= 0 when met; a missing or NaN value violates."""
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return 1.0
        over = value - self.max if self.max is not None else -math.inf
        under = self.min - value if self.min is not None else -math.inf
        return float(max(over, under))

    def __str__(self) -> str:
        parts = [f"{self.min:g} <=" if self.min is not None else "", self.metric,
                 f"<= {self.max:g}" if self.max is not None else ""]
        return " ".join(p for p in parts if p)


class TargetSpec(ConstraintSpec):
    """The quality a time-to-target trial must reach (e.g. `loss/val` <= 3.2); one bound only."""

    @model_validator(mode="after")
    def _one_bound(self) -> TargetSpec:
        if self.max is not None and self.min is not None:
            raise ValueError("a target is one bound: max (reach at most, e.g. a loss) or min (at least, e.g. accuracy)")
        return self


class ObjectiveSpec(BaseModel):
    """One metric and mode, or lists of them (multi-objective: the result is a Pareto front)."""

    model_config = _STRICT
    metric: str | list[str] = "throughput/samples_per_s"
    mode: Mode | list[Mode] = "max"
    constraints: list[ConstraintSpec] = Field(default_factory=list)
    target: TargetSpec | None = Field(default=None, description="time to quality: every trial evaluates every "
                                      "budget.eval_every_steps and stops when this is met; objective time/to_target_s")

    @model_validator(mode="before")
    @classmethod
    def _ttt_mode(cls, data: Any) -> Any:
        """time/to_target_s is minimised: fill the mode in when it is the only metric and no mode is given."""
        if isinstance(data, dict) and data.get("metric") == TIME_TO_TARGET_S and "mode" not in data:
            return {**data, "mode": "min"}
        return data

    @field_validator("metric", mode="before")
    @classmethod
    def _known(cls, metric: Any) -> Any:
        if isinstance(metric, list) and (not metric or len(set(map(str, metric))) != len(metric)):
            raise ValueError("a list of metrics must hold at least one metric, each once")
        for m in metric if isinstance(metric, list) else [metric]:
            if not isinstance(m, str):
                raise ValueError("a metric name, or a list of them (multi-objective)")
            _known_metric(m)
            if m in SWEEP_LEVEL_METRICS:
                raise ValueError(f"{m} is computed by the sweep after its trials end, so trials cannot be ranked "
                                 f"by it while the search runs; rank by {TIME_TO_TARGET_S} (measured) instead")
        return metric

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, mode: Any) -> Any:
        if any(m not in ("max", "min") for m in (mode if isinstance(mode, list) else [mode])):
            raise ValueError("must be max or min (or a list of them, one per metric)")
        return mode

    @model_validator(mode="after")
    def _modes(self) -> ObjectiveSpec:
        if isinstance(self.metric, list) != isinstance(self.mode, list) or (
            isinstance(self.mode, list) and len(self.mode) != len(self.metric)
        ):
            raise ValueError(f"give one mode per metric: {len(self.metrics)} metric(s) need a list of "
                             f"{len(self.metrics)} mode(s), e.g. mode: {['max'] * len(self.metrics)}"
                             if isinstance(self.metric, list) else "one metric takes one mode (max or min), not a list")
        if TIME_TO_TARGET_S in self.metrics and self.target is None:
            raise ValueError(f"{TIME_TO_TARGET_S} needs a target: add target: {{metric: loss/val, max: <value>}}")
        for metric, mode in zip(self.metrics, self.modes, strict=True):
            if metric == TIME_TO_TARGET_S and mode != "min":
                raise ValueError(f"{TIME_TO_TARGET_S} is a time: mode must be min")
        return self

    @property
    def metrics(self) -> tuple[str, ...]:
        return (self.metric,) if isinstance(self.metric, str) else tuple(self.metric)

    @property
    def modes(self) -> tuple[str, ...]:
        return (self.mode,) if isinstance(self.mode, str) else tuple(self.mode)

    @property
    def primary(self) -> str:
        """The metric trials are ranked by (the first one of a multi-objective sweep)."""
        return self.metrics[0]

    @property
    def time_to_target(self) -> bool:
        """Ranked by time to a target: ASHA then compares the target metric at equal training time."""
        return self.target is not None and self.primary == TIME_TO_TARGET_S

    @property
    def primary_mode(self) -> str:
        return self.modes[0]

    @property
    def speed_only(self) -> bool:
        """Every objective metric measures speed (throughput, step time, energy per item) and nothing
        constrains quality: what a time box may shorten without changing what is compared."""
        return not self.constraints and all(m.startswith(("throughput/", "time/step_ms", "energy/"))
                                            for m in self.metrics)

    @property
    def multi(self) -> bool:
        return len(self.metrics) > 1

    def feasible(self, metrics: dict[str, Any]) -> bool:
        return all(c.violation(metrics.get(c.metric)) <= 0 for c in self.constraints)

    def describe(self) -> str:
        text = ", ".join(f"{mo} {me}" for me, mo in zip(self.metrics, self.modes, strict=True))
        if self.constraints:
            text += " subject to " + " and ".join(str(c) for c in self.constraints)
        return text


class EarlyStoppingSpec(BaseModel):
    """ASHA: at rungs grace * reduction_factor**k, keep the best 1/reduction_factor of trials. The
    grace is in measured steps, or, for a time-to-target objective, in seconds of training."""

    model_config = _STRICT
    grace_steps: int | None = Field(default=None, ge=1, description="measured steps every trial runs before it "
                                    "may be stopped (trials compared at equal steps)")
    grace_s: float | None = Field(default=None, gt=0, description="with objective.target: seconds of training "
                                  "(evaluations counted) before a trial may be stopped; trials are compared on the "
                                  "target metric at equal training time")
    reduction_factor: int = Field(default=3, ge=2)

    @model_validator(mode="after")
    def _one_grace(self) -> EarlyStoppingSpec:
        if (self.grace_steps is None) == (self.grace_s is None):
            raise ValueError("give exactly one of grace_steps (measured steps) or grace_s (seconds of training, "
                             "for a time-to-target objective)")
        return self


class SearchSpec(BaseModel):
    model_config = _STRICT
    algorithm: Literal["tpe", "random", "grid"] = Field(
        default="tpe", description="tpe: Optuna TPE (constraint-aware); random; grid: every combination once")
    early_stopping: EarlyStoppingSpec | None = None
    probe_batch_size: bool = Field(default=False, description="before the search, find the largest batch size "
                                   "that fits for every combination of precision, compile and categorical params "
                                   "(a few steps per candidate, binary search on the warm workers); a batch the "
                                   "probe saw fail is never run unless the probe measured that combination")
    when_exhausted: Literal["stop", "replicate"] = Field(
        default="stop", description="a configuration is never run twice; when every configuration of a finite "
        "space has run before num_trials: stop (and say so), or replicate: spend the rest on replicates of the "
        "best configuration and those within noise of it (a close call settled by more measurements)")
    trials_per_size: int | None = Field(
        default=None, ge=1, description="with num_workers searched by tpe or random: trials run back to back on one "
        "worker count before the search may change it (each change restarts a warm worker group); default "
        "num_trials / (worker counts + 1): one run per count, then runs of the count the sampler picks")


GPU_MIN_WINDOW_S = 10.0
# Time boxes (num_steps with a speed objective): (max_window_s, max_warmup_s) on GPU and on CPU
GPU_TIME_BOX_S = (30.0, 10.0)
CPU_TIME_BOX_S = (5.0, 3.0)


class BudgetSpec(BaseModel):
    model_config = _STRICT
    num_trials: int = Field(ge=1, le=10_000)
    max_concurrent_trials: int = Field(default=1, ge=1)
    num_steps: int | None = Field(default=None, ge=1, description="measured steps per trial, after warm-up (equal "
                                  "steps: right for throughput alone)")
    num_samples: int | None = Field(default=None, ge=1, description="equal data: every trial trains on this many "
                                    "samples (all workers, warm-up included) whatever its global batch size")
    num_tokens: int | None = Field(default=None, ge=1, description="equal data for a token-counting trainable")
    eval_every_steps: int | None = Field(default=None, ge=1, description="evaluate on the validation set every this "
                                         "many optimizer steps (needed by objective.target)")
    num_warmup_steps: int = Field(default=5, ge=0)
    min_window_s: float | None = Field(default=None, ge=0, description="with num_steps: each trial's measured window "
                                       "lasts at least this long, running more steps than num_steps if needed (the "
                                       "number run is logged as progress/steps); default 10 on GPU, 0 on CPU")
    max_window_s: float | None = Field(default=None, gt=0, description="with num_steps: each trial's measured window "
                                       "ends once it lasts this long, with fewer steps than num_steps if need be (never "
                                       "fewer than the 3 sub-windows the throughput's noise figure needs); default 30 on "
                                       "GPU, 5 on CPU; off by default with objective.constraints (a quality constraint "
                                       "wants equal steps)")
    max_warmup_s: float | None = Field(default=None, gt=0, description="with num_steps: warm-up ends once its timed "
                                       "steps (after step 0, which builds, starts loaders and compiles) last this long, "
                                       "with fewer steps than num_warmup_steps if need be (never fewer than 2); "
                                       "default 10 on GPU, 3 on CPU")
    report_interval_s: float = Field(default=10.0, gt=0)
    max_retries: int = Field(default=1, ge=0, description="re-runs of a trial whose worker or node died "
                             "(transient); other failures are final")
    max_identical_failures: int = Field(default=3, ge=0, description="stop the sweep after this many trials "
                                        "in a row fail with the same error (0: never)")
    loader_timeout_s: float = Field(default=120.0, ge=0, description="longest a step waits for one batch from "
                                    "a dataloader worker before the trial fails (0: forever)")
    collective_timeout_s: float = Field(default=600.0, gt=0, description="process-group timeout: a rank "
                                        "stuck in a collective (a hung peer) fails the trial after this")
    checkpoint_every_steps: int = Field(default=0, ge=0, description="measured steps between checkpoints "
                                        "(0: none); a trial whose worker or node died resumes from the last one")
    time_budget_s: float | None = Field(default=None, gt=0, description="wall-clock limit for the whole sweep: "
                                        "no trial starts after it, running ones are stopped")

    @model_validator(mode="after")
    def _one_length(self) -> BudgetSpec:
        given = [k for k in ("num_steps", "num_samples", "num_tokens") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one trial length: num_steps (equal steps, for throughput), or num_samples "
                             "/ num_tokens (equal data: loss and time to target comparable across batch sizes)"
                             + (f"; got {' and '.join(given)}" if given else ""))
        if self.num_steps is None and self.min_window_s:
            raise ValueError(f"min_window_s: {self.min_window_s:g} has no effect with {given[0]}: an equal-data budget "
                             "sets each trial's length (its data, not the clock); remove min_window_s, or use num_steps")
        boxed = [k for k in ("max_window_s", "max_warmup_s") if getattr(self, k) is not None]
        if self.num_steps is None and boxed:
            raise ValueError(f"{boxed[0]}: {getattr(self, boxed[0]):g} has no effect with {given[0]}: an equal-data "
                             f"budget sets each trial's length (its data, not the clock); remove {boxed[0]}, or use "
                             "num_steps")
        if self.max_window_s is not None and self.num_warmup_steps < 2:
            raise ValueError(f"max_window_s: {self.max_window_s:g} plans each window's steps from a timed warm-up "
                             f"step, and num_warmup_steps: {self.num_warmup_steps} times none; set num_warmup_steps "
                             ">= 2, or remove max_window_s")
        if self.max_window_s is not None and self.min_window_s and self.max_window_s < self.min_window_s:
            raise ValueError(f"max_window_s: {self.max_window_s:g} is below min_window_s: {self.min_window_s:g}; "
                             "raise max_window_s or lower min_window_s")
        if self.num_steps is None and self.num_warmup_steps < 1:
            raise ValueError(f"{given[0]} plans each trial's steps from its warm-up's items per step: "
                             "num_warmup_steps must be >= 1")
        return self

    def window_s(self, use_gpu: bool, steps_fixed: bool = False) -> float:
        """The measured window's least length: as given, else 10 s on GPU (a GPU step takes milliseconds:
        a window of a few steps is shorter than two telemetry samples) and 0 on CPU (a CPU step takes
        tens of milliseconds or more, so num_steps already spans seconds). An equal-data budget rules,
        and so does ASHA on steps (`steps_fixed`: it compares and ends trials at num_steps)."""
        if self.num_items or steps_fixed:
            return 0.0
        return self.min_window_s if self.min_window_s is not None else (GPU_MIN_WINDOW_S if use_gpu else 0.0)

    def time_box(self, use_gpu: bool, steps_fixed: bool = False, constrained: bool = False) -> tuple[float, float]:
        """(max_window_s, max_warmup_s), 0 where off: as given, else 30/10 s on GPU and 5/3 s on CPU, so with
        a speed objective every trial costs about the same seconds whatever its step time. Off with an
        equal-data budget and ASHA on steps (they set the length); a quality objective or constraint
        (`constrained`) leaves them off unless given (its metric wants equal steps), and so does a warm-up
        too short to time a step (the window's steps are planned from it). The window never ends below
        the least window (min_window_s, or 10 s on GPU)."""
        if self.num_items or steps_fixed:
            return 0.0, 0.0
        window, warmup = GPU_TIME_BOX_S if use_gpu else CPU_TIME_BOX_S
        if self.num_warmup_steps < 2:
            window = warmup = 0.0
        window = self.max_window_s if self.max_window_s is not None else (0.0 if constrained else window)
        warmup = self.max_warmup_s if self.max_warmup_s is not None else (0.0 if constrained else warmup)
        least = self.window_s(use_gpu, steps_fixed)
        return (max(window, least) if window else 0.0), warmup

    @property
    def num_items(self) -> int:
        """The equal-data budget (0 with num_steps)."""
        return self.num_samples or self.num_tokens or 0

    @property
    def item_unit(self) -> str | None:
        return "samples" if self.num_samples else "tokens" if self.num_tokens else None


class LrScalingSpec(BaseModel):
    """The searched lr is the rate at `reference_batch_size` (global); each trial runs it scaled to its own
    global batch: linear (Goyal et al. 2017, SGD) or sqrt (Adam-family)."""

    model_config = _STRICT
    rule: Literal["linear", "sqrt", "none"]
    reference_batch_size: int = Field(ge=1, description="the global batch size (batch x accumulation x workers) "
                                      "the searched lr is meant for")

    def factor(self, global_batch: int) -> float:
        ratio = global_batch / self.reference_batch_size
        return ratio if self.rule == "linear" else math.sqrt(ratio) if self.rule == "sqrt" else 1.0


class QualitySpec(BaseModel):
    """The convergence guardrail: at equal data, a trial whose loss/val is worse than the sweep's fp32
    reference by more than `tolerance` (relative) is degraded: shown, never ranked best."""

    model_config = _STRICT
    tolerance: float = Field(default=0.05, ge=0, description="relative gap to the fp32 reference's loss/val "
                             "(0.05: 5% worse) past which a trial is degraded")


class ScalingSpec(BaseModel):
    model_config = _STRICT
    num_workers: int = Field(default=2, ge=1)
    use_gpu: bool = False
    cpus_per_worker: int = Field(default=1, ge=1)
    gpus_per_worker: float = Field(default=0.0, ge=0)
    accelerator_type: str | None = Field(default=None, description="Ray's accelerator label (e.g. H100, A100): "
                                         "every rank of every trial lands on this GPU type")
    cpus_per_loader_worker: float = Field(default=1.0, ge=0, description="CPUs reserved for each dataloader "
                                          "worker process of a rank, on top of cpus_per_worker")
    reuse_workers: bool = Field(default=True, description="warm worker groups: one long-lived Ray Train group per "
                                "concurrency slot serves trial after trial (start-up paid once per slot); false: "
                                "a new Ray Train run for every trial")

    def cpus_per_rank(self, loader_workers: int) -> float:
        """What one Train worker reserves: its own cores and its loader worker processes' share."""
        return self.cpus_per_worker + loader_workers * self.cpus_per_loader_worker

    def per_trial(self, loader_workers: int = 0, num_workers: int | None = None) -> dict[str, float]:
        """What one trial of `num_workers` ranks (default: this section's) holds at once: all its
        workers start together."""
        n = self.num_workers if num_workers is None else num_workers
        return {"CPU": n * self.cpus_per_rank(loader_workers), "GPU": n * self.gpus_per_worker}

    @model_validator(mode="after")
    def _gpus(self) -> ScalingSpec:
        if self.use_gpu and self.gpus_per_worker == 0:
            object.__setattr__(self, "gpus_per_worker", 1.0)
        if not self.use_gpu and self.gpus_per_worker > 0:
            raise ValueError("gpus_per_worker > 0 needs use_gpu: true")
        if self.use_gpu and self.gpus_per_worker != 1:
            why = ("two or more ranks would share one GPU: NCCL refuses two ranks on one device, and their "
                   "utilisation, memory and MFU could not be told apart" if self.gpus_per_worker < 1 else
                   "the DDP loop drives one GPU per rank; the others would sit idle while counted in MFU")
            raise ValueError(f"gpus_per_worker must be 1 with use_gpu ({why}); for more GPUs per trial raise "
                             "num_workers (one rank per GPU)")
        if self.accelerator_type is not None and not self.use_gpu:
            raise ValueError("accelerator_type pins GPU workers to a GPU type; it needs use_gpu: true")
        return self


class TelemetrySpec(BaseModel):
    model_config = _STRICT
    period_s: float = Field(default=1.0, ge=0, description="NVML/psutil sampling period; 0 turns sampling off")


class TrackingSpec(BaseModel):
    model_config = _STRICT
    uri: str | None = Field(default=None, description="MLflow URI; default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    experiment: str | None = Field(default=None, description="default: the sweep name")

    @field_validator("uri")
    @classmethod
    def _supported(cls, uri: str | None) -> str | None:
        problem = file_store_problem(uri) if uri is not None else None
        if problem:
            raise ValueError(problem)
        return uri

    def resolved_uri(self) -> str:
        return self.uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


class SweepSpec(BaseModel):
    model_config = _STRICT
    name: str
    description: str = ""
    trainable: TrainableSpec
    # default_factory: pydantic shares a default model instance between specs
    space: SpaceSpec = Field(default_factory=SpaceSpec)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    search: SearchSpec = Field(default_factory=SearchSpec)
    budget: BudgetSpec
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    telemetry: TelemetrySpec = Field(default_factory=TelemetrySpec)
    lr_scaling: LrScalingSpec | None = None
    quality: QualitySpec = Field(default_factory=QualitySpec)
    storage_path: str = "ray_results"
    data_dir: str = ".cache/datasets"
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _default_objective(cls, data: Any) -> Any:
        """Without an objective metric, optimise the workload's own throughput unit."""
        if not isinstance(data, dict):
            return data
        trainable, objective = data.get("trainable"), data.get("objective") or {}
        name = trainable.get("name") if isinstance(trainable, dict) else None
        if not isinstance(name, str) or not isinstance(objective, dict) or "metric" in objective:
            return data
        try:
            unit = registry.unit(name)  # a user trainable's declared UNIT is read, not run
        except WorkloadError:
            return data  # the trainable's own validator reports it
        return {**data, "objective": {**objective, "metric": throughput_key(unit)}} if unit else data

    @model_validator(mode="after")
    def _objective_unit(self) -> SweepSpec:
        """Refuse a throughput objective in the other unit than the workload reports."""
        unit = registry.unit(self.trainable.name)
        for metric in self.objective.metrics + tuple(c.metric for c in self.objective.constraints):
            if unit is None or not metric.startswith("throughput/"):
                continue
            wanted = metric.replace("samples", unit) if unit != "samples" else metric.replace("tokens", unit)
            if wanted != metric:
                raise ValueError(f"objective: {self.trainable.name} reports {wanted}, not {metric}; use that")
        return self

    @model_validator(mode="after")
    def _search(self) -> SweepSpec:
        es, target, ttt = self.search.early_stopping, self.objective.target, self.objective.time_to_target
        if es is not None and self.objective.multi:
            raise ValueError("search.early_stopping: ASHA ranks trials by one metric; remove it or use a single objective")
        if es is not None and ttt and es.grace_s is None and target is not None:
            raise ValueError(f"search.early_stopping: with objective.target, ASHA compares trials on {target.metric} "
                             "at equal training time; give grace_s (seconds of training before a trial may be "
                             "stopped, several evaluations' worth of the slowest trial) instead of grace_steps")
        if es is not None and not ttt and es.grace_s is not None:
            raise ValueError("search.early_stopping.grace_s is for a time-to-target objective (metric "
                             "time/to_target_s with objective.target); use grace_steps (trials compared at equal "
                             "measured steps)")
        if es is not None and not ttt and is_final_only(self.objective.primary):
            raise ValueError(f"search.early_stopping: ASHA compares trials on their progress reports, and "
                             f"{self.objective.primary} is only in a trial's final report (after validation); "
                             "stop early on a throughput objective, or remove early_stopping")
        if es is not None and self.budget.num_steps is not None and es.grace_steps is not None \
                and es.grace_steps >= self.budget.num_steps:
            raise ValueError(f"search.early_stopping.grace_steps ({es.grace_steps}) must be below budget.num_steps "
                             f"({self.budget.num_steps}), or nothing is ever stopped")
        boxed = [k for k in ("max_window_s", "max_warmup_s") if getattr(self.budget, k)]
        if es is not None and es.grace_steps is not None and boxed:
            raise ValueError(f"budget.{boxed[0]}: {getattr(self.budget, boxed[0]):g} would end trials before "
                             "num_steps, where ASHA (search.early_stopping.grace_steps) compares and ends them at equal "
                             f"steps; remove {boxed[0]}, or remove early_stopping")
        if target is not None and (self.budget.max_window_s or self.budget.max_warmup_s):
            raise ValueError("budget.max_window_s / max_warmup_s: with objective.target the target sets each "
                             "trial's length (num_steps at most); remove them")
        if es is not None and es.grace_steps is not None and self.budget.min_window_s:
            raise ValueError(f"budget.min_window_s: {self.budget.min_window_s:g} would run trials past num_steps, "
                             "where ASHA (search.early_stopping.grace_steps) compares and ends them at equal steps; "
                             "remove min_window_s and give a num_steps long enough, or remove early_stopping")
        if es is not None and not ttt and self.budget.num_steps is None:
            raise ValueError("search.early_stopping: ASHA compares trials at equal steps, which an equal-data budget "
                             "does not give; use budget.num_steps with early stopping, add an objective.target "
                             "(then trials are compared at equal training time, early_stopping.grace_s), or remove it")
        b = self.budget
        if target is not None and b.eval_every_steps is None:
            raise ValueError("objective.target: set budget.eval_every_steps (how often each trial checks the target, "
                             "e.g. 20)")
        if target is not None and b.checkpoint_every_steps:
            raise ValueError("objective.target: a time to target cannot be measured across a restart; set "
                             "budget.checkpoint_every_steps: 0 (a crashed trial then reruns whole)")
        if target is not None and not is_final_only(target.metric):
            raise ValueError(f"objective.target.metric: {target.metric} is not measured by an evaluation; use "
                             "loss/val or an eval/<name> metric")
        unit = registry.unit(self.trainable.name)  # None: not declared (a user trainable may count either)
        if b.item_unit is not None and unit is not None and b.item_unit != unit:
            raise ValueError(f"budget.num_{b.item_unit}: {self.trainable.name} counts {unit}; use budget.num_{unit}")
        if self.search.probe_batch_size and not self.scaling.reuse_workers:
            raise ValueError("search.probe_batch_size: the probe runs on warm worker groups; set "
                             "scaling.reuse_workers: true (or drop the probe)")
        if self.search.probe_batch_size and "batch_size" not in self.space.searched():
            raise ValueError("search.probe_batch_size: batch_size is fixed, so there is nothing to probe; search "
                             "it (e.g. batch_size: {type: categorical, choices: [32, 64, 128, 256]}) or drop the probe")
        if self.search.algorithm == "grid":
            points = self.space.grid_points()  # raises naming a knob that has no finite set of values
            if len(points) != self.budget.num_trials:
                sizes = " x ".join(f"{len(v)} {k}" for k, v in self.space.grid_values().items()) or "1"
                raise ValueError(f"budget.num_trials: the grid has {len(points)} combinations ({sizes}); "
                                 f"set num_trials: {len(points)}")
        return self

    def trial_clock(self) -> tuple[float, float, float]:
        """What the clock may do to every trial's length: (min_window_s, max_window_s, max_warmup_s), 0 where
        off. A target sets the length itself; ASHA on steps compares and ends trials at num_steps; a quality
        objective or constraint leaves the boxes off unless given (`BudgetSpec.window_s`, `time_box`)."""
        if self.objective.target is not None:
            return 0.0, 0.0, 0.0
        es, use_gpu = self.search.early_stopping, self.scaling.use_gpu
        steps_fixed = es is not None and es.grace_steps is not None
        window, warmup = self.budget.time_box(use_gpu, steps_fixed, constrained=not self.objective.speed_only)
        return self.budget.window_s(use_gpu, steps_fixed), window, warmup

    def max_loader_workers(self) -> int:
        """The most dataloader workers per rank any trial of the space can start."""
        return int(max(_param_values(self.space.num_dataloader_workers)))

    def worker_counts(self) -> list[int]:
        """Every number of ranks a trial of the space can run on, ascending (`space.num_workers`,
        else `scaling.num_workers` alone)."""
        p = self.space.num_workers
        if p is None:
            return [self.scaling.num_workers]
        if isinstance(p, IntParam):
            return list(range(p.low, p.high + 1, p.step))
        return sorted({int(v) for v in _param_values(p)})

    def first_workers(self) -> int:
        """The ranks a warm group starts with before it has a trial: the first choice (the grid's first), or
        the low end of a range."""
        p = self.space.num_workers
        return self.scaling.num_workers if p is None else int(_param_values(p)[0])

    def fixed_knobs(self) -> dict[str, Scalar]:
        """The space's fixed knobs, with the worker count where the space does not search it."""
        return {"num_workers": self.scaling.num_workers} | self.space.fixed() \
            if self.space.num_workers is None else self.space.fixed()

    def per_trial(self) -> dict[str, float]:
        """What the largest trial the space allows holds at once (loader workers and ranks included)."""
        return self.scaling.per_trial(self.max_loader_workers(), max(self.worker_counts()))

    @model_validator(mode="after")
    def _workers(self) -> SweepSpec:
        """The worker count in one place: space.num_workers (searched or fixed) or scaling.num_workers."""
        if self.space.num_workers is not None and "num_workers" in self.scaling.model_fields_set:
            raise ValueError(f"scaling.num_workers: {self.scaling.num_workers} and space.num_workers are both given; keep "
                             "one (space.num_workers to search it, e.g. {type: categorical, choices: [1, 2, 4]})")
        return self

    @model_validator(mode="after")
    def _own_params(self) -> SweepSpec:
        """`space.params.<name>` must be a param the trainable declares (when it declares them)."""
        own = self.space.params
        both = sorted(set(own) & set(self.trainable.params))
        if both:
            raise ValueError(f"space.params.{both[0]}: also set in trainable.params; keep it in one place "
                             "(space: to search it, trainable.params: to fix it)")
        problems = []
        for name, p in own.items():
            for value in _param_values(p):
                for problem in registry.check_params(self.trainable.name, {name: value}):
                    problems.append(f"space.params.{name}: {problem.removeprefix(f'{name}: ')}")
        if problems:
            raise ValueError(problems[0])
        return self

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        if not _NAME.fullmatch(name) or ".." in name:
            raise ValueError(
                "must be 1-64 letters, digits, '.', '_' or '-', start with a letter or digit, "
                "and contain no '..' (it names folders and MLflow runs)"
            )
        return name


# --- loading ----------------------------------------------------------------------------


_MAX_DEPTH = 32  # a real spec is 4 levels deep; deeper input is hostile (recursion bombs)


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors/aliases (no alias bombs) and keeps node lines."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        event = self.peek_event()
        if self.check_event(yaml.AliasEvent):
            raise yaml.MarkedYAMLError("while composing the spec", None, "aliases (*name) are not allowed", event.start_mark)
        if self._depth >= _MAX_DEPTH:
            raise yaml.MarkedYAMLError("while composing the spec", None, f"nested deeper than {_MAX_DEPTH} levels", event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _lines(node: yaml.Node, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    lines = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            lines.update(_lines(v, path + (str(k.value),)))
            lines[path + (str(k.value),)] = k.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            lines.update(_lines(v, path + (str(i),)))
    return lines


_TAGS = {"float", "int", "categorical", "fixed", "function-after", "function-before"}


def _allowed_keys(section: tuple[str, ...]) -> list[str]:
    model: Any = SweepSpec
    for part in section:
        field = getattr(model, "model_fields", {}).get(part)
        model = field.annotation if field is not None else None
    return sorted(getattr(model, "model_fields", {}))


_FIELD_FIRST = re.compile(r"^([a-z_]+(?:\.[a-z_0-9]+)*): (.*)$", re.S)


def _problem(err: dict[str, Any], lines: dict[tuple[str, ...], int]) -> SpecProblem:
    loc = tuple(str(p) for p in err["loc"] if str(p) not in _TAGS)
    msg = err["msg"].removeprefix("Value error, ")
    named = _FIELD_FIRST.match(msg) if not loc else None
    if named:  # a whole-spec rule names its field first: point there
        loc, msg = tuple(named.group(1).split(".")), named.group(2)
    line = next((lines[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in lines), None)
    if err["type"] == "extra_forbidden" and loc[:-1] == ("space",):
        loop = sorted(k for k in KNOBS if k not in OPTIM_KNOBS)
        msg = (f"unknown key; allowed: {', '.join(loop)}; optimisation: {', '.join(OPTIM_KNOBS)}; the trainable's "
               f"own: {PARAMS_PREFIX}<name>")
    elif err["type"] == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        msg = "unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
    value = err.get("input")
    if isinstance(value, dict) and err["type"] != "missing":
        value = None  # a whole section is noise; the message says what is wrong
    if err["type"] == "missing":
        value = None
    return SpecProblem(".".join(loc), msg, value, line)


def parse_spec(text: str, source: str = "<spec>") -> SweepSpec:
    """Validate YAML text into a `SweepSpec` or raise `SpecError` listing every problem."""
    try:
        loader = _NoAliasLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        reason = getattr(exc, "problem", None) or str(exc)
        raise SpecError(source, [SpecProblem("", f"not valid YAML: {reason}", line=line)]) from None
    if not isinstance(data, dict):
        raise SpecError(source, [SpecProblem("", "the spec must be a YAML mapping (key: value)", type(data).__name__)])
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as exc:
        lines = _lines(node) if node is not None else {}
        problems = [_problem(dict(e), lines) for e in exc.errors()]
        raise SpecError(source, sorted(problems, key=lambda p: p.line or 0)) from None
    except WorkloadError as exc:  # raised outside a field validator
        raise SpecError(source, [SpecProblem("trainable", str(exc))]) from None


def load_spec(path: str | Path) -> tuple[SweepSpec, str]:
    """Read and validate a spec file; returns the spec and its text (kept as an artifact)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise SpecError(str(path), [SpecProblem("", f"cannot read the spec: {exc.strerror}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        kind = "UTF-16 text" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else "not text"
        raise SpecError(str(path), [SpecProblem("", f"the spec must be UTF-8 text; this file is {kind} (byte "
                                                f"{exc.start} cannot be read): save it as UTF-8")]) from None
    if "\x00" in text:
        raise SpecError(str(path), [SpecProblem("", "the spec must be UTF-8 text; this file holds NUL bytes "
                                                "(binary, or UTF-16/32): save it as UTF-8")])
    return parse_spec(text, str(path)), text
