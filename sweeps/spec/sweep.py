"""The whole spec: its sections, defaults that depend on another section, and the rules across sections.

Each section is its own model; the rules across sections (`sweeps.spec.cross_checks.RULES`) all run at
construction."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from sweeps.spec.cost import CostSpec
from sweeps.spec.cross_checks import problems
from sweeps.spec.objective import ObjectiveSpec
from sweeps.spec.params import STRICT
from sweeps.spec.problems import RuleProblems
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
from sweeps.spec.settings import setting_field
from sweeps.spec.space import SpaceSpec
from trainables import registry
from trainables.contract import throughput_key
from trainables.loop_errors import WorkloadError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # matched whole (fullmatch): "abc\n" is refused
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # s3://, gs://, file://, ...
# what pyarrow.fs.FileSystem.from_uri opens (and so Ray Tune, which opens storage_path the same way)
_STORAGE_SCHEMES = ("file", "s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs")


class SweepSpec(BaseModel):
    model_config = STRICT
    name: str = Field(description="the sweep's name: 1-64 letters, digits, `.`, `_` or `-`, starting with a letter or "
                      "digit; it names the sweep's folder under storage_path and its MLflow parent run")
    description: str = Field(default="", description="shown as the MLflow parent run's description, under the answer")
    trainable: TrainableSpec = Field(description="what each trial trains: a registered workload or your own build "
                                     "function")
    # default_factory: pydantic shares a default model instance between specs
    space: SpaceSpec = Field(default_factory=lambda: SpaceSpec(), description="the knobs each trial runs with, each "
                             "fixed or searched (the table below)")
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec, description="what trials are ranked by")
    search: SearchSpec = Field(default_factory=SearchSpec, description="how the next configuration is chosen")
    budget: BudgetSpec = Field(description="how many trials, and how long each one trains")
    scaling: ScalingSpec = Field(default_factory=ScalingSpec, description="what each trial runs on")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="where MLflow records the sweep")
    telemetry: TelemetrySpec = Field(default_factory=TelemetrySpec, description="what is sampled while trials train")
    lr_scaling: LrScalingSpec | None = Field(default=None, description="scale the searched lr with each trial's global "
                                            "batch size (none: every trial runs the searched lr)")
    quality: QualitySpec = Field(default_factory=QualitySpec, description="the convergence guardrail at equal data")
    cost: CostSpec | None = Field(default=None, description="what each accelerator type costs per device-hour, with "
                                  "the date and source of each price: the money figures (none without it)")
    storage_path: str = Field(default="ray_results", description="a filesystem path (on a cluster: one every node mounts) "
                              "or a URI (s3://bucket/prefix, gs://...) where the sweep keeps its state (sweep.json, Tune's "
                              "experiment, trial checkpoints and traces) and its lock; relative: to the working directory, or "
                              "inside a `ray job submit --working-dir` job to $SWEEPS_HOME (default ~/sweeps)")
    data_dir: str = setting_field("data_dir")
    seed: int = setting_field("seed")

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
        """Every rule across sections (`sweeps.spec.cross_checks`); all their problems at once."""
        found = problems(self)
        if found:
            raise RuleProblems(found)
        return self

    @field_validator("storage_path")
    @classmethod
    def _a_path(cls, path: str) -> str:
        """A local path, or a URI of a filesystem pyarrow opens (the sweep's storage layer, `trainables.storage`);
        any other scheme would fail only once Ray started: refused here with the schemes that work."""
        scheme = _URI.match(path)
        if scheme and scheme.group(0)[:-3].lower() not in _STORAGE_SCHEMES:
            raise ValueError(
                f"{path!r}: the scheme {scheme.group(0)[:-3]!r} is not a filesystem the sweep can keep its state on: "
                f"give a local path (on a cluster: one every node mounts) or a URI with one of "
                f"{', '.join(s + '://' for s in _STORAGE_SCHEMES)} (e.g. s3://bucket/sweeps)")
        return path

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        if not _NAME.fullmatch(name) or ".." in name:
            raise ValueError(
                "must be 1-64 letters, digits, '.', '_' or '-', start with a letter or digit, "
                "and contain no '..' (it names folders and MLflow runs)"
            )
        return name
