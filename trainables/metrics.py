"""Every metric a trial or a sweep logs, declared once: its key, unit, how it is measured, when it is
absent, which report carries it, how ranks combine it and whether a spec may name it. The contract's
vocabulary (`KNOWN_METRICS`, `is_final_only`, `SWEEP_LEVEL_METRICS`), the telemetry's rank combination
and the documentation's metrics page (`python -m sweeps.ops.docs`) are read from this table.

A key holding `<unit>` stands for one key per counting unit (`samples`, `tokens`), `<precision>` for
`bf16` and `fp16`. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

UNITS: tuple[str, ...] = ("samples", "tokens")


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
        for slot, values in (("<unit>", UNITS), ("<precision>", ("bf16", "fp16"))):
            if slot in self.key:
                return tuple(self.key.replace(slot, v) for v in values)
        return (self.key,)


_NO_GPU = "no NVIDIA GPU (NVML) on a rank"
_NO_DDP = "one rank"
_NO_TARGET = "no `objective.target`, or the target was missed"
_NO_TRACE = "no trace: `telemetry.trace_steps: 0`, warm-up too short for it (`trace/skipped` says why)"
_UNPRICED = "no price for the trial's accelerator type (no `cost` section)"

METRICS: tuple[Metric, ...] = (
    Metric("throughput/<unit>_per_s", "items/s", "items counted by `count_items` on all ranks / wall time of the "
           "slowest rank, over the report's window; the window's clock leaves out periodic evaluations and the "
           "handing on of reports and checkpoints"),
    Metric("throughput/<unit>_per_s_per_worker", "items/s", "the same / number of workers"),
    Metric("throughput/<unit>_per_s_cv_pct", "%", "the throughput's spread over ~10 sub-windows of the measured "
           "window, stdev/mean", "fewer than 3 sub-windows", final_only=True),
    Metric("loss/train", "loss", "mean training loss over the last reporting interval (all ranks)"),
    Metric("loss/val", "loss", "held-out validation loss at the end, every validation sample counted once, "
           "weighted by its counted items", "a probe trial", final_only=True),
    Metric("time/step_ms", "ms", "mean optimizer-step time over the report's window"),
    Metric("time/data_wait_pct", "%", "share of the window spent blocked waiting for the next batch (mean over ranks)"),
    Metric("time/allreduce_wait_pct", "%", "share of the window each rank waited, after its backward, for the "
           "gradient all-reduce to finish (the communication backward did not hide), mean over ranks", _NO_DDP),
    Metric("time/h2d_copy_pct", "%", "host-to-device copy time (CUDA events, no host sync) as a share of the window",
           "a CPU trial", ranks="mean"),
    Metric("copy/h2d_gb_per_s", "GB/s", "host-to-device bytes per second of the window, mean per rank", "a CPU trial"),
    Metric("perf/tflops_per_s", "TFLOP/s", "achieved training FLOP/s of all ranks",
           "the workload does not know its FLOPs", final_only=True),
    Metric("perf/mfu_pct", "%", "`perf/tflops_per_s` / the sum of each rank's own GPU peak at the trial's precision "
           "(`trainables/peak_flops.py`: H100, H200, A100, V100)", "a device outside the peak table (a CPU)",
           final_only=True),
    Metric("perf/scaling_efficiency_pct", "%", "throughput(N ranks) / (throughput(M) x N / M) against the twin "
           "trial with the fewest ranks M < N", "no twin with fewer ranks", final_only=True, sweep_level=True),
    Metric("progress/steps", "steps", "measured steps so far (at the end: the steps run)", nameable=False),
    Metric("progress/world_size", "ranks", "number of ranks", nameable=False),
    Metric("progress/<unit>_seen", "items", "items trained on, all ranks, warm-up included: what an equal-data "
           "budget equalises"),
    Metric("time/loop_total_s", "s", "the loop's own wall time: build, data, warm-up, measured steps, validation",
           final_only=True),
    Metric("time/warmup_s", "s", "the loop's time before the measured window: build, loader start-up, `compile`, "
           "warm-up steps", final_only=True),
    Metric("time/warmup_steps_s", "s", "of that, the timed warm-up steps (from step 1; max over ranks): what "
           "`max_warmup_s` bounds", "under 2 warm-up steps", final_only=True),
    Metric("time/build_s", "s", "the trial's build (workload and its data, model to the device, FLOP count, DDP, "
           "optimizer), max over ranks", final_only=True),
    Metric("time/data_prep_s", "s", "of the build, the data files written for the node by `ensure_cached` (or "
           "waited for), max over ranks; 0 when found made", "a workload whose data does not go through it",
           final_only=True),
    Metric("time/window_s", "s", "the measured window's length (max over ranks; periodic evaluations and the "
           "handing on of reports left out)", final_only=True),
    Metric("time/report_wait_s", "s", "of the window's wall time, what handing its reports and checkpoints on took "
           "(max over ranks): left out of `time/window_s`, counted by `max_window_s`", "no window",
           final_only=True),
    Metric("cpu/worker_util_mean_pct", "% of a core", "CPU use of each training process (psutil), mean over ranks",
           ranks="mean"),
    Metric("cpu/loader_util_mean_pct", "% of a core", "CPU use of each rank's dataloader workers, summed, mean "
           "over ranks", "no loader workers", ranks="mean"),
    Metric("cpu/cores_used", "cores", "cores busy for the whole trial (training processes and loader workers, all "
           "ranks); the param `cpus_reserved` is what it had"),
    Metric("contention/cpu_other_cores", "cores", "what processes outside the trial kept busy on its busiest node "
           "while the window ran: the node's busy CPU time (all processes, hypervisor steal included) less the "
           "trial's own ranks and loader workers there, per second of the window; another sweep's trial, a "
           "build, a second user", "telemetry off (`telemetry.period_s: 0`), or a window shorter than two samples"),
    Metric("contention/gpu_other_procs", "processes", "the most compute processes besides the rank's own seen on "
           "any of the trial's GPUs (NVML) while the window ran", _NO_GPU + ", or NVML cannot list processes",
           ranks="max"),
    Metric("gpu/util_mean_pct", "%", "NVML utilisation of each worker's own GPU (matched by UUID), mean", _NO_GPU,
           ranks="mean"),
    Metric("gpu/util_p10_pct", "%", "the same, 10th percentile", _NO_GPU, nameable=False, ranks="mean"),
    Metric("gpu/mem_peak_gib", "GiB", "NVML memory used, peak", _NO_GPU, ranks="max"),
    Metric("gpu/power_mean_w", "W", "NVML power, mean", _NO_GPU, ranks="mean"),
    Metric("gpu/temp_max_c", "C", "NVML temperature, max", _NO_GPU, nameable=False, ranks="max"),
    Metric("gpu/sm_clock_mean_mhz", "MHz", "NVML SM clock, mean", _NO_GPU, nameable=False, ranks="mean"),
    Metric("gpu/sm_active_mean_pct", "%", "GPM SM activity", "a GPU without GPM (before Hopper)", nameable=False,
           ranks="mean"),
    Metric("gpu/tensor_active_mean_pct", "%", "GPM tensor-core activity", "a GPU without GPM (before Hopper)",
           nameable=False, ranks="mean"),
    Metric("energy/total_j", "J", "NVML energy counter delta over the window, all GPUs", _NO_GPU, nameable=False,
           ranks="sum"),
    Metric("energy/per_1k_<unit>_j", "J", "`energy/total_j` per 1000 items", _NO_GPU),
    Metric("memory/max_allocated_gib", "GiB", "torch allocator's peak allocated", "a CPU trial", nameable=False,
           ranks="max"),
    Metric("memory/max_reserved_gib", "GiB", "torch allocator's peak reserved", "a CPU trial", nameable=False,
           ranks="max"),
    Metric("memory/headroom_gib", "GiB", "what is left of the device (host memory on a CPU), min over ranks",
           ranks="min"),
    Metric("memory/total_gib", "GiB", "the device's memory, min over ranks", nameable=False, ranks="min"),
    Metric("stats/grad_noise_scale", "items", "gradient noise scale B_simple = tr(Sigma)/|G|^2 in the counted unit, "
           "from each rank's gradient before and after DDP's all-reduce (one rank: its micro-batches), EMA-smoothed",
           "one rank without accumulation"),
    Metric("time/to_target_s", "s", "wall time (evaluations and warm-up included) until the evaluation that met "
           "the target", _NO_TARGET, final_only=True),
    Metric("progress/steps_to_target", "steps", "optimizer steps until the evaluation that met the target",
           _NO_TARGET, final_only=True),
    Metric("time/elapsed_s", "s", "with a target and early stopping: the same clock at each measured evaluation, "
           "the curve ASHA compares trials on; not an objective", "no `report_evals`", nameable=False),
    Metric("quality/target_best", "the target's", "best value of the target metric any evaluation reached",
           "no `objective.target`", final_only=True),
    Metric("progress/evals", "evaluations", "periodic evaluations run", final_only=True),
    Metric("time/eval_total_s", "s", "time the periodic evaluations took (counted in `time/to_target_s`)",
           final_only=True),
    Metric("predict/time_to_target_s", "s", "the noise-scale model's estimate of the time to target",
           "no target, or no noise scale", final_only=True, sweep_level=True),
    Metric("predict/error_pct", "%", "predicted / measured time to target - 1", "no prediction or no measured time",
           final_only=True, sweep_level=True),
    Metric("perf/sol_pct", "%", "speed of light: `perf/tflops_per_s` / this hardware's measured matmul peak at the "
           "trial's precision (`sweeps doctor`'s figures: per GPU x ranks, or per core x ranks x threads on CPU)",
           "no FLOP count, or no measured peak", final_only=True, sweep_level=True, nameable=False),
    Metric("perf/input_sol_pct", "%", "image-cnn only: `throughput/samples_per_s` / (measured decode rate per core "
           "x max(1, loader workers) x ranks): near 100, the loader workers are the ceiling",
           "another workload, or no decode figure for its image size", final_only=True, sweep_level=True,
           nameable=False),
    Metric("perf/h2d_bw_pct", "%", "`copy/h2d_gb_per_s` / the measured host-to-device bandwidth (pinned or pageable "
           "as the trial's `pin_memory`)", "a CPU trial", final_only=True, sweep_level=True, nameable=False),
    Metric("matmul/<precision>_of_fp32_pct", "%", "CPU: this machine's measured bf16 (or fp16) matmul peak / its fp32 "
           "peak, copied onto every trial scored against it (with `matmul/<precision>_emulated`): its verdict knows "
           "whether the precision is emulated", "a GPU trial, or no doctor figures", final_only=True,
           sweep_level=True, nameable=False),
    Metric("trace/compute_pct", "%", "of the traced warm-up steps' wall time, in operators on the training thread "
           "(CPU: its `cpu_op` events outside `c10d::`; GPU: Holistic Trace Analysis' compute time), mean over ranks",
           _NO_TRACE, final_only=True),
    Metric("trace/data_wait_pct", "%", "... waiting for the next batch (the DataLoader's `__next__` on the training "
           "thread), mean over ranks", _NO_TRACE, final_only=True),
    Metric("trace/comm_exposed_pct", "%", "... with the gradient all-reduce running and the training thread neither "
           "computing nor waiting for data: communication compute did not hide, mean over ranks", _NO_TRACE,
           final_only=True),
    Metric("trace/idle_pct", "%", "... none of these: Python and framework overhead between operators, other waits "
           "(GPU: the GPU idle); compute + data wait + exposed communication + idle = 100", _NO_TRACE, final_only=True),
    Metric("trace/comm_pct", "%", "... with communication running, hidden or not (CPU: gloo's spans on its "
           "`pt_gloo_runloop` threads)", _NO_TRACE, final_only=True),
    Metric("trace/memcpy_pct", "%", "GPU: ... in memory-copy kernels (Holistic Trace Analysis' kernel breakdown)",
           "a CPU trial, or no trace", final_only=True),
    Metric("trace/comm_exposed_max_pct", "%", "the largest rank's `trace/comm_exposed_pct`", _NO_TRACE,
           final_only=True),
    Metric("trace/comm_exposed_max_rank", "rank", "which rank that is", _NO_TRACE, final_only=True, nameable=False),
    Metric("trace/step_ms", "ms", "a traced step's wall time (the slowest rank's)", _NO_TRACE, final_only=True),
    Metric("time/trace_s", "s", "what writing, gzipping, keeping and splitting the trace took (max over ranks), in warm-up's time; "
           "left out of the window's calibration",
           "`telemetry.trace_steps: 0`, or a probe trial", final_only=True),
    Metric("trace/steps", "tag", "the warm-up steps traced, e.g. `3-4`", _NO_TRACE, final_only=True, nameable=False),
    Metric("trace/per_rank", "tag", "each rank's split in words", _NO_TRACE, final_only=True, nameable=False),
    Metric("trace/skipped", "tag", "why a trial has no trace figures (warm-up too short, the split failed)",
           "a trace was split", final_only=True, nameable=False),
    Metric("cost/usd_per_hour", "$/h", "what the trial's devices cost per hour: its accelerator type's price "
           "(`cost.prices`: per GPU-hour, or per core-hour on CPU) x the devices it holds (its GPUs; on CPU its "
           "cores, loader workers' share included: in a warm group the share the group holds, the most any trial "
           "of the space starts; a trial of its own, the param `cpus_reserved`)", _UNPRICED),
    Metric("cost/usd_per_1m_<unit>", "$", "`cost/usd_per_hour` / (`throughput/<unit>_per_s` x 3600) x 10^6: "
           "dollars per million items at the measured throughput", _UNPRICED),
    Metric("cost/usd_to_target", "$", "`cost/usd_per_hour` x `time/to_target_s` / 3600",
           _UNPRICED + ", or the target was missed", final_only=True),
    Metric("cost/predicted_usd_to_target", "$", "`cost/usd_per_hour` x `predict/time_to_target_s` / 3600",
           _UNPRICED + ", or no prediction", final_only=True, sweep_level=True),
    Metric("cost/trial_usd", "$", "`cost/usd_per_hour` x the trial's own wall time, from its start to its final "
           "report (a warm group's start-up is the sweep's, not a trial's), summed over its attempts (a trial "
           "interrupted and run again by a resumed sweep)", _UNPRICED, final_only=True, sweep_level=True),
    Metric("cost/sweep_usd", "$", "on the parent run: what the sweep held, summed over its drivers (a resumed "
           "sweep's runs): each warm group's devices at its price from asking for them to the group's end (its "
           "trials, the memory probe, its start-up, the time between trials and its teardown); without warm "
           "groups, its trials' `cost/trial_usd`. A driver killed outright never said what it held: then the "
           "figure is a lower bound and the tag `sweep.cost_at_least` says why", _UNPRICED, final_only=True,
           sweep_level=True, nameable=False),
    Metric("quality/gap_pct", "%", "`loss/val` vs the sweep's fp32 reference at equal data; past "
           "`quality.tolerance` the run is tagged `sweep.degraded`", "no fp32 reference at equal data",
           final_only=True, sweep_level=True),
)
