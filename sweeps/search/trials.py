"""Work out what one trial runs from the spec and a sampled configuration.

That is its length on the clock, its worker count, what it holds on the cluster, and its complete config
(`resolve_trial`) and logged params (`trial_params`). No compute here: the same `resolve_trial` feeds the Train
workers and the MLflow params, so what is logged is exactly what ran."""

from __future__ import annotations

import math
from typing import Any

from sweeps.spec import PARAMS_PREFIX, Scalar, SweepSpec
from sweeps.spec.cost import usd_per_hour
from sweeps.spec.params import param_values
from sweeps.spec.sections import GLOBAL_BATCH_FIXED, BudgetSpec
from sweeps.spec.settings import trial_settings
from sweeps.spec.space import worker_counts
from trainables.contract import TrialConfig
from trainables.knobs import CPU_TIME_BOX_S, GPU_MIN_WINDOW_S, GPU_TIME_BOX_S, KNOBS


def window_floor(b: BudgetSpec, use_gpu: bool, steps_fixed: bool = False) -> float:
    """The measured window's least length, in seconds.

    As given, else `GPU_MIN_WINDOW_S` on GPU and 0 on CPU (why: `trainables.knobs`). An equal-data budget rules,
    and so does ASHA on steps (`steps_fixed`: it compares and ends trials at num_steps)."""
    if b.num_items or steps_fixed:
        return 0.0
    return b.min_window_s if b.min_window_s is not None else (GPU_MIN_WINDOW_S if use_gpu else 0.0)


def time_box(b: BudgetSpec, use_gpu: bool, steps_fixed: bool = False, constrained: bool = False) -> tuple[float, float]:
    """The time boxes of a trial's window and warm-up: (max_window_s, max_warmup_s), 0 where off.

    As given, else `GPU_TIME_BOX_S` or `CPU_TIME_BOX_S`, so with a speed objective every trial costs about the
    same seconds whatever its step time. Off with an equal-data budget and ASHA on steps (they set the length);
    a quality objective or constraint (`constrained`) leaves them off unless given (its metric wants equal
    steps), and so does a warm-up too short to time a step (the window's steps are planned from it). The window
    never ends below the least window (`window_floor`)."""
    if b.num_items or steps_fixed:
        return 0.0, 0.0
    window, warmup = GPU_TIME_BOX_S if use_gpu else CPU_TIME_BOX_S
    if b.num_warmup_steps < 2:
        window = warmup = 0.0
    window = b.max_window_s if b.max_window_s is not None else (0.0 if constrained else window)
    warmup = b.max_warmup_s if b.max_warmup_s is not None else (0.0 if constrained else warmup)
    least = window_floor(b, use_gpu, steps_fixed)
    return (max(window, least) if window else 0.0), warmup


def trial_clock(spec: SweepSpec) -> tuple[float, float, float]:
    """What the clock may do to every trial's length: (min_window_s, max_window_s, max_warmup_s).

    Each is 0 where off. A target sets the length itself; ASHA on steps compares and ends trials at num_steps;
    a quality objective or constraint leaves the boxes off unless given (`window_floor`, `time_box`)."""
    if spec.objective.target is not None:
        return 0.0, 0.0, 0.0
    es, use_gpu = spec.search.early_stopping, spec.scaling.use_gpu
    steps_fixed = es is not None and es.grace_steps is not None
    window, warmup = time_box(spec.budget, use_gpu, steps_fixed, constrained=not spec.objective.speed_only)
    return window_floor(spec.budget, use_gpu, steps_fixed), window, warmup


def max_loader_workers(spec: SweepSpec) -> int:
    """The most dataloader workers per rank any trial of the space can start."""
    return int(max(param_values(spec.space.held("num_dataloader_workers"))))


def first_workers(spec: SweepSpec) -> int:
    """The number of ranks a warm group starts with before it has a trial.

    That is the first choice of `space.num_workers` (the grid's first), or the low end of a range."""
    p = spec.space.num_workers
    return spec.scaling.num_workers if p is None else int(param_values(p)[0])


def first_shape(spec: SweepSpec) -> tuple[int, str]:
    """The shape a warm group starts with before it has a trial: (worker count, accelerator type).

    That is the first worker count and the first accelerator type ("": not pinned) of the space."""
    from sweeps.spec.cost import accelerator_types

    return first_workers(spec), accelerator_types(spec)[0]


def fixed_knobs(spec: SweepSpec) -> dict[str, Scalar]:
    """The space's fixed knobs, with those the scaling section sets where the space does not search them.

    Those are the worker count (and the accelerator type a scaling section pins), each where the space does not
    search it."""
    fixed = spec.space.fixed()
    if spec.space.accelerator_type is None and spec.scaling.accelerator_type is not None:
        fixed = {"accelerator_type": spec.scaling.accelerator_type, **fixed}
    return {"num_workers": spec.scaling.num_workers} | fixed if spec.space.num_workers is None else fixed


def largest_trial_need(spec: SweepSpec) -> dict[str, float]:
    """What the largest trial the space allows holds at once (loader workers and ranks included)."""
    return spec.scaling.per_trial(max_loader_workers(spec), max(worker_counts(spec)))


def resolve_trial(spec: SweepSpec, sampled: dict[str, Any], metrics_path: str | None = None) -> TrialConfig:
    """The complete configuration one trial runs with.

    It holds the knobs' declared defaults, the space's fixed values, then what was sampled; the settings the
    spec sets as they are (`sweeps.spec.settings`), and those worked out from the budget, objective and cost
    around them."""
    values = {k: default for k, (_, default, _) in KNOBS.items()} | fixed_knobs(spec) | sampled
    own = {k[len(PARAMS_PREFIX):]: v for k, v in values.items() if k.startswith(PARAMS_PREFIX)}
    knobs = {k: kind(values[k]) for k, (kind, _, _) in KNOBS.items()}  # each in its declared type
    if spec.budget.global_batch_size:  # a fixed global batch: the accumulation follows (the spec checked it divides)
        knobs["grad_accum_steps"] = max(1, spec.budget.global_batch_size // (knobs["batch_size"] * knobs["num_workers"]))
    global_batch = knobs["batch_size"] * knobs["grad_accum_steps"] * knobs["num_workers"]
    knobs["lr"] *= spec.lr_scaling.factor(global_batch) if spec.lr_scaling is not None else 1.0
    b, target = spec.budget, spec.objective.target
    if b.num_steps is not None:
        num_steps = b.num_steps
    else:  # equal data: the loop plans from its warm-up's items per step; this is exact for samples
        num_steps = max(1, math.ceil(b.num_items / global_batch) - b.num_warmup_steps) if b.num_samples else 1
    min_window, window_box, warmup_box = trial_clock(spec)
    return TrialConfig(
        **knobs,
        **trial_settings(spec),  # workload, num_warmup_steps, report_interval_s, the timeouts, telemetry, seed, ...
        workload_params={**spec.trainable.params, **own},
        num_items=b.num_items,
        eval_every_steps=b.eval_every_steps or 0,
        target_metric=target.metric if target is not None else None,
        target_max=target.max if target is not None else None,
        target_min=target.min if target is not None else None,
        # ASHA on the target's curve needs a report after each evaluation; otherwise none (each is a barrier)
        report_evals=spec.objective.time_to_target and spec.search.early_stopping is not None,
        num_steps=num_steps,
        # a target sets the length; ASHA on steps compares and ends trials at num_steps
        min_window_s=min_window,
        max_window_s=window_box,
        max_warmup_s=warmup_box,
        metrics_path=metrics_path,
        usd_per_hour=usd_per_hour(spec, knobs["accelerator_type"], knobs["num_workers"],
                                  knobs["num_dataloader_workers"]),
    )


def trial_params(spec: SweepSpec, cfg: TrialConfig) -> dict[str, Any]:
    """Flat, UI-friendly params for a trial's MLflow run (compare view, parallel coordinates).

    They are every loop knob as it ran, and what follows from them."""
    global_batch = cfg.batch_size * cfg.grad_accum_steps * cfg.num_workers
    knobs: dict[str, Any] = {k: getattr(cfg, k) for k in KNOBS}
    searched_lr = cfg.lr if spec.lr_scaling is None else cfg.lr / spec.lr_scaling.factor(global_batch)
    params: dict[str, Any] = {
        "batch_size": cfg.batch_size,
        "global_batch_size": global_batch,  # samples per optimizer step: per-worker batch x accumulation x workers
        # budget.global_batch_size: the global batch is the spec's, grad_accum_steps follows from batch and ranks
        **({GLOBAL_BATCH_FIXED: True} if spec.budget.global_batch_size else {}),
        **knobs,
        "lr": searched_lr,  # the searched rate
        "lr_effective": cfg.lr,  # what the optimizer ran with (lr_scaling applied)
        "cpus_per_worker": spec.scaling.cpus_per_worker,
        "cpus_per_loader_worker": spec.scaling.cpus_per_loader_worker,
        "cpus_reserved": spec.scaling.per_trial(cfg.num_dataloader_workers, cfg.num_workers)["CPU"],  # the whole trial's
        "gpus_per_worker": spec.scaling.gpus_per_worker,
        "use_gpu": cfg.use_gpu,
        "workload": cfg.workload,
        "num_steps": cfg.num_steps if not cfg.num_items else None,  # an item budget's steps are in the metrics
        "num_warmup_steps": cfg.num_warmup_steps,
        "min_window_s": cfg.min_window_s or None,  # the steps actually run are progress/steps
        "max_window_s": cfg.max_window_s or None,
        "max_warmup_s": cfg.max_warmup_s or None,
        "seed": cfg.seed,
    }
    if spec.budget.item_unit is not None:
        params[f"num_{spec.budget.item_unit}"] = cfg.num_items
    if spec.lr_scaling is not None:
        params["lr_scaling"] = f"{spec.lr_scaling.rule}@{spec.lr_scaling.reference_batch_size}"
    if cfg.eval_every_steps:
        params["eval_every_steps"] = cfg.eval_every_steps
    params.update({f"workload.{k}": v for k, v in cfg.workload_params.items()})
    return {k: v for k, v in params.items() if v is not None and not (k == "accelerator_type" and v == "")}
