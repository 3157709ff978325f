"""Every metric a trial or a sweep logs, declared once in one table (`METRICS`).

Each declaration holds the metric's key, unit, how it is measured, when it is absent, which report carries it,
how ranks combine it and whether a spec may name it. The contract's vocabulary (`KNOWN_METRICS`,
`is_final_only`, `SWEEP_LEVEL_METRICS`), the telemetry's rank combination and the documentation's metrics page
(`python -m sweeps.ops.docs`) are read from this table.

This is the only place a metric key is written: each is declared as a module-level name (`LOSS_TRAIN`)
that every user imports (through `trainables.contract`, which re-exports them); a key holding `<unit>`
stands for one key per counting unit (`samples`, `tokens`), `<precision>` for `bf16` and `fp16`, and is
spelled by its function (`throughput_key(unit)`). The key families code tests a prefix against
(`EVAL_PREFIX`, ...) are declared here too. tests/loop/test_metrics.py fails on a key written anywhere
else in `sweeps/` or `trainables/`. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

UNITS: tuple[str, ...] = ("samples", "tokens")
PRECISION_LABELS: tuple[str, ...] = ("bf16", "fp16")  # the mixed precisions' labels in a key
UNIT_SLOT, PRECISION_SLOT = "<unit>", "<precision>"  # in a templated key, what its function fills in
_SLOTS = ((UNIT_SLOT, UNITS), (PRECISION_SLOT, PRECISION_LABELS))


def _expand(key: str) -> tuple[str, ...]:
    """A declared key's every spelling: one per value of its slot, or the key itself."""
    for slot, values in _SLOTS:
        if slot in key:
            return tuple(key.replace(slot, v) for v in values)
    return (key,)


@dataclass(frozen=True)
class Metric:
    key: str
    unit: str
    measured: str
    absent: str = ""  # when it is not logged (never a made-up 0)
    final_only: bool = False  # only the trial's final report carries it
    sweep_level: bool = False  # the sweep adds it after its trials (from several trials)
    nameable: bool = True  # a spec's objective or constraint may name it
    ranks: str = ""  # how a per-rank telemetry value combines over ranks: mean, max, min, sum ("" : not telemetry)

    def keys(self) -> tuple[str, ...]:
        return _expand(self.key)


_TABLE: list[Metric] = []  # in declaration order: the metrics page lists them so
_UNLISTED: list[str] = []  # keys a report carries for the service's own bookkeeping: not on the metrics page


def _declare(metric: Metric) -> str:
    """Adds `metric` to the table and returns its key."""
    assert metric.key not in {m.key for m in _TABLE} | set(_UNLISTED), f"{metric.key} declared twice"
    _TABLE.append(metric)
    return metric.key


def _unlisted(key: str) -> str:
    """Declares a key the metrics page does not list and returns it."""
    assert key not in {m.key for m in _TABLE} | set(_UNLISTED), f"{key} declared twice"
    _UNLISTED.append(key)
    return key


_NO_GPU = "no NVIDIA GPU (NVML) on a rank"
_NO_DDP = "one rank"
_NO_TARGET = "no `objective.target`, or the target was missed"
_NO_TRACE = "no trace: `telemetry.trace_steps: 0`, warm-up too short for it (`trace/skipped` says why)"
_UNPRICED = "no price for the trial's accelerator type (no `cost` section)"

_THROUGHPUT = _declare(Metric(
    "throughput/<unit>_per_s", "items/s", "items counted by `count_items` on all ranks / wall time of the "
    "slowest rank, over the report's window; the window's clock leaves out periodic evaluations and the "
    "handing on of reports and checkpoints"))
_THROUGHPUT_PER_WORKER = _declare(Metric(
    "throughput/<unit>_per_s_per_worker", "items/s", "the same / number of workers"))
_THROUGHPUT_CV = _declare(Metric(
    "throughput/<unit>_per_s_cv_pct", "%", "the throughput's spread over ~10 sub-windows of the measured "
    "window, stdev/mean", "fewer than 3 sub-windows", final_only=True))
LOSS_TRAIN = _declare(Metric("loss/train", "loss", "mean training loss over the last reporting interval (all ranks)"))
LOSS_VAL = _declare(Metric(
    "loss/val", "loss", "held-out validation loss at the end, every validation sample counted once, "
    "weighted by its counted items", "a probe trial", final_only=True))
STEP_TIME_MS = _declare(Metric("time/step_ms", "ms", "mean optimizer-step time over the report's window"))
DATA_WAIT_PCT = _declare(Metric(
    "time/data_wait_pct", "%", "share of the window spent blocked waiting for the next batch (mean over ranks)"))
ALLREDUCE_WAIT_PCT = _declare(Metric(
    "time/allreduce_wait_pct", "%", "share of the window each rank waited, after its backward, for the "
    "gradient all-reduce to finish (the communication backward did not hide), mean over ranks", _NO_DDP))
H2D_COPY_PCT = _declare(Metric(
    "time/h2d_copy_pct", "%", "host-to-device copy time (CUDA events, no host sync) as a share of the window",
    "a CPU trial", ranks="mean"))
H2D_GB_PER_S = _declare(Metric(
    "copy/h2d_gb_per_s", "GB/s", "host-to-device bytes per second of the window, mean per rank", "a CPU trial"))
TFLOPS = _declare(Metric(
    "perf/tflops_per_s", "TFLOP/s", "achieved training FLOP/s of all ranks",
    "the workload does not know its FLOPs", final_only=True))
MFU_PCT = _declare(Metric(
    "perf/mfu_pct", "%", "`perf/tflops_per_s` / the sum of each rank's own GPU peak at the trial's precision "
    "(`trainables/peak_flops.py`: H100, H200, A100, V100)", "a device outside the peak table (a CPU)",
    final_only=True))
HW_TFLOPS = _declare(Metric(
    "perf/hardware_tflops_per_s", "TFLOP/s", "`perf/tflops_per_s` plus the forward FLOPs activation checkpointing "
    "runs again in backward (counted in the one-sample forward of `trainables.memory_model`; equal to it without "
    "checkpointing)", "the workload does not know its FLOPs, or the forward could not be measured", final_only=True))
HFU_PCT = _declare(Metric(
    "perf/hfu_pct", "%", "hardware FLOPs utilisation: `perf/hardware_tflops_per_s` / the same peak as "
    "`perf/mfu_pct`, which counts the model's FLOPs only (recomputation is not useful work)",
    "as `perf/mfu_pct`, or the forward could not be measured", final_only=True))
SCALING_EFFICIENCY_PCT = _declare(Metric(
    "perf/scaling_efficiency_pct", "%", "throughput(N ranks) / (throughput(M) x N / M) against the twin "
    "trial with the fewest ranks M < N", "no twin with fewer ranks", final_only=True, sweep_level=True))
STEPS = _declare(Metric("progress/steps", "steps", "measured steps so far (at the end: the steps run)", nameable=False))
WORLD_SIZE = _declare(Metric("progress/world_size", "ranks", "number of ranks", nameable=False))
_SEEN = _declare(Metric(
    "progress/<unit>_seen", "items", "items trained on, all ranks, warm-up included: what an equal-data "
    "budget equalises"))
LOOP_S = _declare(Metric(
    "time/loop_total_s", "s", "the loop's own wall time: build, data, warm-up, measured steps, validation",
    final_only=True))
WARMUP_S = _declare(Metric(
    "time/warmup_s", "s", "the loop's time before the measured window: build, loader start-up, `compile`, "
    "warm-up steps", final_only=True))
WARMUP_STEPS_S = _declare(Metric(
    "time/warmup_steps_s", "s", "of that, the timed warm-up steps (from step 1; max over ranks): what "
    "`max_warmup_s` bounds", "under 2 warm-up steps", final_only=True))
COMPILE_GRAPHS = _declare(Metric(
    "compile/graphs_captured", "graphs", "graphs `torch.compile`'s dynamo captured during the trial, on rank 0. 0: the "
    "trial ran code an earlier trial of its warm process compiled, and its `time/warmup_s` holds no compilation",
    "compile off", final_only=True))
COMPILE_CACHE_HITS = _declare(Metric(
    "compile/graphs_cached", "graphs", "of the graphs inductor was asked for, those it took from its FX graph cache "
    "instead of compiling, on rank 0 during the trial", "compile off", final_only=True))
COMPILE_CACHE_MISSES = _declare(Metric(
    "compile/graphs_compiled", "graphs", "of the graphs inductor was asked for, those it compiled (the FX graph "
    "cache's misses and bypasses), on rank 0 during the trial; with the cache off (TORCHINDUCTOR_FX_GRAPH_CACHE=0) "
    "inductor counts none", "compile off", final_only=True))
BUILD_S = _declare(Metric(
    "time/build_s", "s", "the trial's build (workload and its data, model to the device, FLOP count, DDP, "
    "optimizer), max over ranks", final_only=True))
DATA_PREP_S = _declare(Metric(
    "time/data_prep_s", "s", "of the build, the data files written for the node by `ensure_cached` (or "
    "waited for), max over ranks; 0 when found made", "a workload whose data does not go through it",
    final_only=True))
WINDOW_S = _declare(Metric(
    "time/window_s", "s", "the measured window's length (max over ranks; periodic evaluations and the "
    "handing on of reports left out)", final_only=True))
REPORT_WAIT_S = _declare(Metric(
    "time/report_wait_s", "s", "of the window's wall time, what handing its reports and checkpoints on took "
    "(max over ranks): left out of `time/window_s`, counted by `max_window_s`", "no window",
    final_only=True))
CPU_WORKER_PCT = _declare(Metric(
    "cpu/worker_util_mean_pct", "% of a core", "CPU use of each training process (psutil), mean over ranks",
    ranks="mean"))
CPU_LOADERS_PCT = _declare(Metric(
    "cpu/loader_util_mean_pct", "% of a core", "CPU use of each rank's dataloader workers, summed, mean "
    "over ranks", "no loader workers", ranks="mean"))
CPU_CORES_USED = _declare(Metric(
    "cpu/cores_used", "cores", "cores busy for the whole trial (training processes and loader workers, all "
    "ranks); the param `cpus_reserved` is what it had"))
CPU_OTHER_CORES = _declare(Metric(
    "contention/cpu_other_cores", "cores", "what processes outside the trial kept busy on its busiest node "
    "while the window ran: the node's busy CPU time (all processes, hypervisor steal included) less the "
    "trial's own ranks and loader workers there, per second of the window; another sweep's trial, a "
    "build, a second user", "telemetry off (`telemetry.period_s: 0`), or a window shorter than two samples"))
GPU_OTHER_PROCS = _declare(Metric(
    "contention/gpu_other_procs", "processes", "the most compute processes besides the rank's own seen on "
    "any of the trial's GPUs (NVML) while the window ran", _NO_GPU + ", or NVML cannot list processes",
    ranks="max"))
GPU_UTIL_MEAN_PCT = _declare(Metric(
    "gpu/util_mean_pct", "%", "NVML utilisation of each worker's own GPU (matched by UUID), mean", _NO_GPU,
    ranks="mean"))
GPU_UTIL_P10_PCT = _declare(Metric(
    "gpu/util_p10_pct", "%", "the same, 10th percentile", _NO_GPU, nameable=False, ranks="mean"))
GPU_MEM_PEAK_GIB = _declare(Metric("gpu/mem_peak_gib", "GiB", "NVML memory used, peak", _NO_GPU, ranks="max"))
GPU_POWER_MEAN_W = _declare(Metric("gpu/power_mean_w", "W", "NVML power, mean", _NO_GPU, ranks="mean"))
GPU_TEMP_MAX_C = _declare(Metric("gpu/temp_max_c", "C", "NVML temperature, max", _NO_GPU, nameable=False, ranks="max"))
GPU_SM_CLOCK_MEAN_MHZ = _declare(Metric(
    "gpu/sm_clock_mean_mhz", "MHz", "NVML SM clock, mean", _NO_GPU, nameable=False, ranks="mean"))
GPU_SM_ACTIVE_PCT = _declare(Metric(
    "gpu/sm_active_mean_pct", "%", "GPM SM activity", "a GPU without GPM (before Hopper)", nameable=False,
    ranks="mean"))
GPU_TENSOR_ACTIVE_PCT = _declare(Metric(
    "gpu/tensor_active_mean_pct", "%", "GPM tensor-core activity", "a GPU without GPM (before Hopper)",
    nameable=False, ranks="mean"))
ENERGY_TOTAL_J = _declare(Metric(
    "energy/total_j", "J", "NVML energy counter delta over the window, all GPUs", _NO_GPU, nameable=False,
    ranks="sum"))
_ENERGY_PER_1K = _declare(Metric("energy/per_1k_<unit>_j", "J", "`energy/total_j` per 1000 items", _NO_GPU))
MEM_MAX_ALLOCATED_GIB = _declare(Metric(
    "memory/max_allocated_gib", "GiB", "torch allocator's peak allocated", "a CPU trial", nameable=False,
    ranks="max"))
MEM_MAX_RESERVED_GIB = _declare(Metric(
    "memory/max_reserved_gib", "GiB", "torch allocator's peak reserved", "a CPU trial", nameable=False,
    ranks="max"))
MEM_ALLOC_RETRIES = _declare(Metric(
    "memory/alloc_retries", "count", "times the CUDA caching allocator freed its cache and retried a failed "
    "allocation (`torch.cuda.memory_stats()[\"num_alloc_retries\"]`) since the window began: above 0, the trial runs "
    "at its memory's edge", "a CPU trial", nameable=False, ranks="max"))
MEM_PEAK_RSS_GIB = _declare(Metric(
    "memory/peak_rss_gib", "GiB", "a rank's peak resident host memory over the measured window (Linux `VmHWM`, "
    "reset at the window's start by writing 5 to `/proc/self/clear_refs`), max over ranks: on a CPU, what the "
    "trial's model, optimizer and activations used", "not Linux, or its peak cannot be reset there", ranks="max"))
MEM_PREDICTED_GIB = _declare(Metric(
    "memory/predicted_gib", "GiB", "the rank's peak predicted before its first step (`trainables.memory_model`): "
    "model states by strategy from the parameter count, plus activations from one measured forward of one sample "
    "times the micro-batch, under the trial's activation checkpointing; compare with `memory/max_allocated_gib` on "
    "a GPU (on a CPU the resident set also holds the process's libraries and data: compare orders)",
    "a probe, a workload without validation data, an optimizer whose state is not known, or a forward the "
    "measurement cannot run (a warning says why)", final_only=True))
MEM_PREDICTED_ACTIVATIONS_GIB = _declare(Metric(
    "memory/predicted_activations_gib", "GiB", "of `memory/predicted_gib`: what the micro-batch's forward keeps "
    "for backward", "as `memory/predicted_gib`", final_only=True))
MEM_HEADROOM_GIB = _declare(Metric(
    "memory/headroom_gib", "GiB", "what is left of the device (host memory on a CPU), min over ranks",
    ranks="min"))
MEM_TOTAL_GIB = _declare(Metric(
    "memory/total_gib", "GiB", "the device's memory, min over ranks", nameable=False, ranks="min"))
GRAD_NOISE_SCALE = _declare(Metric(
    "stats/grad_noise_scale", "items", "gradient noise scale B_simple = tr(Sigma)/|G|^2 in the counted unit, "
    "from each rank's gradient before and after DDP's all-reduce (one rank: its micro-batches), EMA-smoothed",
    "one rank without accumulation"))
TIME_TO_TARGET_S = _declare(Metric(
    "time/to_target_s", "s", "wall time (evaluations and warm-up included) until the evaluation that met "
    "the target", _NO_TARGET, final_only=True))
STEPS_TO_TARGET = _declare(Metric(
    "progress/steps_to_target", "steps", "optimizer steps until the evaluation that met the target",
    _NO_TARGET, final_only=True))
ELAPSED_S = _declare(Metric(
    "time/elapsed_s", "s", "with a target and early stopping: the same clock at each measured evaluation, "
    "the curve ASHA compares trials on; not an objective", "no `report_evals`", nameable=False))
TARGET_BEST = _declare(Metric(
    "quality/target_best", "the target's", "best value of the target metric any evaluation reached",
    "no `objective.target`", final_only=True))
EVALS = _declare(Metric("progress/evals", "evaluations", "periodic evaluations run", final_only=True))
EVAL_TOTAL_S = _declare(Metric(
    "time/eval_total_s", "s", "time the periodic evaluations took (counted in `time/to_target_s`)",
    final_only=True))
PREDICT_TIME_TO_TARGET_S = _declare(Metric(
    "predict/time_to_target_s", "s", "the noise-scale model's estimate of the time to target",
    "no target, or no noise scale", final_only=True, sweep_level=True))
PREDICT_ERROR_PCT = _declare(Metric(
    "predict/error_pct", "%", "predicted / measured time to target - 1", "no prediction or no measured time",
    final_only=True, sweep_level=True))
SOL_PCT = _declare(Metric(
    "perf/sol_pct", "%", "speed of light: `perf/tflops_per_s` / this hardware's measured matmul peak at the "
    "trial's precision (`sweeps doctor`'s figures: per GPU x ranks, or per core x ranks x threads on CPU)",
    "no FLOP count, or no measured peak", final_only=True, sweep_level=True, nameable=False))
INPUT_SOL_PCT = _declare(Metric(
    "perf/input_sol_pct", "%", "image-cnn only: `throughput/samples_per_s` / (measured decode rate per core "
    "x max(1, loader workers) x ranks): near 100, the loader workers are the ceiling",
    "another workload, or no decode figure for its image size", final_only=True, sweep_level=True,
    nameable=False))
H2D_BW_PCT = _declare(Metric(
    "perf/h2d_bw_pct", "%", "`copy/h2d_gb_per_s` / the measured host-to-device bandwidth (pinned or pageable "
    "as the trial's `pin_memory`)", "a CPU trial", final_only=True, sweep_level=True, nameable=False))
_MATMUL_OF_FP32 = _declare(Metric(
    "matmul/<precision>_of_fp32_pct", "%", "CPU: this machine's measured bf16 (or fp16) matmul peak / its fp32 "
    "peak, copied onto every trial scored against it (with `matmul/<precision>_emulated`): its verdict knows "
    "whether the precision is emulated", "a GPU trial, or no doctor figures", final_only=True,
    sweep_level=True, nameable=False))
TRACE_COMPUTE_PCT = _declare(Metric(
    "trace/compute_pct", "%", "of the traced warm-up steps' wall time, in operators on the training thread "
    "(CPU: its `cpu_op` events outside `c10d::`; GPU: Holistic Trace Analysis' compute time), mean over ranks",
    _NO_TRACE, final_only=True))
TRACE_DATA_WAIT_PCT = _declare(Metric(
    "trace/data_wait_pct", "%", "... waiting for the next batch (the DataLoader's `__next__` on the training "
    "thread), mean over ranks", _NO_TRACE, final_only=True))
TRACE_EXPOSED_PCT = _declare(Metric(
    "trace/comm_exposed_pct", "%", "... with the gradient all-reduce running and the training thread neither "
    "computing nor waiting for data: communication compute did not hide, mean over ranks", _NO_TRACE,
    final_only=True))
TRACE_IDLE_PCT = _declare(Metric(
    "trace/idle_pct", "%", "... none of these: Python and framework overhead between operators, other waits "
    "(GPU: the GPU idle); compute + data wait + exposed communication + idle = 100", _NO_TRACE, final_only=True))
TRACE_COMM_PCT = _declare(Metric(
    "trace/comm_pct", "%", "... with communication running, hidden or not (CPU: gloo's spans on its "
    "`pt_gloo_runloop` threads)", _NO_TRACE, final_only=True))
TRACE_MEMCPY_PCT = _declare(Metric(
    "trace/memcpy_pct", "%", "GPU: ... in memory-copy kernels (Holistic Trace Analysis' kernel breakdown)",
    "a CPU trial, or no trace", final_only=True))
TRACE_EXPOSED_MAX_PCT = _declare(Metric(
    "trace/comm_exposed_max_pct", "%", "the largest rank's `trace/comm_exposed_pct`", _NO_TRACE,
    final_only=True))
TRACE_EXPOSED_MAX_RANK = _declare(Metric(
    "trace/comm_exposed_max_rank", "rank", "which rank that is", _NO_TRACE, final_only=True, nameable=False))
TRACE_STEP_MS = _declare(Metric(
    "trace/step_ms", "ms", "a traced step's wall time (the slowest rank's)", _NO_TRACE, final_only=True))
TRACE_S = _declare(Metric(
    "time/trace_s", "s", "what writing, gzipping, keeping and splitting the trace took (max over ranks), in "
    "warm-up's time; left out of the window's calibration",
    "`telemetry.trace_steps: 0`, or a probe trial", final_only=True))
TRACE_STEPS = _declare(Metric(
    "trace/steps", "tag", "the warm-up steps traced, e.g. `3-4`", _NO_TRACE, final_only=True, nameable=False))
TRACE_PER_RANK = _declare(Metric(
    "trace/per_rank", "tag", "each rank's split in words", _NO_TRACE, final_only=True, nameable=False))
TRACE_SKIPPED = _declare(Metric(
    "trace/skipped", "tag", "why a trial has no trace figures (warm-up too short, the split failed)",
    "a trace was split", final_only=True, nameable=False))
USD_PER_HOUR = _declare(Metric(
    "cost/usd_per_hour", "$/h", "what the trial's devices cost per hour: its accelerator type's price "
    "(`cost.prices`: per GPU-hour, or per core-hour on CPU) x the devices it holds (its GPUs; on CPU its "
    "cores, loader workers' share included: in a warm group the share the group holds, the most any trial "
    "of the space starts; a trial of its own, the param `cpus_reserved`)", _UNPRICED))
_USD_PER_1M = _declare(Metric(
    "cost/usd_per_1m_<unit>", "$", "`cost/usd_per_hour` / (`throughput/<unit>_per_s` x 3600) x 10^6: "
    "dollars per million items at the measured throughput", _UNPRICED))
USD_TO_TARGET = _declare(Metric(
    "cost/usd_to_target", "$", "`cost/usd_per_hour` x `time/to_target_s` / 3600",
    _UNPRICED + ", or the target was missed", final_only=True))
PREDICT_USD_TO_TARGET = _declare(Metric(
    "cost/predicted_usd_to_target", "$", "`cost/usd_per_hour` x `predict/time_to_target_s` / 3600",
    _UNPRICED + ", or no prediction", final_only=True, sweep_level=True))
TRIAL_USD = _declare(Metric(
    "cost/trial_usd", "$", "`cost/usd_per_hour` x the trial's own wall time, from its start to its final "
    "report (a warm group's start-up is the sweep's, not a trial's), summed over its attempts (a trial "
    "interrupted and run again by a resumed sweep)", _UNPRICED, final_only=True, sweep_level=True))
SWEEP_USD = _declare(Metric(
    "cost/sweep_usd", "$", "on the parent run: what the sweep held, summed over its drivers (a resumed "
    "sweep's runs): each warm group's devices at its price from asking for them to the group's end (its "
    "trials, the memory probe, its start-up, the time between trials and its teardown); without warm "
    "groups, its trials' `cost/trial_usd`. A driver killed outright never said what it held: then the "
    "figure is a lower bound and the tag `sweep.cost_at_least` says why", _UNPRICED, final_only=True,
    sweep_level=True, nameable=False))
QUALITY_GAP_PCT = _declare(Metric(
    "quality/gap_pct", "%", "`loss/val` vs the sweep's fp32 reference at equal data; past "
    "`quality.tolerance` the run is tagged `sweep.degraded`", "no fp32 reference at equal data",
    final_only=True, sweep_level=True))


# Keys a report carries that are not measurements (the metrics page does not list them).
FINAL = _unlisted("progress/final")  # 1 in the trial's last report (after validation), 0 in progress reports
RESTORED_FROM = _unlisted("progress/restored_from_step")  # measured steps a crashed attempt had done (resumed from them)
# 1.0 where this hardware emulates the mixed precision (copied onto trials beside `matmul/<precision>_of_fp32_pct`)
_MATMUL_EMULATED = _unlisted("matmul/<precision>_emulated")

METRICS: tuple[Metric, ...] = tuple(_TABLE)


def _spelled(template: str, slot: str, value: str) -> str:
    assert slot in template, (template, slot)
    return template.replace(slot, value)


def throughput_key(unit: str) -> str:
    """Global throughput (summed over ranks) for a workload counting in `unit`."""
    return _spelled(_THROUGHPUT, UNIT_SLOT, unit)


def per_worker_throughput_key(unit: str) -> str:
    return _spelled(_THROUGHPUT_PER_WORKER, UNIT_SLOT, unit)


def throughput_cv_key(unit: str) -> str:
    """The throughput's spread over the measured window's sub-windows: stdev / mean, in % (final report)."""
    return _spelled(_THROUGHPUT_CV, UNIT_SLOT, unit)


def seen_key(unit: str) -> str:
    """Items trained on, all ranks, warm-up included (what an equal-data budget equalises)."""
    return _spelled(_SEEN, UNIT_SLOT, unit)


def energy_key(unit: str) -> str:
    return _spelled(_ENERGY_PER_1K, UNIT_SLOT, unit)


def usd_per_million_key(unit: str) -> str:
    """Dollars per million items of the workload's unit at the measured throughput."""
    return _spelled(_USD_PER_1M, UNIT_SLOT, unit)


def matmul_of_fp32_key(label: str) -> str:
    """A mixed precision's (`label`: `bf16`, `fp16`) matmul peak as % of fp32's."""
    return _spelled(_MATMUL_OF_FP32, PRECISION_SLOT, label)


def matmul_emulated_key(label: str) -> str:
    """Whether the mixed precision `label` is emulated on this hardware (1.0) or native (0.0)."""
    return _spelled(_MATMUL_EMULATED, PRECISION_SLOT, label)


def _family(group: str) -> str:
    """The prefix `group/` of declared keys, for code that tests a key's group."""
    prefix = group + "/"
    assert any(m.key.startswith(prefix) for m in METRICS), f"no declared key in {prefix}"
    return prefix


# Key families code tests a prefix against.
THROUGHPUT_PREFIX = _family("throughput")
TIME_PREFIX = _family("time")
PERF_PREFIX = _family("perf")
PROGRESS_PREFIX = _family("progress")
ENERGY_PREFIX = _family("energy")
COST_PREFIX = _family("cost")
EVAL_PREFIX = "eval/"  # a workload's eval_fn metrics, eval/<name>: each workload names its own
DEVICE_PREFIX = "device/"  # the device facts a report carries (tags, not metrics: `trainables.devinfo`)
KEY_FAMILIES: tuple[str, ...] = (THROUGHPUT_PREFIX, TIME_PREFIX, PERF_PREFIX, PROGRESS_PREFIX, ENERGY_PREFIX,
                                 COST_PREFIX, EVAL_PREFIX, DEVICE_PREFIX)
# Every key declared above, each templated one in all its spellings.
DECLARED_KEYS: frozenset[str] = frozenset(k for key in (*(m.key for m in METRICS), *_UNLISTED) for k in _expand(key))
