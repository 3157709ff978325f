"""The sweep spec: strict YAML -> typed, frozen models, one small model per section.

Each field carries its doc. The `objective` (`objective`), the `space` (`space`, in the parameter vocabulary
of `params`), the `cost` (`cost`) and the other sections (`sections`) make up the whole spec (`sweep`); the
rules across sections live apart (`cross_checks`), and so do loading (`load`) and the problems found
(`problems`).

Every problem is reported at once, each with its field path, YAML line, the bad value and what is
allowed. Loading runs no code: `yaml.safe_load` semantics, aliases refused. The loop's knobs in `space`
come from their one declaration, `trainables.knobs.LoopKnobs`, and the fields that set a trial setting as it
is (`budget.num_warmup_steps`, `telemetry.trace_steps`, ...) from theirs, `trainables.knobs.TrialSettings`
(`declared`).
"""

from sweeps.spec.load import load_spec, parse_spec
from sweeps.spec.objective import ConstraintSpec, ObjectiveSpec, TargetSpec
from sweeps.spec.params import CategoricalParam, FixedParam, FloatParam, IntParam, Param, Scalar
from sweeps.spec.problems import SpecError, SpecProblem
from sweeps.spec.sections import (
    BudgetSpec,
    EarlyStoppingSpec,
    LrScalingSpec,
    QualitySpec,
    ScalingSpec,
    SearchSpec,
    TelemetrySpec,
    TrackingSpec,
    TrainableSpec,
)
from sweeps.spec.space import OPTIM_KNOBS, PARAMS_PREFIX, SpaceSpec
from sweeps.spec.sweep import SweepSpec

__all__ = ["BudgetSpec", "CategoricalParam", "ConstraintSpec", "EarlyStoppingSpec", "FixedParam", "FloatParam",
           "IntParam", "LrScalingSpec", "OPTIM_KNOBS", "ObjectiveSpec", "PARAMS_PREFIX", "Param", "QualitySpec",
           "Scalar", "ScalingSpec", "SearchSpec", "SpaceSpec", "SpecError", "SpecProblem", "SweepSpec", "TargetSpec",
           "TelemetrySpec", "TrackingSpec", "TrainableSpec", "load_spec", "parse_spec"]
