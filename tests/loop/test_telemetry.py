"""Telemetry with a fake NVML at the boundary; CPU telemetry for real; the verdict rules."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from sweeps.results.verdict import verdict
from tests.helpers.fake_nvml import FakeGpu, FakeNvml
from trainables import contract
from trainables.contract import TrialConfig
from trainables.loop import train
from trainables.reporting import ListReporter
from trainables.sampler import GpuIdentity, NvmlDevice, Sampler, load_nvml, summarize
from trainables.telemetry import combine_ranks

UUID_A, UUID_B = "GPU-aaaa-0000", "GPU-bbbb-1111"


def _two_gpus(gpm: bool = True) -> FakeNvml:
    return FakeNvml([FakeGpu(UUID_A, util=20.0, gpm=gpm), FakeGpu(UUID_B, util=95.0, gpm=gpm)])


def test_gpu_with_gpm_reports_activity_and_is_matched_by_uuid_not_index() -> None:
    nvml = _two_gpus()
    # CUDA device 0 of this worker is NVML device 1 (e.g. CUDA_VISIBLE_DEVICES=1).
    dev = NvmlDevice(nvml, GpuIdentity(uuid="bbbb-1111"))
    sampler = Sampler([dev], period_s=1.0)
    for _ in range(3):
        sampler.sample_once()
    s = summarize(sampler.window())
    assert s["gpu/util_mean_pct"] == 95.0  # device 1's, not device 0's 20%
    assert s["gpu/sm_active_mean_pct"] == pytest.approx(85.5) and s["gpu/tensor_active_mean_pct"] == pytest.approx(47.5)
    assert s["gpu/power_mean_w"] == 300.0 and s["gpu/mem_peak_gib"] == 10.0
    assert s["energy/total_j"] == pytest.approx(600.0)  # counter delta over the window, 3 samples
    assert dev.facts["device/driver"] == "580.65"
    assert dev.clock_reason_names(nvml.reasons) == ["SwPowerCap"]  # idle is not a throttle


def test_gpu_without_gpm_has_no_activity_metrics() -> None:
    dev = NvmlDevice(_two_gpus(gpm=False), GpuIdentity(uuid=UUID_A))
    sampler = Sampler([dev])
    sampler.sample_once()
    sampler.sample_once()
    s = summarize(sampler.window())
    assert s["gpu/util_mean_pct"] == 20.0
    assert not any(k.startswith(("gpu/sm_active", "gpu/tensor_active")) for k in s)


def test_nvml_error_mid_run_drops_only_that_field_for_that_sample() -> None:
    nvml = _two_gpus()
    dev = NvmlDevice(nvml, GpuIdentity(uuid=UUID_A))
    sampler = Sampler([dev])
    sampler.sample_once()
    nvml.gpus[0].failing = {"power", "util"}
    sampler.sample_once()
    nvml.gpus[0].failing = set()
    sampler.sample_once()
    samples = sampler.window()
    assert "power_w" not in samples[1] and "util" not in samples[1] and "mem_used_gib" in samples[1]
    s = summarize(samples)
    assert s["gpu/power_mean_w"] == 300.0 and s["gpu/util_mean_pct"] == 20.0  # mean of the readable ones


def test_unknown_uuid_is_an_error_not_a_wrong_gpu() -> None:
    with pytest.raises(LookupError, match="no NVML device"):
        NvmlDevice(_two_gpus(), GpuIdentity(uuid="cccc"))


def test_nvml_missing_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert load_nvml() is None


def test_real_nvml_without_a_driver_gives_none() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU driver is present")
    assert load_nvml() is None


def test_sampler_thread_samples_until_stopped() -> None:
    class Counter:
        n = 0

        def read(self) -> dict[str, float]:
            self.n += 1
            return {"cpu_worker": 50.0}

    sampler = Sampler([Counter()], period_s=0.01)
    sampler.start()
    time.sleep(0.2)
    sampler.stop()
    count = len(sampler.samples)
    time.sleep(0.05)
    assert count >= 5 and len(sampler.samples) == count  # stopped means stopped


def test_combine_over_ranks() -> None:
    ranks = [{"gpu/util_mean_pct": 80.0, "energy/total_j": 100.0, "gpu/mem_peak_gib": 5.0, "gpu/power_mean_w": 1.0},
             {"gpu/util_mean_pct": 60.0, "energy/total_j": 50.0, "gpu/mem_peak_gib": 7.0}]
    c = combine_ranks(ranks)
    assert c == {"gpu/util_mean_pct": 70.0, "energy/total_j": 150.0, "gpu/mem_peak_gib": 7.0}  # power: one rank only


def test_cpu_run_has_cpu_telemetry_and_no_gpu_metrics(data_dir: Path) -> None:
    cfg = TrialConfig(workload="image-cnn", batch_size=32, precision="32", lr=1e-3, num_steps=20, num_warmup_steps=2,
                      num_dataloader_workers=1, telemetry_period_s=0.05, data_dir=str(data_dir),
                      workload_params={"image_size": 16, "num_train_images": 256, "num_val_images": 32, "width": 8})
    final = train(cfg, ListReporter(), torch.device("cpu"))
    assert final[contract.CPU_WORKER_PCT] > 10 and contract.CPU_LOADERS_PCT in final
    # memory: a CPU rank's peak resident memory (memory/peak_rss_gib) and the prediction, no device memory
    assert not any(k.startswith(("gpu/", "memory/", "energy/"))
                   and k not in (contract.MEM_PEAK_RSS_GIB, contract.MEM_PREDICTED_GIB, contract.MEM_PREDICTED_ACTIVATIONS_GIB)
                   or k == contract.H2D_COPY_PCT for k in final)
    assert final[contract.MEM_PEAK_RSS_GIB] > 0 and final[contract.MEM_PREDICTED_GIB] > 0
    off = train(TrialConfig(**{**cfg.to_dict(), "telemetry_period_s": 0.0}), ListReporter(), torch.device("cpu"))
    assert contract.CPU_WORKER_PCT not in off


@pytest.mark.parametrize(
    "metrics,params,name",
    [
        ({"time/data_wait_pct": 45.0, "gpu/util_mean_pct": 40.0}, {}, "input-bound"),
        ({"time/data_wait_pct": 45.0, "cpu/worker_util_mean_pct": 50.0}, {"cpus_per_worker": 1}, "input-bound"),
        ({"time/data_wait_pct": 2.0, "gpu/util_mean_pct": 97.0}, {}, "compute-bound"),
        ({"time/data_wait_pct": 2.0, "gpu/util_mean_pct": 70.0, "memory/headroom_gib": 70.0, "memory/total_gib": 80.0}, {}, "memory-headroom"),
        ({"time/data_wait_pct": 2.0, "gpu/util_mean_pct": 70.0, "memory/headroom_gib": 5.0, "memory/total_gib": 80.0}, {}, "underutilised"),
        ({"time/data_wait_pct": 5.0, "cpu/worker_util_mean_pct": 190.0}, {"cpus_per_worker": 2}, "compute-bound"),
        ({"time/data_wait_pct": 5.0, "cpu/worker_util_mean_pct": 100.0}, {"cpus_per_worker": 2}, "unclear"),
        ({}, {}, "unclear"),
    ],
)
def test_verdict_rules(metrics: dict[str, float], params: dict[str, int], name: str) -> None:
    v = verdict(metrics, params)
    assert v.name == name and v.reason


def test_clock_reason_aliases_of_user_set_clocks_are_not_throttling() -> None:
    nvml = _two_gpus()
    nvml.nvmlClocksEventReasonApplicationsClocksSetting = 2  # type: ignore[attr-defined]
    nvml.nvmlClocksEventReasonUserDefinedClocks = 2  # type: ignore[attr-defined]  # NVML's alias of the same bit
    nvml.nvmlClocksEventReasonSwThermalSlowdown = 32  # type: ignore[attr-defined]
    dev = NvmlDevice(nvml, GpuIdentity(uuid=UUID_A))
    assert dev.clock_reason_names(2 | 4) == ["SwPowerCap"]
    assert dev.clock_reason_names(2 | 32 | 64) == ["HwThermalSlowdown", "SwThermalSlowdown"]


def test_gpm_samples_are_freed_when_a_gpm_call_fails_and_at_the_end() -> None:
    nvml = _two_gpus()
    freed: list[object] = []
    allocated: list[object] = []
    alloc, free = nvml.nvmlGpmSampleAlloc, nvml.nvmlGpmSampleFree
    nvml.nvmlGpmSampleAlloc = lambda: allocated.append(alloc()) or allocated[-1]  # type: ignore[method-assign]
    nvml.nvmlGpmSampleFree = lambda s: freed.append(s) or free(s)  # type: ignore[method-assign]
    dev = NvmlDevice(nvml, GpuIdentity(uuid=UUID_A))
    dev.read()
    get = nvml.nvmlGpmSampleGet

    def failing_get(h: int, sample: object) -> object:
        raise nvml.NVMLError("GPM: GPU is lost")

    nvml.nvmlGpmSampleGet = failing_get  # type: ignore[method-assign]
    dev.read()  # the sample allocated for this read is freed, not leaked
    nvml.nvmlGpmSampleGet = get  # type: ignore[method-assign]
    dev.read()
    dev.close()
    assert len(allocated) == 3 and {id(s) for s in freed} == {id(s) for s in allocated}
