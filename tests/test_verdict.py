"""The verdict's next step: never what the trial already uses; speed-of-light figures quoted where the
loop reports them; the demo's trials (figures from a real `make demo` on a 2-core CPU) get a verdict."""

from __future__ import annotations

import pytest

from sweeps.verdict import verdict

CPU = {"cpus_per_worker": 1, "cpus_per_loader_worker": 0, "use_gpu": False, "compile": False, "pin_memory": False}
GPU = {"cpus_per_worker": 4, "use_gpu": True, "compile": False, "pin_memory": False, "batch_size": 256}


def _suggestion(reason: str) -> str:
    return reason.split("; try ", 1)[1] if "; try " in reason else ""


@pytest.mark.parametrize("metrics,params,name,absent", [
    # a GPU trial that is compute-bound in bf16-mixed and compiled: neither is suggested again
    ({"gpu/util_mean_pct": 97.0, "time/data_wait_pct": 1.0}, {**GPU, "precision": "bf16-mixed", "compile": True},
     "compute-bound", ("bf16-mixed", "compile")),
    # tf32 is no step up from tf32
    ({"gpu/util_mean_pct": 97.0, "time/data_wait_pct": 1.0}, {**GPU, "precision": "tf32"}, "compute-bound", ("tf32",)),
    # pinned already; a CPU never hears of pin_memory
    ({"gpu/util_mean_pct": 30.0, "time/data_wait_pct": 45.0}, {**GPU, "precision": "32", "pin_memory": True,
                                                              "num_dataloader_workers": 2}, "input-bound", ("pin_memory",)),
    ({"cpu/worker_util_mean_pct": 50.0, "time/data_wait_pct": 45.0}, {**CPU, "precision": "32"}, "input-bound", ("pin_memory",)),
    # a busy CPU in bf16-mixed with AMX: not bf16-mixed again; a CPU without bf16 in its ISA: no bf16 at all
    ({"cpu/worker_util_mean_pct": 95.0, "device/cpu_isa": "avx512f amx_bf16"}, {**CPU, "precision": "bf16-mixed"},
     "compute-bound", ("bf16-mixed",)),
    ({"cpu/worker_util_mean_pct": 95.0, "device/cpu_isa": "avx2 avx512f"}, {**CPU, "precision": "32"}, "compute-bound",
     ("bf16-mixed",)),
])
def test_the_next_step_is_never_what_the_trial_already_uses(metrics: dict, params: dict, name: str,
                                                             absent: tuple[str, ...]) -> None:
    v = verdict(metrics, params)
    assert v.name == name, v
    assert not any(a in _suggestion(v.reason) for a in absent), v


def test_a_cpu_with_amx_is_told_to_try_bf16_and_a_gpu_in_fp32_both_mixed_precisions() -> None:
    v = verdict({"cpu/worker_util_mean_pct": 95.0, "device/cpu_isa": "avx512f amx_bf16"}, {**CPU, "precision": "32"})
    assert "bf16-mixed (this CPU has amx_bf16)" in _suggestion(v.reason)
    v = verdict({"gpu/util_mean_pct": 97.0}, {**GPU, "precision": "32"})
    assert "bf16-mixed" in _suggestion(v.reason) and "tf32" in _suggestion(v.reason) and "compile" in _suggestion(v.reason)


def test_speed_of_light_figures_are_quoted() -> None:
    v = verdict({"gpu/sm_active_mean_pct": 88.0, "perf/sol_pct": 71.0, "time/data_wait_pct": 1.0},
                {**GPU, "precision": "bf16-mixed"})
    assert v.name == "compute-bound"
    assert "compute at 71% of this machine's measured bf16 peak: little left to gain from batch size" in v.reason
    v = verdict({"gpu/util_mean_pct": 40.0, "time/data_wait_pct": 55.0, "perf/input_sol_pct": 93.0, "perf/h2d_bw_pct": 12.0},
                {**GPU, "precision": "bf16-mixed", "num_dataloader_workers": 2})
    assert v.name == "input-bound"
    assert "input pipeline at 93% of what 2 loader workers can decode" in v.reason
    assert "host-to-device copies at 12% of the measured bandwidth" in v.reason
    assert "more num_dataloader_workers (now 2)" in v.reason and "decode on the GPU" in v.reason
    v = verdict({"cpu/worker_util_mean_pct": 95.0, "perf/sol_pct": 40.0}, {**CPU, "precision": "32"})
    assert "compute at 40% of this machine's measured fp32 peak" in v.reason
    # decode has capacity to spare: adding workers is not the advice
    v = verdict({"gpu/util_mean_pct": 40.0, "time/data_wait_pct": 55.0, "perf/input_sol_pct": 30.0},
                {**GPU, "precision": "32", "num_dataloader_workers": 4})
    assert "more num_dataloader_workers" not in v.reason and "decode is not the limit" in v.reason


# (precision, batch, loader workers, training process % of a core, loader workers %, data wait %) per demo trial
_DEMO = [("32", 32, 0, 47.5, 0.0, 12.4), ("32", 128, 0, 61.5, 0.0, 13.0), ("32", 32, 1, 45.8, 7.7, 3.8),
         ("32", 128, 1, 67.8, 11.4, 4.3), ("bf16-mixed", 32, 0, 58.6, 0.0, 11.6), ("bf16-mixed", 128, 0, 58.1, 0.0, 10.9),
         ("bf16-mixed", 32, 1, 56.1, 8.0, 3.7), ("bf16-mixed", 128, 1, 46.6, 7.3, 3.9)]


@pytest.mark.parametrize("precision,batch,loaders,cpu,loader_cpu,wait", _DEMO)
def test_the_demo_trials_get_a_verdict_not_unclear(precision: str, batch: int, loaders: int, cpu: float,
                                                   loader_cpu: float, wait: float) -> None:
    metrics = {"cpu/worker_util_mean_pct": cpu, "cpu/loader_util_mean_pct": loader_cpu, "time/data_wait_pct": wait,
               "device/cpu_isa": "avx2 avx512f"}
    v = verdict(metrics, {**CPU, "precision": precision, "batch_size": batch, "num_dataloader_workers": loaders})
    assert v.name == "underutilised", v
    assert f"a batch_size above {batch}" in v.reason
    assert ("precision 32" in v.reason) == (precision == "bf16-mixed")  # bf16 is emulated on this ISA


def test_a_rank_busy_on_one_of_two_cores_stays_unclear_and_no_figures_is_unclear() -> None:
    assert verdict({"time/data_wait_pct": 5.0, "cpu/worker_util_mean_pct": 100.0}, {"cpus_per_worker": 2}).name == "unclear"
    assert verdict({}, {}).name == "unclear"
