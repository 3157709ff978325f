"""The `objective` section: what trials are ranked by, and what they must meet to count.

One metric, or several: a Pareto front; the constraints a trial must meet to count, and a quality target
for time to target."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from sweeps.spec.params import STRICT
from trainables.contract import (
    COST_PREFIX,
    ENERGY_PREFIX,
    KNOWN_METRICS,
    STEP_TIME_MS,
    SWEEP_LEVEL_METRICS,
    THROUGHPUT_PREFIX,
    TIME_PREFIX,
    TIME_TO_TARGET_S,
    TO_TARGET_METRICS,
    is_known_metric,
    target_problem,
    throughput_key,
)

Mode = Literal["max", "min"]


def known_metric(metric: str) -> str:
    if not is_known_metric(metric):
        raise ValueError(f"unknown metric {metric!r}; choose one of {list(KNOWN_METRICS)}, or eval/<name> for a "
                         "metric of the trainable's eval_fn")
    return metric


class ConstraintSpec(BaseModel):
    """A bound a trial must meet to count (e.g. `loss/val` <= 2.5); the search learns where it fails."""

    model_config = STRICT
    metric: str = Field(description="a metric the trials report (the metrics reference), or `eval/<name>`")
    max: float | None = Field(default=None, allow_inf_nan=False, description="the metric must be at most this")
    min: float | None = Field(default=None, allow_inf_nan=False, description="the metric must be at least this")

    @field_validator("metric")
    @classmethod
    def _known(cls, metric: str) -> str:
        return known_metric(metric)

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
        problem = target_problem(self.metric, self.max, self.min, eval_every_steps=1)
        if problem:
            raise ValueError(problem)
        return self


class ObjectiveSpec(BaseModel):
    """One metric and mode, or lists of them (multi-objective: the result is a Pareto front)."""

    model_config = STRICT
    metric: str | list[str] = Field(default=throughput_key("samples"), description="the metric trials are ranked by, "
                                    "or a list of them (a Pareto front); without one, the workload's own throughput")
    mode: Mode | list[Mode] = Field(default="max", description="max or min, or a list of them, one per metric")
    constraints: list[ConstraintSpec] = Field(default_factory=list, description="bounds a trial must meet to count, "
                                              "e.g. {metric: loss/val, max: 2.5}: the search learns where they fail")
    target: TargetSpec | None = Field(default=None, description="time to quality: every trial evaluates every "
                                      "budget.eval_every_steps and stops when this is met; objective time/to_target_s")

    @model_validator(mode="before")
    @classmethod
    def _ttt_mode(cls, data: Any) -> Any:
        """Time or dollars to the target are minimised: fill the mode in when one is the only metric and no
        mode is given."""
        if isinstance(data, dict) and data.get("metric") in TO_TARGET_METRICS and "mode" not in data:
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
            known_metric(m)
            if m in SWEEP_LEVEL_METRICS:
                instead = "cost/usd_to_target or cost/usd_per_1m_<unit>" if m.startswith(COST_PREFIX) else TIME_TO_TARGET_S
                raise ValueError(f"{m} is computed by the sweep after its trials end, so trials cannot be ranked "
                                 f"by it while the search runs; rank by {instead} (measured) instead")
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
        for metric, mode in zip(self.metrics, self.modes, strict=True):
            if metric in TO_TARGET_METRICS and self.target is None:
                raise ValueError(f"{metric} needs a target: add target: {{metric: loss/val, max: <value>}}")
            if metric in TO_TARGET_METRICS and mode != "min":
                raise ValueError(f"{metric} is {'a time' if metric.startswith(TIME_PREFIX) else 'a price'}: mode must "
                                 "be min")
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
        """Whether trials are ranked by what it takes to reach a target (time or dollars, `TO_TARGET_METRICS`).

        ASHA then compares the target metric at equal training time, and a trial that never reached it missed it."""
        return self.target is not None and self.primary in TO_TARGET_METRICS

    @property
    def primary_mode(self) -> str:
        return self.modes[0]

    @property
    def speed_only(self) -> bool:
        """Whether every objective metric measures speed and nothing constrains quality.

        Speed: throughput, step time, energy per item. That is what a time box may shorten without changing what
        is compared."""
        return not self.constraints and all(m.startswith((THROUGHPUT_PREFIX, STEP_TIME_MS, ENERGY_PREFIX))
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
