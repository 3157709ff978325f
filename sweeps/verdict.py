"""Bottleneck verdict per trial: what bounds it, in one line, from its measured figures.

The rules, in the order they are tried (the first that matches wins):

| verdict | when | suggestion |
|---|---|---|
| input-bound | data wait >= 20% of the measured window (and, on a GPU, utilisation < 80%) | more `num_dataloader_workers`, `pin_memory` on GPU, cheaper decode/augment |
| compute-bound (GPU) | SM activity (GPM, Hopper+) >= 80%, or where GPM is missing NVML utilisation >= 90% | `bf16-mixed`/`tf32` on Tensor Cores, `compile` |
| memory headroom | GPU and less than half of the device's memory reserved at peak | larger `batch_size` |
| underutilised (GPU) | below the compute-bound bar and data wait < 20% | larger `batch_size`, `compile` (fewer launches) |
| compute-bound (CPU) | no GPU; training process busy >= 80% of its `cpus_per_worker` cores | `bf16-mixed` where the CPU has avx512_bf16/AMX |
| unclear | none of the above (or the figures are missing) | - |

"GPU busy" is the best signal the GPU gives: GPM SM activity (the share of SMs with work) where it
exists, else NVML utilisation, which only says that *some* kernel ran in each sample period (a
single tiny kernel reads as 100%). Communication-bound is not diagnosed yet: collective time is not
measured separately.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainables.contract import CPU_WORKER_PCT, DATA_WAIT_PCT, GPU_UTIL_MEAN_PCT, MEM_HEADROOM_GIB, MEM_TOTAL_GIB

SM_ACTIVE_PCT = "gpu/sm_active_mean_pct"
INPUT_WAIT_PCT = 20.0
# "GPU busy" per signal: (compute-bound at or above, input-bound only below)
GPU_BUSY: dict[str, tuple[float, float]] = {SM_ACTIVE_PCT: (80.0, 70.0), GPU_UTIL_MEAN_PCT: (90.0, 80.0)}
_SIGNAL_NAME = {SM_ACTIVE_PCT: "SM active (GPM)", GPU_UTIL_MEAN_PCT: "GPU busy"}
MEMORY_USED_FRACTION = 0.5
CPU_BUSY_FRACTION = 0.8


@dataclass(frozen=True)
class Verdict:
    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


def verdict(metrics: dict[str, Any], params: dict[str, Any]) -> Verdict:
    wait = metrics.get(DATA_WAIT_PCT)
    signal = next((k for k in GPU_BUSY if metrics.get(k) is not None), None)  # the best the GPU gives
    util = metrics.get(signal) if signal else None
    busy_at, input_below = GPU_BUSY[signal] if signal else (0.0, 0.0)
    said = f"{_SIGNAL_NAME[signal]} {util:.0f}%" if signal and util is not None else ""
    if wait is not None and wait >= INPUT_WAIT_PCT and (util is None or util < input_below):
        return Verdict("input-bound", f"{wait:.0f}% of step time waiting for data{', ' + said if said else ''}; try "
                       "more num_dataloader_workers, pin_memory (GPU) or cheaper decode/augment")
    if util is not None:
        if util >= busy_at:
            return Verdict("compute-bound", f"{said}; try bf16-mixed/tf32 and compile")
        headroom, total = metrics.get(MEM_HEADROOM_GIB), metrics.get(MEM_TOTAL_GIB)
        if headroom is not None and total and (total - headroom) / total < MEMORY_USED_FRACTION:
            return Verdict("memory-headroom", f"{said} with only {total - headroom:.1f} of "
                           f"{total:.0f} GiB reserved; try a larger batch_size")
        return Verdict("underutilised", f"{said} and data wait {wait or 0:.0f}%; try a larger "
                       "batch_size or compile (fewer kernel launches)")
    cpu = metrics.get(CPU_WORKER_PCT)
    cores = float(params.get("cpus_per_worker") or 1)
    if cpu is not None and cpu >= CPU_BUSY_FRACTION * 100 * cores:
        return Verdict("compute-bound", f"training process busy {cpu:.0f}% of {cores:.0f} core(s), data wait "
                       f"{wait or 0:.0f}%; try bf16-mixed where the CPU has avx512_bf16/AMX")
    shown = ", ".join(f"{k}={metrics[k]:.0f}" for k in (DATA_WAIT_PCT, CPU_WORKER_PCT) if k in metrics)
    return Verdict("unclear", f"no single bottleneck stands out ({shown or 'no figures'})")
