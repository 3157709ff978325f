"""The contract between the sweep service and the per-worker loop.

Torch-free on purpose: the service (``sweeps``) validates specs and names metrics with
this module alone, without importing model code, torch or Ray.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from trainables.knobs import (  # noqa: F401 - KNOBS and the vocabulary, re-exported
    DECLARED,
    KNOBS,
    LR_SCHEDULES,
    PRECISIONS,
    PROBE_VALUES,
    LoopKnobs,
    TrialSettings,
    offload_problem,
    sharding_problem,
)
from trainables.knobs import problem as setting_problem
from trainables.metrics import (  # noqa: F401 - every key, declared there once, re-exported
    ALLREDUCE_WAIT_PCT,
    BUILD_S,
    COMPILE_CACHE_HITS,
    COMPILE_CACHE_MISSES,
    COMPILE_GRAPHS,
    COST_PREFIX,
    CPU_CORES_USED,
    CPU_LOADERS_PCT,
    CPU_OTHER_CORES,
    CPU_WORKER_PCT,
    DATA_PREP_S,
    DATA_WAIT_PCT,
    DEVICE_PREFIX,
    ELAPSED_S,
    ENERGY_PREFIX,
    ENERGY_TOTAL_J,
    EVAL_PREFIX,
    EVAL_TOTAL_S,
    EVALS,
    FINAL,
    GPU_MEM_PEAK_GIB,
    GPU_OTHER_PROCS,
    GPU_POWER_MEAN_W,
    GPU_SM_ACTIVE_PCT,
    GPU_SM_CLOCK_MEAN_MHZ,
    GPU_TEMP_MAX_C,
    GPU_TENSOR_ACTIVE_PCT,
    GPU_UTIL_MEAN_PCT,
    GPU_UTIL_P10_PCT,
    GRAD_NOISE_SCALE,
    H2D_BW_PCT,
    H2D_COPY_PCT,
    H2D_GB_PER_S,
    HFU_PCT,
    HW_TFLOPS,
    INPUT_SOL_PCT,
    LOOP_S,
    LOSS_TRAIN,
    LOSS_VAL,
    MEM_ALLOC_RETRIES,
    MEM_HEADROOM_GIB,
    MEM_MAX_ALLOCATED_GIB,
    MEM_MAX_RESERVED_GIB,
    MEM_PEAK_RSS_GIB,
    MEM_PREDICTED_ACTIVATIONS_GIB,
    MEM_PREDICTED_GIB,
    MEM_TOTAL_GIB,
    METRICS,
    MFU_PCT,
    PERF_PREFIX,
    PREDICT_ERROR_PCT,
    PREDICT_TIME_TO_TARGET_S,
    PREDICT_USD_TO_TARGET,
    PROGRESS_PREFIX,
    QUALITY_GAP_PCT,
    REPORT_WAIT_S,
    RESTORED_FROM,
    SCALING_EFFICIENCY_PCT,
    SOL_PCT,
    STEP_TIME_MS,
    STEPS,
    STEPS_TO_TARGET,
    SWEEP_USD,
    TARGET_BEST,
    TFLOPS,
    THROUGHPUT_PREFIX,
    TIME_PREFIX,
    TIME_TO_TARGET_S,
    TRACE_COMM_PCT,
    TRACE_COMPUTE_PCT,
    TRACE_DATA_WAIT_PCT,
    TRACE_EXPOSED_MAX_PCT,
    TRACE_EXPOSED_MAX_RANK,
    TRACE_EXPOSED_PCT,
    TRACE_IDLE_PCT,
    TRACE_MEMCPY_PCT,
    TRACE_PER_RANK,
    TRACE_S,
    TRACE_SKIPPED,
    TRACE_STEP_MS,
    TRACE_STEPS,
    TRIAL_USD,
    UNITS,
    USD_PER_HOUR,
    USD_TO_TARGET,
    WARMUP_S,
    WARMUP_STEPS_S,
    WINDOW_S,
    WORLD_SIZE,
    energy_key,
    matmul_emulated_key,
    matmul_of_fp32_key,
    per_worker_throughput_key,
    seen_key,
    throughput_cv_key,
    throughput_key,
    usd_per_million_key,
)

POOL_CLOSED = "closed"  # what a warm pool's queue hands a group when the sweep is over
POOL_RESIZE = "resize"  # ... when the trials waiting need another number of ranks: the group ends, one of that size follows


# Metric keys are `group/name_unit`. The house vocabulary writes units as `name(unit)`, but
# MLflow 3 rejects "(", ")" and "%" in metric names, so the unit is a suffix (`_ms`, `_pct`,
# `_per_s`) and the same key is used in reports, specs and MLflow alike. Each key is declared once, in
# `trainables.metrics` (re-exported above).
METRIC_KEY = re.compile(r"^[a-z][a-z0-9_]*/[A-Za-z0-9_.\-]+$")
TRIAL_IN_GROUP = "pool/trial_in_group"  # a warm group's fact: the trial's place in its group, "1" for the first
CHECKPOINT_FILE = "state.pt"

# The objectives a trial meets by reaching the target (time or dollars to it): absent when it never did
TO_TARGET_METRICS = (TIME_TO_TARGET_S, USD_TO_TARGET)


def money_metrics(usd_per_hour: float, metrics: dict[str, Any]) -> dict[str, float]:
    """The money figures a report carries, from the trial's hourly price and the report's own figures.

    It is empty without a price, and holds each figure only where the one it is computed from is in the report."""
    if not usd_per_hour > 0:
        return {}
    out = {USD_PER_HOUR: usd_per_hour}
    for unit in UNITS:
        rate = metrics.get(throughput_key(unit))
        if isinstance(rate, (int, float)) and rate > 0:
            out[usd_per_million_key(unit)] = usd_per_hour / (rate * 3600.0) * 1e6
    seconds = metrics.get(TIME_TO_TARGET_S)
    if isinstance(seconds, (int, float)) and seconds >= 0:
        out[USD_TO_TARGET] = usd_per_hour * seconds / 3600.0
    return out


# Rules a trial's length must meet: one function each, said by the spec (its field names prefixed) and by
# the loop's own config (the launcher builds it without a spec).
def window_problem(min_window_s: float, max_window_s: float, max_warmup_s: float) -> str:
    """Why the time boxes cannot hold ("" when they can)."""
    if not min_window_s >= 0:
        return f"min_window_s must be >= 0 (0: num_steps alone sets the length), got {min_window_s}"
    if not (max_window_s >= 0 and max_warmup_s >= 0):
        return "max_window_s and max_warmup_s must be >= 0 (0: off)"
    if max_window_s and max_window_s < min_window_s:
        return (f"max_window_s: {max_window_s:g} is below min_window_s: {min_window_s:g}; raise max_window_s or "
                "lower min_window_s")
    return ""


def items_problem(budget: str, num_items: int, num_warmup_steps: int) -> str:
    """Why an equal-data budget (`budget`: its name) cannot be planned ("" when it can).

    Its steps follow warm-up's items per step."""
    if num_items and num_warmup_steps < 1:
        return f"{budget} plans each trial's steps from its warm-up's items per step: num_warmup_steps must be >= 1"
    return ""


def target_problem(metric: str | None, at_most: float | None, at_least: float | None, eval_every_steps: int,
                   cadence: str = "eval_every_steps") -> str:
    """Why a target cannot be checked ("" when it can); `cadence`: the name of its evaluation cadence."""
    if metric is not None and (at_most is None) == (at_least is None):
        return "a target is one bound: max (reach at most, e.g. a loss) or min (at least, e.g. accuracy)"
    if metric is not None and eval_every_steps < 1:
        return f"set {cadence} (how often each trial checks the target, e.g. 20)"
    return ""


THROUGHPUT_UNITS: tuple[str, ...] = UNITS


def cv_key_of(metric: str) -> str | None:
    """The sub-window spread the loop reports for a throughput metric; None for any other metric.

    The metric may be global or per worker: the same spread, one is the other over the world size."""
    unit = next((u for u in THROUGHPUT_UNITS if metric in (throughput_key(u), per_worker_throughput_key(u))), None)
    return throughput_cv_key(unit) if unit is not None else None


# Every metric a spec may name, from the one table (`trainables.metrics`); not time/elapsed_s: only
# interim reports carry it, so no trial could be ranked by it.
KNOWN_METRICS: tuple[str, ...] = tuple(k for m in METRICS if m.nameable for k in m.keys())
# Metrics the sweep computes after its trials end (from several trials): never in a trial's own report.
SWEEP_LEVEL_METRICS: tuple[str, ...] = tuple(k for m in METRICS if m.sweep_level for k in m.keys())
_FINAL_ONLY = frozenset(k for m in METRICS if m.final_only for k in m.keys())


def is_final_only(key: str) -> bool:
    """A metric only the final report carries (it needs validation or the whole window).

    With `report_evals`, loss/val and eval/* are also in the report after each measured evaluation."""
    return key in _FINAL_ONLY or key.startswith(EVAL_PREFIX)


def is_known_metric(key: str) -> bool:
    """A metric a spec may name: one the loop reports, or a workload's own `eval/<name>`."""
    return key in KNOWN_METRICS or (key.startswith(EVAL_PREFIX) and bool(METRIC_KEY.match(key)))


def is_metric(key: str, value: Any) -> bool:
    """True for a clean, finite, numeric `group/name` metric (what goes to MLflow)."""
    return (
        bool(METRIC_KEY.match(key))
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


@dataclass(frozen=True, kw_only=True)
class TrialConfig(TrialSettings, LoopKnobs):
    """Everything one trial's workers need: the loop's knobs and the settings around them.

    The knobs are `LoopKnobs` and the settings `TrialSettings`, each declared once in `trainables.knobs`; the
    config crosses process boundaries as a plain dict."""

    def __post_init__(self) -> None:
        for name in DECLARED:  # each setting's declared rule; 0 ranks: whatever the launcher started
            problem = setting_problem(name, getattr(self, name))
            if problem and not (name == "num_workers" and self.num_workers == 0):
                raise ValueError(problem)
        problem = window_problem(self.min_window_s, self.max_window_s, self.max_warmup_s) or \
            items_problem("num_items", self.num_items, self.num_warmup_steps) or \
            target_problem(self.target_metric, self.target_max, self.target_min, self.eval_every_steps) or \
            sharding_problem(self.strategy, self.precision, self.cpu_offload) or \
            offload_problem(self.cpu_offload, self.use_gpu, self.max_grad_norm)
        if problem:
            raise ValueError(problem)

    def as_probe(self) -> TrialConfig:
        """This trial as a memory probe runs it.

        Each setting declared with a `probe` value takes it (a probe asks whether a step fits, not how fast);
        what the loop then does differently, `probe` says."""
        return dataclasses.replace(self, **PROBE_VALUES)

    def target_met(self, value: float | None) -> bool:
        if self.target_metric is None or value is None or not math.isfinite(value):
            return False
        return value <= self.target_max if self.target_max is not None else value >= self.target_min  # type: ignore[operator]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialConfig:
        return cls(**data)
