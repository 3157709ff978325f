"""Every rank works in the directory the sweep started in, as under torchrun: a user's relative
paths (read in the builder, in `__getitem__`, in a loader worker) resolve there, in warm groups and
cold trials alike (a cold trial's: tests/e2e/test_small_sweep.py's image sweep); a file that is not there fails the trial as `config`, naming that directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from examples.image_folder import prepare
from sweeps.service.failures import classify
from trainables import BuildContext, Workload, WorkloadError
from trainables.launch import main as launch


class _OpensAMissingFile(Dataset[tuple[torch.Tensor, int]]):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with open("data/absent.bin", "rb") as f:  # relative, as a user writes it
            f.read()
        return torch.zeros(4), 0


def missing_in_getitem(params: dict[str, Any], ctx: BuildContext) -> Workload:
    # FLOPs declared: not counted on a validation batch in the rank itself, so the loader worker is first to fail
    return Workload(model=nn.Linear(4, 2), train_dataset=_OpensAMissingFile(), val_dataset=_OpensAMissingFile(),
                    loss_fn=nn.functional.cross_entropy, flops_per_item=16.0)


@pytest.mark.parametrize(("workload", "loader_workers", "missing"), [
    ("examples.image_folder:build", 0, "'data/shapes/classes.txt'"),  # the builder's open()
    ("tests.e2e.test_workdir:missing_in_getitem", 1, "'data/absent.bin'"),  # re-raised out of a DataLoader worker
])
def test_a_missing_file_fails_as_config_naming_the_working_directory(
        workload: str, loader_workers: int, missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(WorkloadError) as info:
        launch(["--workload", workload, "--params", json.dumps({"root": "data/shapes"} if "image" in workload else {}),
                "--num-steps", "2", "--num-warmup-steps", "1", "--batch-size", "4", "--telemetry-period-s", "0",
                "--num-dataloader-workers", str(loader_workers), "--loader-timeout-s", "60"])
    kind, reason = classify(info.value)
    assert kind == "config", reason
    assert missing in reason and f"relative paths resolve against {tmp_path} (where torchrun started)" in reason, reason


SPEC = """\
name: workdir-warm
trainable: {{name: "examples.image_folder:build", params: {{width: 4}}}}
space:
  params.root: {{type: categorical, choices: {roots}}}
  batch_size: 4
  num_dataloader_workers: 1
search: {{algorithm: grid}}
budget: {{num_trials: 2, num_steps: 4, num_warmup_steps: 1, report_interval_s: 0.01, max_retries: 0}}
scaling: {{num_workers: 2, cpus_per_worker: 1, cpus_per_loader_worker: 0, reuse_workers: true}}
telemetry: {{period_s: 0}}
tracking: {{uri: "sqlite:///{db}", experiment: workdir}}
storage_path: {storage}
"""


@pytest.mark.ray
def test_ranks_of_a_warm_group_resolve_relative_paths_where_the_sweep_started(
        ray_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_store: Callable[[Path], Path]) -> None:
    # (a cold trial's ranks: tests/e2e/test_small_sweep.py's image sweep writes and reads its data under the relative default data_dir)
    from sweeps.service.runner import run_sweep
    from sweeps.spec import parse_spec

    new_store(tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)  # the user's folder: data/shapes exists only here
    prepare(Path("data/shapes"), num_per_class=8, image_size=12)
    text = SPEC.format(roots="[data/shapes, data/missing]", db=tmp_path / "mlflow.db", storage=tmp_path / "results")
    lines: list[str] = []
    outcome = run_sweep(parse_spec(text), text, echo=lines.append)
    by_root = {t.params["workload.root"]: t for t in outcome.trials}
    ok = by_root["data/shapes"]
    assert ok.status == "ok", ok.reason  # both ranks read classes.txt and their PNGs in a loader worker
    assert ok.metrics["progress/world_size"] == 2
    missing = by_root["data/missing"]
    assert missing.status == "config", missing.reason
    assert f"'data/missing/classes.txt' — relative paths resolve against {tmp_path} (where `sweeps run` started" \
        in missing.reason
    # a missing file fails every rank alike, at build: the group stays warm for the other trial
    assert any("warm worker groups: 1 started for 2 trial(s)" in line for line in lines), lines[-3:]
