"""Bottleneck verdict per trial: what bounds it, in one line, from its measured figures.

The rules, in the order they are tried (the first that matches wins):

| verdict | when | suggestion |
|---|---|---|
| input-bound | data wait >= 20% of the measured window (and, on a GPU, utilisation < 80%) | more `num_dataloader_workers`, `pin_memory` on GPU, cheaper decode/augment |
| compute-bound (GPU) | SM activity (GPM, Hopper+) >= 80%, or where GPM is missing NVML utilisation >= 90% | `bf16-mixed`/`tf32` on Tensor Cores, `compile` |
| memory headroom | GPU and less than half of the device's memory reserved at peak | larger `batch_size` |
| underutilised (GPU) | below the compute-bound bar and data wait < 20% | larger `batch_size`, `compile` (fewer launches) |
| compute-bound (CPU) | no GPU; the rank's cores are >= 80% busy: its training process, plus its loader workers when they share its cores (`cpus_per_loader_worker: 0`) | `bf16-mixed` where the CPU has avx512_bf16/AMX, `compile`, more `cpus_per_worker` |
| underutilised (CPU) | no GPU; the rank keeps less than 80% of even one core busy: it idles in the gradient all-reduce (waiting for a slower rank) or for a core another process holds | larger `batch_size`; fp32 where bf16 is emulated (no avx512_bf16/AMX) |
| unclear | none of the above (or the figures are missing) | - |

A suggestion never names what the trial already uses (bf16-mixed to a bf16-mixed trial, `compile`
to a compiled one, `pin_memory` to a pinned one, a GPU-only knob on a CPU). Where the loop
reports speed-of-light figures, the verdict quotes them: `perf/sol_pct` (achieved FLOP/s over the
measured peak for the trial's precision), `perf/input_sol_pct` (samples/s over what its loader
workers can decode), `perf/h2d_bw_pct` (host-to-device copy bandwidth over the measured peak).

"GPU busy" is the best signal the GPU gives: GPM SM activity (the share of SMs with work) where it
exists, else NVML utilisation, which only says that *some* kernel ran in each sample period (a
single tiny kernel reads as 100%). Communication-bound is not diagnosed yet: collective time is not
measured separately.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sweeps.sol import H2D_BW_PCT, INPUT_SOL_PCT, SOL_PCT  # measured against `sweeps doctor` figures
from trainables.contract import (
    CPU_LOADERS_PCT,
    CPU_WORKER_PCT,
    DATA_WAIT_PCT,
    GPU_UTIL_MEAN_PCT,
    MEM_HEADROOM_GIB,
    MEM_TOTAL_GIB,
)

SM_ACTIVE_PCT = "gpu/sm_active_mean_pct"
INPUT_WAIT_PCT = 20.0
# "GPU busy" per signal: (compute-bound at or above, input-bound only below)
GPU_BUSY: dict[str, tuple[float, float]] = {SM_ACTIVE_PCT: (80.0, 70.0), GPU_UTIL_MEAN_PCT: (90.0, 80.0)}
_SIGNAL_NAME = {SM_ACTIVE_PCT: "SM active (GPM)", GPU_UTIL_MEAN_PCT: "GPU busy"}
MEMORY_USED_FRACTION = 0.5
CPU_BUSY_FRACTION = 0.8
NEAR_PEAK_PCT = 60.0  # at or above: a speed-of-light figure leaves little to gain from that knob
SATURATED_PCT = 80.0  # loader workers at or above this share of their decode capacity are the limit
_FAST_CPU_ISA = ("amx_bf16", "avx512_bf16")
_PEAK_NAME = {"32": "fp32", "tf32": "tf32", "16-mixed": "fp16", "bf16-mixed": "bf16"}  # whose peak a trial is held to


@dataclass(frozen=True)
class Verdict:
    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


def _text(value: Any) -> str:
    return str(value).strip().lower()


def _on(params: dict[str, Any], knob: str) -> bool:
    return _text(params.get(knob, False)) in ("true", "1")


def _pct(metrics: dict[str, Any], key: str) -> float | None:
    v = metrics.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _try(options: list[str]) -> str:
    return f"; try {' or '.join(options)}" if options else ""


_FASTER = {"32": ["bf16-mixed", "tf32"], "tf32": ["bf16-mixed"]}  # on a GPU; the mixed precisions are the fastest


def _precision_options(params: dict[str, Any], gpu: bool, isa: str) -> list[str]:
    """Faster precisions than the trial's own (on a CPU, bf16-mixed only where the ISA has bf16)."""
    now = _text(params.get("precision", ""))
    if gpu:
        return list(_FASTER.get(now, []))
    fast = next((f for f in _FAST_CPU_ISA if f in isa), None)
    return [f"bf16-mixed (this CPU has {fast})"] if fast and now != "bf16-mixed" else []


def _input_bound(metrics: dict[str, Any], params: dict[str, Any], wait: float, said: str, gpu: bool) -> Verdict:
    workers = params.get("num_dataloader_workers")
    n = int(workers) if workers is not None and _text(workers).isdigit() else None
    loaders = "loader workers" if n is None else f"{n} loader worker{'s' if n != 1 else ''}"
    facts = [f"{wait:.0f}% of step time waiting for data"] + ([said] if said else [])
    sol, h2d = _pct(metrics, INPUT_SOL_PCT), _pct(metrics, H2D_BW_PCT)
    options: list[str] = []
    if sol is not None:
        facts.append(f"input pipeline at {sol:.0f}% of what {loaders} can decode")
        if sol >= SATURATED_PCT:
            options.append(f"more num_dataloader_workers (now {n})" if n is not None else "more num_dataloader_workers")
            options.append("decode on the GPU" if gpu else "cheaper decode/augment")
        else:
            options.append("cheaper collate/transfer (decode is not the limit)")
    else:
        options.append(f"more num_dataloader_workers (now {n})" if n is not None else "more num_dataloader_workers")
        options.append("cheaper decode/augment")
    if h2d is not None:
        facts.append(f"host-to-device copies at {h2d:.0f}% of the measured bandwidth")
    if gpu and not _on(params, "pin_memory"):
        options.append("pin_memory")
    return Verdict("input-bound", ", ".join(facts) + _try(options))


def _gpu_verdict(metrics: dict[str, Any], params: dict[str, Any], util: float, said: str, busy_at: float,
                 wait: float | None) -> Verdict:
    sol = _pct(metrics, SOL_PCT)
    precision = _PEAK_NAME.get(_text(params.get("precision", "")), "its precision's")
    compile_opt = [] if _on(params, "compile") else ["compile"]
    if sol is not None and sol >= NEAR_PEAK_PCT:
        options = _precision_options(params, True, "")
        return Verdict("compute-bound", f"{said}, compute at {sol:.0f}% of this machine's measured {precision} peak: "
                       "little left to gain from batch size" + _try(options))
    at_peak = f", compute at {sol:.0f}% of this machine's measured {precision} peak" if sol is not None else ""
    if util >= busy_at:
        return Verdict("compute-bound", f"{said}{at_peak}" + _try(_precision_options(params, True, "") + compile_opt))
    headroom, total = metrics.get(MEM_HEADROOM_GIB), metrics.get(MEM_TOTAL_GIB)
    batch = params.get("batch_size")
    larger = f"a batch_size above {batch}" if batch is not None else "a larger batch_size"
    if headroom is not None and total and (total - headroom) / total < MEMORY_USED_FRACTION:
        return Verdict("memory-headroom", f"{said}{at_peak} with only {total - headroom:.1f} of "
                       f"{total:.0f} GiB reserved" + _try([larger]))
    return Verdict("underutilised", f"{said}{at_peak} and data wait {wait or 0:.0f}%"
                   + _try([larger] + [f"{o} (fewer kernel launches)" for o in compile_opt]))


def _cpu_verdict(metrics: dict[str, Any], params: dict[str, Any], wait: float | None) -> Verdict | None:
    cpu = _pct(metrics, CPU_WORKER_PCT)
    if cpu is None:
        return None
    cores = float(params.get("cpus_per_worker") or 1)
    loaders = _pct(metrics, CPU_LOADERS_PCT) or 0.0
    shared = float(params.get("cpus_per_loader_worker") or 0) == 0  # loader workers run on the rank's cores
    busy = cpu + (loaders if shared else 0.0)
    how = f"training process {cpu:.0f}%" + (f" + loader workers {loaders:.0f}%" if shared and loaders >= 1 else "")
    sol = _pct(metrics, SOL_PCT)
    named = _PEAK_NAME.get(_text(params.get("precision", "")), "its precision's")
    peak = f", compute at {sol:.0f}% of this machine's measured {named} peak" if sol is not None else ""
    isa = _text(metrics.get("device/cpu_isa", ""))
    if busy >= CPU_BUSY_FRACTION * 100 * cores:
        options = _precision_options(params, False, isa)
        if not _on(params, "compile"):
            options.append("compile")
        options.append("more cpus_per_worker (or a GPU)")
        return Verdict("compute-bound", f"the rank's core(s) are saturated: {how} of {cores:.0f} core(s) busy{peak}, "
                       f"data wait {wait or 0:.0f}%" + _try(options))
    if busy < CPU_BUSY_FRACTION * 100:  # not even one core kept busy: the rank waits on something else
        batch = params.get("batch_size")
        options = [f"a batch_size above {batch} (fewer all-reduces per sample)" if batch is not None
                   else "a larger batch_size (fewer all-reduces per sample)"]
        if _text(params.get("precision")) == "bf16-mixed" and isa and not any(f in isa for f in _FAST_CPU_ISA):
            options.append("precision 32 (this CPU has no avx512_bf16/AMX: bf16 runs emulated)")
        return Verdict("underutilised", f"only {how} of {cores:.0f} core(s) busy{peak}, data wait "
                       f"{wait or 0:.0f}%: the rest of each step the rank sits idle, waiting for the other ranks in "
                       "the gradient all-reduce or for a core another process holds" + _try(options))
    return None


def verdict(metrics: dict[str, Any], params: dict[str, Any]) -> Verdict:
    """What bounds a finished trial, and what to try that it does not already use."""
    wait = _pct(metrics, DATA_WAIT_PCT)
    signal = next((k for k in GPU_BUSY if metrics.get(k) is not None), None)  # the best the GPU gives
    util = _pct(metrics, signal) if signal else None
    busy_at, input_below = GPU_BUSY[signal] if signal else (0.0, 0.0)
    said = f"{_SIGNAL_NAME[signal]} {util:.0f}%" if signal and util is not None else ""
    gpu = util is not None or _on(params, "use_gpu")
    if wait is not None and wait >= INPUT_WAIT_PCT and (util is None or util < input_below):
        return _input_bound(metrics, params, wait, said, gpu)
    if util is not None:
        return _gpu_verdict(metrics, params, util, said, busy_at, wait)
    cpu = _cpu_verdict(metrics, params, wait)
    if cpu is not None:
        return cpu
    shown = ", ".join(f"{k}={metrics[k]:.0f}" for k in (DATA_WAIT_PCT, CPU_WORKER_PCT, CPU_LOADERS_PCT)
                      if _pct(metrics, k) is not None)
    return Verdict("unclear", f"no single bottleneck stands out ({shown or 'no figures'})")
