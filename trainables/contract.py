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
)
from trainables.knobs import problem as setting_problem
from trainables.metrics import METRICS, UNITS

POOL_CLOSED = "closed"  # what a warm pool's queue hands a group when the sweep is over
POOL_RESIZE = "resize"  # ... when the trials waiting need another number of ranks: the group ends, one of that size follows
EVAL_PREFIX = "eval/"  # a workload's eval_fn metrics: eval/<name>


# Metric keys are `group/name_unit`. The house vocabulary writes units as `name(unit)`, but
# MLflow 3 rejects "(", ")" and "%" in metric names, so the unit is a suffix (`_ms`, `_pct`,
# `_per_s`) and the same key is used in reports, specs and MLflow alike.
METRIC_KEY = re.compile(r"^[a-z][a-z0-9_]*/[A-Za-z0-9_.\-]+$")
LOSS_TRAIN = "loss/train"
LOSS_VAL = "loss/val"
STEP_TIME_MS = "time/step_ms"
DATA_WAIT_PCT = "time/data_wait_pct"
STEPS = "progress/steps"
LOOP_S = "time/loop_total_s"  # the loop's own wall time: build, data, warm-up, measured steps, validation
WARMUP_S = "time/warmup_s"  # the loop's wall time before the measured window: build, loader start, compile, warm-up steps
WARMUP_STEPS_S = "time/warmup_steps_s"  # warm-up's timed steps (from step 1; max over ranks): what max_warmup_s bounds
REPORT_WAIT_S = "time/report_wait_s"  # the window's report and checkpoint hand-offs (max over ranks): left out of time/window_s, counted by max_window_s
BUILD_S = "time/build_s"  # the trial's build (max over ranks): workload and its data, model to device, FLOP count, DDP, optimizer
DATA_PREP_S = "time/data_prep_s"  # of the build, data files made once per node (`ensure_cached`; 0 when found made)
WINDOW_S = "time/window_s"  # the measured window's length (max over ranks; periodic evaluations and the handing on of reports left out)
TRIAL_IN_GROUP = "pool/trial_in_group"  # a warm group's fact: the trial's place in its group, "1" for the first
RESTORED_FROM = "progress/restored_from_step"  # measured steps a crashed attempt had done (resumed from them)
CHECKPOINT_FILE = "state.pt"
FINAL = "progress/final"  # 1 in the trial's last report (after validation), 0 in progress reports
WORLD_SIZE = "progress/world_size"
TFLOPS = "perf/tflops_per_s"  # achieved training TFLOP/s, all ranks (needs the workload's FLOPs)
MFU_PCT = "perf/mfu_pct"  # achieved FLOP/s / (peak per device x devices); absent where peak unknown
GPU_UTIL_MEAN_PCT = "gpu/util_mean_pct"
GPU_MEM_PEAK_GIB = "gpu/mem_peak_gib"
GPU_POWER_MEAN_W = "gpu/power_mean_w"
H2D_COPY_PCT = "time/h2d_copy_pct"
# % of the measured window each rank waited, after its backward, for the gradient all-reduce to finish (the
# communication backward did not hide), mean over ranks; DDP only (one rank has nothing to wait for: absent)
ALLREDUCE_WAIT_PCT = "time/allreduce_wait_pct"
# throughput(N ranks) / (throughput(M) x N / M) x 100 against the twin trial with the fewest ranks M < N (the sweep adds it)
SCALING_EFFICIENCY_PCT = "perf/scaling_efficiency_pct"
H2D_GB_PER_S = "copy/h2d_gb_per_s"  # host->device bytes per second of the window, mean per rank (CUDA only)
CPU_WORKER_PCT = "cpu/worker_util_mean_pct"  # % of one core, the training process itself
CPU_LOADERS_PCT = "cpu/loader_util_mean_pct"  # % of one core, summed over its dataloader workers
CPU_CORES_USED = "cpu/cores_used"  # cores busy, all ranks: training processes and their loader workers
# What else used the trial's nodes and GPUs while its window ran (trainables.telemetry.other_cores)
CPU_OTHER_CORES = "contention/cpu_other_cores"
GPU_OTHER_PROCS = "contention/gpu_other_procs"
MEM_HEADROOM_GIB = "memory/headroom_gib"
MEM_TOTAL_GIB = "memory/total_gib"
# Quality (time-to-target, equal data, noise scale)
GRAD_NOISE_SCALE = "stats/grad_noise_scale"  # B_simple = tr(Sigma)/|G|^2, in the workload's unit (EMA)
TIME_TO_TARGET_S = "time/to_target_s"  # wall time from the first step to the evaluation that met the target
ELAPSED_S = "time/elapsed_s"  # the same clock at each evaluation (with report_evals: ASHA's time with a target)
STEPS_TO_TARGET = "progress/steps_to_target"  # optimizer steps (warm-up included) when the target was met
TARGET_BEST = "quality/target_best"  # the best value of the target metric any evaluation reached
EVAL_TOTAL_S = "time/eval_total_s"  # wall time spent in periodic evaluations (counted in time/to_target_s)
EVALS = "progress/evals"  # periodic evaluations run
PREDICT_TIME_TO_TARGET_S = "predict/time_to_target_s"  # the noise-scale model's estimate (the sweep adds it)
QUALITY_GAP_PCT = "quality/gap_pct"  # loss/val vs the sweep's fp32 reference at equal data (the sweep adds it)
PREDICT_ERROR_PCT = "predict/error_pct"  # predicted / measured time to target - 1, % (the sweep adds it)
# The profiler trace of the last warm-up steps (trainables.trace)
TRACE_S = "time/trace_s"  # what splitting and keeping the trace took (max over ranks), in warm-up's time
TRACE_SKIPPED = "trace/skipped"  # a tag: why a trial has no trace figures
TRACE_EXPOSED_MAX_PCT = "trace/comm_exposed_max_pct"
TRACE_EXPOSED_MAX_RANK = "trace/comm_exposed_max_rank"
TRACE_STEP_MS = "trace/step_ms"
TRACE_STEPS = "trace/steps"  # a tag: the warm-up steps traced, "3-4"
TRACE_PER_RANK = "trace/per_rank"  # a tag: each rank's split in words
# Money (the spec's prices; trainables.metrics says how each is computed)
USD_PER_HOUR = "cost/usd_per_hour"
USD_TO_TARGET = "cost/usd_to_target"
PREDICT_USD_TO_TARGET = "cost/predicted_usd_to_target"  # the sweep adds it, from predict/time_to_target_s
TRIAL_USD = "cost/trial_usd"  # the sweep adds it, from the trial's own wall time
SWEEP_USD = "cost/sweep_usd"  # on the parent run
# The objectives a trial meets by reaching the target (time or dollars to it): absent when it never did
TO_TARGET_METRICS = (TIME_TO_TARGET_S, USD_TO_TARGET)


def usd_per_million_key(unit: str) -> str:
    """Dollars per million items of the workload's unit at the measured throughput."""
    return f"cost/usd_per_1m_{unit}"


def money_metrics(usd_per_hour: float, metrics: dict[str, Any]) -> dict[str, float]:
    """The money figures a report carries, from the trial's hourly price and the report's own figures:
    none without a price, and each only where the figure it is computed from is there."""
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
    """Why an equal-data budget (`budget`: its name) cannot be planned ("" when it can): its steps follow
    warm-up's items per step."""
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


def energy_key(unit: str) -> str:
    return f"energy/per_1k_{unit}_j"


THROUGHPUT_UNITS: tuple[str, ...] = UNITS


def throughput_key(unit: str) -> str:
    """Global throughput (summed over ranks) for a workload counting in `unit`."""
    return f"throughput/{unit}_per_s"


def per_worker_throughput_key(unit: str) -> str:
    return f"throughput/{unit}_per_s_per_worker"


def throughput_cv_key(unit: str) -> str:
    """The throughput's spread over the measured window's sub-windows: stdev / mean, in % (final report)."""
    return f"throughput/{unit}_per_s_cv_pct"


def cv_key_of(metric: str) -> str | None:
    """The sub-window spread the loop reports for a throughput metric (global or per worker: the same
    spread, one is the other over the world size); None for any other metric."""
    unit = next((u for u in THROUGHPUT_UNITS if metric in (throughput_key(u), per_worker_throughput_key(u))), None)
    return throughput_cv_key(unit) if unit is not None else None


def seen_key(unit: str) -> str:
    """Items trained on, all ranks, warm-up included (what an equal-data budget equalises)."""
    return f"progress/{unit}_seen"


# Every metric a spec may name, from the one table (`trainables.metrics`); not time/elapsed_s: only
# interim reports carry it, so no trial could be ranked by it.
KNOWN_METRICS: tuple[str, ...] = tuple(k for m in METRICS if m.nameable for k in m.keys())
# Metrics the sweep computes after its trials end (from several trials): never in a trial's own report.
SWEEP_LEVEL_METRICS: tuple[str, ...] = tuple(k for m in METRICS if m.sweep_level for k in m.keys())
_FINAL_ONLY = frozenset(k for m in METRICS if m.final_only for k in m.keys())


def is_final_only(key: str) -> bool:
    """A metric only the final report carries (it needs validation or the whole window); with
    `report_evals`, loss/val and eval/* are also in the report after each measured evaluation."""
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
    """Everything one trial's workers need: the loop's knobs (`LoopKnobs`) and the settings around them
    (`TrialSettings`), each declared once in `trainables.knobs`; crosses process boundaries as a plain dict."""

    def __post_init__(self) -> None:
        for name in DECLARED:  # each setting's declared rule; 0 ranks: whatever the launcher started
            problem = setting_problem(name, getattr(self, name))
            if problem and not (name == "num_workers" and self.num_workers == 0):
                raise ValueError(problem)
        problem = window_problem(self.min_window_s, self.max_window_s, self.max_warmup_s) or \
            items_problem("num_items", self.num_items, self.num_warmup_steps) or \
            target_problem(self.target_metric, self.target_max, self.target_min, self.eval_every_steps)
        if problem:
            raise ValueError(problem)

    def as_probe(self) -> TrialConfig:
        """This trial as a memory probe runs it: each setting declared with a `probe` value takes it (a probe asks
        whether a step fits, not how fast); what the loop then does differently, `probe` says."""
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
