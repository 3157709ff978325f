"""Spec -> Optuna distributions, and (spec, sampled params) -> the trial's full config.

No compute here. The same `resolve_trial` feeds the Train workers and the MLflow params,
so what is logged is exactly what ran.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from sweeps.spec import KNOBS, PARAMS_PREFIX, CategoricalParam, FloatParam, IntParam, Param, SweepSpec
from trainables.contract import TrialConfig

if TYPE_CHECKING:  # imported where used: a trial's actor needs no Optuna
    import optuna.distributions as od


def to_distribution(param: Param) -> od.BaseDistribution:
    import optuna.distributions as od

    if isinstance(param, FloatParam):
        return od.FloatDistribution(param.low, param.high, log=param.log, step=param.step)
    if isinstance(param, IntParam):
        return od.IntDistribution(param.low, param.high, log=param.log, step=param.step)
    if isinstance(param, CategoricalParam):
        return od.CategoricalDistribution(param.choices)
    raise TypeError(f"fixed values are not searched: {param!r}")


def optuna_space(spec: SweepSpec) -> dict[str, od.BaseDistribution]:
    return {name: to_distribution(p) for name, p in spec.space.searched().items()}


def resolve_trial(spec: SweepSpec, sampled: dict[str, Any], metrics_path: str | None = None) -> TrialConfig:
    """The complete configuration one trial runs with."""
    knobs = {k: v[0] for k, v in KNOBS.items()} | spec.fixed_knobs() | sampled
    own = {k[len(PARAMS_PREFIX):]: v for k, v in knobs.items() if k.startswith(PARAMS_PREFIX)}
    batch, accum, workers = int(knobs["batch_size"]), int(knobs["grad_accum_steps"]), int(knobs["num_workers"])
    global_batch = batch * accum * workers
    lr = float(knobs["lr"]) * (spec.lr_scaling.factor(global_batch) if spec.lr_scaling is not None else 1.0)
    b, target = spec.budget, spec.objective.target
    if b.num_steps is not None:
        num_steps = b.num_steps
    else:  # equal data: the loop plans from its warm-up's items per step; this is exact for samples
        num_steps = max(1, math.ceil(b.num_items / global_batch) - b.num_warmup_steps) if b.num_samples else 1
    min_window, window_box, warmup_box = spec.trial_clock()
    return TrialConfig(
        workload=spec.trainable.name,
        workload_params={**spec.trainable.params, **own},
        batch_size=batch,
        precision=str(knobs["precision"]),
        lr=lr,
        num_items=b.num_items,
        eval_every_steps=b.eval_every_steps or 0,
        target_metric=target.metric if target is not None else None,
        target_max=target.max if target is not None else None,
        target_min=target.min if target is not None else None,
        # ASHA on the target's curve needs a report after each evaluation; otherwise none (each is a barrier)
        report_evals=spec.objective.time_to_target and spec.search.early_stopping is not None,
        num_dataloader_workers=int(knobs["num_dataloader_workers"]),
        pin_memory=bool(knobs["pin_memory"]),
        prefetch_factor=int(knobs["prefetch_factor"]),
        persistent_workers=bool(knobs["persistent_workers"]),
        compile=bool(knobs["compile"]),
        grad_accum_steps=accum,
        max_grad_norm=float(knobs["max_grad_norm"]),
        lr_warmup_steps=int(knobs["lr_warmup_steps"]),
        lr_schedule=str(knobs["lr_schedule"]),
        tf32_under_autocast=bool(knobs["tf32_under_autocast"]),
        num_steps=num_steps,
        num_warmup_steps=spec.budget.num_warmup_steps,
        report_interval_s=spec.budget.report_interval_s,
        # a target sets the length; ASHA on steps compares and ends trials at num_steps
        min_window_s=min_window,
        max_window_s=window_box,
        max_warmup_s=warmup_box,
        loader_timeout_s=spec.budget.loader_timeout_s,
        collective_timeout_s=spec.budget.collective_timeout_s,
        checkpoint_every_steps=spec.budget.checkpoint_every_steps,
        telemetry_period_s=spec.telemetry.period_s,
        use_gpu=spec.scaling.use_gpu,
        threads_per_worker=spec.scaling.cpus_per_worker,
        seed=spec.seed,
        data_dir=spec.data_dir,
        metrics_path=metrics_path,
        num_workers=workers,
    )


def trial_params(spec: SweepSpec, cfg: TrialConfig) -> dict[str, Any]:
    """Flat, UI-friendly params for a trial's MLflow run (compare view, parallel coordinates)."""
    global_batch = cfg.batch_size * cfg.grad_accum_steps * cfg.num_workers
    params: dict[str, Any] = {
        "batch_size": cfg.batch_size,
        "global_batch_size": global_batch,  # samples per optimizer step: per-worker batch x accumulation x workers
        "precision": cfg.precision,
        "lr": cfg.lr if spec.lr_scaling is None else cfg.lr / spec.lr_scaling.factor(global_batch),  # the searched rate
        "lr_effective": cfg.lr,  # what the optimizer ran with (lr_scaling applied)
        "num_dataloader_workers": cfg.num_dataloader_workers,
        "pin_memory": cfg.pin_memory,
        "prefetch_factor": cfg.prefetch_factor,
        "persistent_workers": cfg.persistent_workers,
        "compile": cfg.compile,
        "grad_accum_steps": cfg.grad_accum_steps,
        "max_grad_norm": cfg.max_grad_norm,
        "lr_warmup_steps": cfg.lr_warmup_steps,
        "lr_schedule": cfg.lr_schedule,
        "tf32_under_autocast": cfg.tf32_under_autocast,
        "num_workers": cfg.num_workers,
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
    params = {k: v for k, v in params.items() if v is not None}
    return params
