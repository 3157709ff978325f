"""A real 2-worker gloo TorchTrainer (Ray Train V2) running the shared loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweeps.spec import ScalingSpec
from sweeps.trial import make_trainer
from trainables import contract
from trainables.contract import TrialConfig

pytestmark = pytest.mark.ray


def test_two_gloo_workers_train_and_loss_falls(ray_cluster: None, data_dir: Path, tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    cfg = TrialConfig(
        workload="image-cnn",
        workload_params={"image_size": 16, "num_train_images": 512, "num_val_images": 64, "width": 8, "depth": 1},
        batch_size=16, precision="32", lr=3e-3, num_steps=30, num_warmup_steps=3, report_interval_s=0.05,
        data_dir=str(data_dir), metrics_path=str(metrics),
    )
    trainer = make_trainer(cfg, ScalingSpec(num_workers=2), "ddp-test", str(tmp_path / "runs"), callbacks=[])
    trainer.fit()
    reports = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(reports) >= 3  # interim reports at a cadence all ranks agreed on, then the final one
    final = reports[-1]
    assert final[contract.WORLD_SIZE] == 2
    assert reports[-1][contract.LOSS_TRAIN] < reports[0][contract.LOSS_TRAIN]
    assert final[contract.LOSS_VAL] < 2.302  # below chance level for 10 classes (ln 10)
    assert final["throughput/samples_per_s"] == pytest.approx(2 * final["throughput/samples_per_s_per_worker"])
