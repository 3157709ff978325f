"""One window per report: every interim metric covers the steps since the previous report, the
final one the whole measured window (the loop on CPU, NVML faked at its boundary)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import trainables.build
from tests.helpers.fake_nvml import FakeGpu, FakeNvml
from trainables import contract
from trainables.contract import TrialConfig
from trainables.loop import train
from trainables.reporting import ListReporter
from trainables.sampler import CpuReader, GpuIdentity, NvmlDevice, Sampler
from trainables.telemetry import Telemetry

ENERGY = contract.energy_key("samples")
CPU = torch.device("cpu")


class _FakeGpuTelemetry(Telemetry):
    """The loop's telemetry with a fake GPU's NVML reader (300 J between samples) on a CPU device."""

    def __init__(self, device: torch.device, period_s: float) -> None:
        super().__init__(device, period_s)
        self.gpu = NvmlDevice(FakeNvml([FakeGpu("GPU-aaaa", util=50.0)]), GpuIdentity(uuid="GPU-aaaa"))
        self.sampler = Sampler([CpuReader(), self.gpu], period_s)


def test_interim_energy_per_item_is_that_windows_energy_over_that_windows_items(
        monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> None:
    monkeypatch.setattr(trainables.build, "Telemetry", _FakeGpuTelemetry)
    cfg = TrialConfig(workload="image-cnn", batch_size=16, precision="32", lr=1e-3, num_steps=12, num_warmup_steps=3,
                      report_interval_s=1e-6, telemetry_period_s=0.002, data_dir=str(data_dir),
                      workload_params={"image_size": 16, "num_train_images": 256, "num_val_images": 64, "width": 8})
    rep = ListReporter()
    final = train(cfg, rep, torch.device("cpu"))
    interim, steps_before = [], 0
    for r in rep.reports[:-1]:
        steps = r[contract.STEPS] - steps_before
        steps_before = r[contract.STEPS]
        items = r["throughput/samples_per_s"] * r[contract.STEP_TIME_MS] * steps / 1000  # this window's items
        assert items == pytest.approx(16 * steps)  # the window's own, not the running total
        if ENERGY in r:
            assert r[ENERGY] == pytest.approx(1000 * r["energy/total_j"] / items)
            interim.append(r["energy/total_j"])
    assert len(interim) >= 3, "too few interim windows held two samples"
    assert all(e % 300 == pytest.approx(0) for e in interim)  # whole sample intervals, none lost between windows
    assert sum(interim) <= final["energy/total_j"]  # the final report covers the whole window
    whole = final["throughput/samples_per_s"] * final[contract.STEP_TIME_MS] * final[contract.STEPS] / 1000
    assert whole == pytest.approx(16 * 12) and final[ENERGY] == pytest.approx(1000 * final["energy/total_j"] / whole)


def test_the_window_counts_only_its_own_steps_and_reports_them() -> None:
    from trainables.instruments import Instruments
    from trainables.window import MeasuredWindow

    win = MeasuredWindow(CPU, Instruments(), "samples", world_size=1, small_batches_per_step=1)
    assert not win.measuring
    win.start(sub_every=1, report_every=2, warm_steps_s=0.3)
    for _ in range(4):
        win.count(16, 0, torch.tensor(0.5), micros=1)
        win.step_done()
    assert win.steps == 4 and win.report_due()
    final = win.report(4, final=True)  # the window's part: the loop adds validation and marks it final
    assert final[contract.STEPS] == 4 and final[contract.WORLD_SIZE] == 1 and final[contract.WINDOW_S] > 0
    assert final["throughput/samples_per_s"] > 0 and final[contract.LOSS_TRAIN] == pytest.approx(0.5)
    assert "throughput/samples_per_s_cv_pct" in final and win.warm_steps_s == 0.3
