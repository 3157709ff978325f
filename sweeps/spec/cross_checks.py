"""The rules across the spec's sections, one small function each, run in order by `RULES`.

Each returns the problem it finds as "field.path: what is wrong and the fix" ("" when none); its docstring
is that message, or, where the message is longer than a line, a summary and then the message. A section's
own rules live with its model (`sections.py`, `objective.py`, `space.py`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from trainables import registry
from trainables.contract import (
    COST_PREFIX,
    THROUGHPUT_PREFIX,
    is_final_only,
    offload_problem,
    sharding_problem,
    target_problem,
)

if TYPE_CHECKING:
    from sweeps.spec.sweep import SweepSpec


def objective_in_the_workloads_unit(spec: SweepSpec) -> str:
    """objective: <trainable> reports throughput/tokens_per_s, not throughput/samples_per_s; use that"""
    unit = registry.unit(spec.trainable.name)
    for metric in spec.objective.metrics + tuple(c.metric for c in spec.objective.constraints):
        if unit is None or not metric.startswith(THROUGHPUT_PREFIX):
            continue
        wanted = metric.replace("samples", unit) if unit != "samples" else metric.replace("tokens", unit)
        if wanted != metric:
            return f"objective: {spec.trainable.name} reports {wanted}, not {metric}; use that"
    return ""


def asha_ranks_by_one_metric(spec: SweepSpec) -> str:
    """search.early_stopping: ASHA ranks trials by one metric; remove it or use a single objective"""
    if spec.search.early_stopping is not None and spec.objective.multi:
        return "search.early_stopping: ASHA ranks trials by one metric; remove it or use a single objective"
    return ""


def asha_on_a_target_counts_seconds(spec: SweepSpec) -> str:
    """With a target, ASHA's grace period is in seconds of training (grace_s), not in steps.

    search.early_stopping: with objective.target, ASHA compares trials ... at equal training time; give
    grace_s ... instead of grace_steps"""
    es, target = spec.search.early_stopping, spec.objective.target
    if es is not None and spec.objective.time_to_target and es.grace_s is None and target is not None:
        return (f"search.early_stopping: with objective.target, ASHA compares trials on {target.metric} at equal "
                "training time; give grace_s (seconds of training before a trial may be stopped, several "
                "evaluations' worth of the slowest trial) instead of grace_steps")
    return ""


def grace_s_is_for_a_target(spec: SweepSpec) -> str:
    """search.early_stopping.grace_s is for a time-to-target objective ...; use grace_steps"""
    es = spec.search.early_stopping
    if es is not None and not spec.objective.time_to_target and es.grace_s is not None:
        return ("search.early_stopping.grace_s is for a time-to-target objective (metric time/to_target_s with "
                "objective.target); use grace_steps (trials compared at equal measured steps)")
    return ""


def asha_reads_progress_reports(spec: SweepSpec) -> str:
    """ASHA needs an objective metric that progress reports carry, not one only in a trial's final report.

    search.early_stopping: ASHA compares trials on their progress reports, and <metric> is only in a
    trial's final report ...; stop early on a throughput objective, or remove early_stopping"""
    es, primary = spec.search.early_stopping, spec.objective.primary
    if es is not None and not spec.objective.time_to_target and is_final_only(primary):
        return (f"search.early_stopping: ASHA compares trials on their progress reports, and {primary} is only in "
                "a trial's final report (after validation); stop early on a throughput objective, or remove "
                "early_stopping")
    return ""


def grace_below_num_steps(spec: SweepSpec) -> str:
    """search.early_stopping.grace_steps (N) must be below budget.num_steps (M), or nothing is ever stopped"""
    es, steps = spec.search.early_stopping, spec.budget.num_steps
    if es is not None and steps is not None and es.grace_steps is not None and es.grace_steps >= steps:
        return (f"search.early_stopping.grace_steps ({es.grace_steps}) must be below budget.num_steps ({steps}), "
                "or nothing is ever stopped")
    return ""


def asha_on_steps_without_time_boxes(spec: SweepSpec) -> str:
    """ASHA on steps refuses a max_window_s that would end trials before num_steps.

    budget.max_window_s: N would end trials before num_steps, where ASHA ... compares and ends them at
    equal steps; remove max_window_s, or remove early_stopping"""
    es, b = spec.search.early_stopping, spec.budget
    boxed = [k for k in ("max_window_s", "max_warmup_s") if getattr(b, k)]
    if es is not None and es.grace_steps is not None and boxed:
        return (f"budget.{boxed[0]}: {getattr(b, boxed[0]):g} would end trials before num_steps, where ASHA "
                "(search.early_stopping.grace_steps) compares and ends them at equal steps; remove "
                f"{boxed[0]}, or remove early_stopping")
    return ""


def a_target_sets_the_length(spec: SweepSpec) -> str:
    """With a target, the target sets each trial's length: no time boxes.

    budget.max_window_s / max_warmup_s: with objective.target the target sets each trial's length ...;
    remove them"""
    if spec.objective.target is not None and (spec.budget.max_window_s or spec.budget.max_warmup_s):
        return ("budget.max_window_s / max_warmup_s: with objective.target the target sets each trial's length "
                "(num_steps at most); remove them")
    return ""


def asha_on_steps_without_min_window(spec: SweepSpec) -> str:
    """ASHA on steps refuses a min_window_s that would run trials past num_steps.

    budget.min_window_s: N would run trials past num_steps, where ASHA ... compares and ends them at equal
    steps; remove min_window_s and give a num_steps long enough, or remove early_stopping"""
    es, b = spec.search.early_stopping, spec.budget
    if es is not None and es.grace_steps is not None and b.min_window_s:
        return (f"budget.min_window_s: {b.min_window_s:g} would run trials past num_steps, where ASHA "
                "(search.early_stopping.grace_steps) compares and ends them at equal steps; remove min_window_s "
                "and give a num_steps long enough, or remove early_stopping")
    return ""


def asha_needs_equal_steps(spec: SweepSpec) -> str:
    """ASHA needs equal steps, which an equal-data budget does not give.

    search.early_stopping: ASHA compares trials at equal steps, which an equal-data budget does not give;
    use budget.num_steps ..., add an objective.target ..., or remove it"""
    es = spec.search.early_stopping
    if es is not None and not spec.objective.time_to_target and spec.budget.num_steps is None:
        return ("search.early_stopping: ASHA compares trials at equal steps, which an equal-data budget does not "
                "give; use budget.num_steps with early stopping, add an objective.target (then trials are "
                "compared at equal training time, early_stopping.grace_s), or remove it")
    return ""


def a_target_is_checked_every_few_steps(spec: SweepSpec) -> str:
    """objective.target: set budget.eval_every_steps (how often each trial checks the target, e.g. 20)"""
    t = spec.objective.target
    if t is None:
        return ""
    problem = target_problem(t.metric, t.max, t.min, spec.budget.eval_every_steps or 0, "budget.eval_every_steps")
    return f"objective.target: {problem}" if problem else ""


def a_target_is_not_measured_across_restarts(spec: SweepSpec) -> str:
    """A time to target needs checkpoints off: it cannot be measured across a restart.

    objective.target: a time to target cannot be measured across a restart; set
    budget.checkpoint_every_steps: 0 ..."""
    if spec.objective.target is not None and spec.budget.checkpoint_every_steps:
        return ("objective.target: a time to target cannot be measured across a restart; set "
                "budget.checkpoint_every_steps: 0 (a crashed trial then reruns whole)")
    return ""


def a_target_is_an_evaluated_metric(spec: SweepSpec) -> str:
    """A target's metric must be one an evaluation measures.

    objective.target.metric: <metric> is not measured by an evaluation; use loss/val or an eval/<name>
    metric"""
    t = spec.objective.target
    if t is not None and not is_final_only(t.metric):
        return (f"objective.target.metric: {t.metric} is not measured by an evaluation; use loss/val or an "
                "eval/<name> metric")
    return ""


def the_data_budget_in_the_workloads_unit(spec: SweepSpec) -> str:
    """budget.num_samples: <trainable> counts tokens; use budget.num_tokens"""
    b, unit = spec.budget, registry.unit(spec.trainable.name)  # None: not declared (a user trainable may count either)
    if b.item_unit is not None and unit is not None and b.item_unit != unit:
        return f"budget.num_{b.item_unit}: {spec.trainable.name} counts {unit}; use budget.num_{unit}"
    return ""


def the_probe_runs_on_warm_groups(spec: SweepSpec) -> str:
    """search.probe_batch_size: the probe runs on warm worker groups; set scaling.reuse_workers: true ..."""
    if spec.search.probe_batch_size and not spec.scaling.reuse_workers:
        return ("search.probe_batch_size: the probe runs on warm worker groups; set scaling.reuse_workers: true "
                "(or drop the probe)")
    return ""


def the_probe_needs_a_searched_batch(spec: SweepSpec) -> str:
    """search.probe_batch_size: batch_size is fixed, so there is nothing to probe; search it ... or drop the probe"""
    if spec.search.probe_batch_size and "batch_size" not in spec.space.searched():
        return ("search.probe_batch_size: batch_size is fixed, so there is nothing to probe; search it (e.g. "
                "batch_size: {type: categorical, choices: [32, 64, 128, 256]}) or drop the probe")
    return ""


def a_grid_runs_each_point_once(spec: SweepSpec) -> str:
    """A grid runs each of its points once: num_trials is its number of combinations.

    budget.num_trials: the grid has N combinations (...); set num_trials: N (and the grid's own: a knob
    with no finite set of values)"""
    if spec.search.algorithm != "grid":
        return ""
    try:
        points = spec.space.grid_points()
    except ValueError as exc:  # a knob that has no finite set of values, named
        return str(exc)
    if len(points) != spec.budget.num_trials:
        sizes = " x ".join(f"{len(v)} {k}" for k, v in spec.space.grid_values().items()) or "1"
        return f"budget.num_trials: the grid has {len(points)} combinations ({sizes}); set num_trials: {len(points)}"
    return ""


def the_worker_count_in_one_place(spec: SweepSpec) -> str:
    """scaling.num_workers: N and space.num_workers are both given; keep one ..."""
    if spec.space.num_workers is not None and "num_workers" in spec.scaling.model_fields_set:
        return (f"scaling.num_workers: {spec.scaling.num_workers} and space.num_workers are both given; keep one "
                "(space.num_workers to search it, e.g. {type: categorical, choices: [1, 2, 4]})")
    return ""


def the_trainables_own_params_declared(spec: SweepSpec) -> str:
    """A trainable's own param is set in one place, to a value the trainable accepts.

    space.params.<name>: also set in trainable.params; keep it in one place ... (or the trainable's own
    problem with the value)"""
    from sweeps.spec.params import param_values

    own = spec.space.params
    both = sorted(set(own) & set(spec.trainable.params))
    if both:
        return (f"space.params.{both[0]}: also set in trainable.params; keep it in one place (space: to search it, "
                "trainable.params: to fix it)")
    for name, p in own.items():
        for value in param_values(p):
            for problem in registry.check_params(spec.trainable.name, {name: value}):
                return f"space.params.{name}: {problem.removeprefix(f'{name}: ')}"
    return ""


def money_needs_prices(spec: SweepSpec) -> str:
    """objective: cost/... needs prices: add a cost section ..."""
    named = [*spec.objective.metrics, *(c.metric for c in spec.objective.constraints)]
    money = next((m for m in named if m.startswith(COST_PREFIX)), None)
    if money is not None and spec.cost is None:
        return (f"objective: {money} needs prices: add a cost section (cost.prices or cost.price_file: each "
                "accelerator type's price per device-hour, with its date and source)")
    return ""


def every_type_priced(spec: SweepSpec) -> str:
    """cost: no price for <type> (a type the trials may run on); price it, or drop it from the space"""
    from sweeps.spec.cost import accelerator_types, priced_type

    if spec.cost is None:
        return ""
    for kind in accelerator_types(spec):
        priced = priced_type(spec, kind)
        if priced is None:
            return (f"cost: the trials are not pinned to a GPU type and {len(spec.cost.prices)} types are priced; "
                    "pin one (scaling.accelerator_type, or search space.accelerator_type)")
        if spec.cost.price(priced) is None:
            return (f"cost: no price for {priced} (a type the trials may run on; priced: "
                    f"{', '.join(sorted(spec.cost.prices))}); price it, or drop it from the space")
    return ""


def the_type_in_one_place(spec: SweepSpec) -> str:
    """scaling.accelerator_type and space.accelerator_type are both given; keep one ..."""
    if spec.space.accelerator_type is not None and spec.scaling.accelerator_type is not None:
        return ("scaling.accelerator_type and space.accelerator_type are both given; keep one (space.accelerator_type "
                "to search it, e.g. {type: categorical, choices: [A100, H100]})")
    return ""


def the_scaler_cannot_follow_sharding(spec: SweepSpec) -> str:
    """What a sharded strategy cannot train with, where a trial may draw both.

    space: precision 16-mixed cannot train with a sharded strategy (fsdp, fsdp_no_reshard) ...; use bf16-mixed
    (or: cpu_offload needs a sharded strategy ...)"""
    from sweeps.spec.params import param_values

    def values(knob: str, default: object) -> list[object]:
        p = spec.space.param(knob)
        return param_values(p) if p is not None else [default]

    for strategy in values("strategy", "ddp"):
        for precision in values("precision", "32"):
            for offload in values("cpu_offload", False):
                if found := sharding_problem(str(strategy), str(precision), offload is True):
                    return f"space: {found} (a trial may draw both: drop one from the space)"
    for offload in values("cpu_offload", False):
        for norm in values("max_grad_norm", 0.0):
            if found := offload_problem(offload is True, spec.scaling.use_gpu, float(norm)):  # type: ignore[arg-type]
                return f"space: {found} (a trial may draw both: drop one from the space)"
    return ""


def a_fixed_global_batch_divides(spec: SweepSpec) -> str:
    """A fixed global batch sets each trial's accumulation, so each micro-batch x ranks must divide it.

    budget.global_batch_size: G is not a multiple of batch_size b x num_workers n = b*n; give batch sizes
    that divide G / n (here: ...), or another global batch (or: space.grad_accum_steps follows from it, or
    batch_size a list of its divisors)"""
    from sweeps.spec.params import CategoricalParam, FixedParam
    from sweeps.spec.space import worker_counts

    total = spec.budget.global_batch_size
    if not total:
        return ""
    if spec.space.param("grad_accum_steps") is not None:
        return ("space.grad_accum_steps: with budget.global_batch_size it follows from each trial's batch_size x "
                "num_workers (global_batch_size / both); remove it from the space")
    batch = spec.space.held("batch_size")
    if not isinstance(batch, (CategoricalParam, FixedParam)):
        return ("space.batch_size: with budget.global_batch_size each batch size must divide the global batch, which a "
                "range's values mostly do not; give a list of divisors, e.g. {type: categorical, choices: "
                f"{_divisors(total // worker_counts(spec)[0])[-4:]}}}")
    from sweeps.spec.params import param_values

    for workers in worker_counts(spec):
        for b in sorted(int(v) for v in param_values(batch)):
            if total % (b * workers):
                fits = _divisors(total // workers) if total % workers == 0 else []
                return (f"budget.global_batch_size: {total} is not a multiple of batch_size {b} x num_workers "
                        f"{workers} = {b * workers}; give batch sizes that divide "
                        + (f"{total // workers} (its share per rank at {workers} rank{'s' if workers > 1 else ''}): {', '.join(map(str, fits[-8:]))}"
                           if fits else f"its share per rank (none does: {total} is not a multiple of {workers} ranks)")
                        + "; or another global batch")
    return ""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


RULES: tuple[Callable[[SweepSpec], str], ...] = (
    objective_in_the_workloads_unit,
    asha_ranks_by_one_metric,
    asha_on_a_target_counts_seconds,
    grace_s_is_for_a_target,
    asha_reads_progress_reports,
    grace_below_num_steps,
    asha_on_steps_without_time_boxes,
    a_target_sets_the_length,
    asha_on_steps_without_min_window,
    asha_needs_equal_steps,
    a_target_is_checked_every_few_steps,
    a_target_is_not_measured_across_restarts,
    a_target_is_an_evaluated_metric,
    the_data_budget_in_the_workloads_unit,
    the_probe_runs_on_warm_groups,
    the_probe_needs_a_searched_batch,
    a_grid_runs_each_point_once,
    the_worker_count_in_one_place,
    the_trainables_own_params_declared,
    money_needs_prices,
    every_type_priced,
    the_type_in_one_place,
    the_scaler_cannot_follow_sharding,
    a_fixed_global_batch_divides,
)


def problems(spec: SweepSpec) -> list[str]:
    """Every rule's problem with `spec`, in `RULES`' order."""
    return [found for rule in RULES if (found := rule(spec))]
