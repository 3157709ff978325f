"""The whole spec: its sections (each its own model), defaults that depend on another section, and the
rules across sections (`rules.RULES`), all run at construction."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from sweeps.spec.errors import RuleProblems
from sweeps.spec.objective import ObjectiveSpec
from sweeps.spec.params import STRICT
from sweeps.spec.rules import problems
from sweeps.spec.sections import (
    BudgetSpec,
    LrScalingSpec,
    QualitySpec,
    ScalingSpec,
    SearchSpec,
    TelemetrySpec,
    TrackingSpec,
    TrainableSpec,
)
from sweeps.spec.space import SpaceSpec
from trainables import registry
from trainables.contract import throughput_key
from trainables.errors import WorkloadError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # matched whole (fullmatch): "abc\n" is refused


class SweepSpec(BaseModel):
    model_config = STRICT
    name: str
    description: str = ""
    trainable: TrainableSpec
    # default_factory: pydantic shares a default model instance between specs
    space: SpaceSpec = Field(default_factory=lambda: SpaceSpec())
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
    def _rules(self) -> SweepSpec:
        """Every rule across sections (`sweeps.spec.rules`); all their problems at once."""
        found = problems(self)
        if found:
            raise RuleProblems(found)
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
