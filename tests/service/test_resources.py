"""Fair CPU accounting: a trial reserves its ranks' loader workers too, and says what it used."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sweeps.search.trials import largest_trial_need, resolve_trial, trial_params
from sweeps.service.resources import concurrency_note, refuse_if_never_fits
from sweeps.service.trial import make_trainer
from sweeps.spec import SpecError, parse_spec
from trainables import contract
from trainables.contract import TrialConfig
from trainables.loop import train
from trainables.reporting import ListReporter

SPEC = ("name: t\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 2, num_steps: 5}\n"
        "space: {num_dataloader_workers: {type: categorical, choices: [0, 2]}}\n")


def test_a_trial_reserves_its_loader_workers_and_the_checks_use_the_largest() -> None:
    spec = parse_spec(SPEC + "scaling: {num_workers: 2, cpus_per_worker: 1}\n")
    assert largest_trial_need(spec) == {"CPU": 2 * (1 + 2 * 1.0), "GPU": 0.0}
    with pytest.raises(SpecError, match=r"the largest trial needs num_workers x \(cpus_per_worker \+ num_dataloader_workers "
                                        r"x cpus_per_loader_worker\) = 2 x \(1 \+ 2 x 1\) = 6 CPUs but this cluster has 4"):
        refuse_if_never_fits(spec, {"CPU": 4.0})
    assert "cluster fits 1 trial(s) at once (6 CPU, 0 GPU each at most, with 2 loader worker(s) per rank)" in \
        concurrency_note(spec, {"CPU": 8.0})
    cfg = resolve_trial(spec, {"num_dataloader_workers": 2})
    assert make_trainer(cfg, spec.scaling, "n", "/tmp", callbacks=[]).scaling_config.resources_per_worker["CPU"] == 3
    assert trial_params(spec, cfg)["cpus_reserved"] == 6 and trial_params(spec, resolve_trial(spec, {}))["cpus_reserved"] == 2
    small = parse_spec(SPEC + "scaling: {num_workers: 2, cpus_per_worker: 1, cpus_per_loader_worker: 0}\n")
    refuse_if_never_fits(small, {"CPU": 2.0})  # a 2-core machine that declares loaders share their rank's core


def test_how_many_trials_fit_is_said_of_the_clusters_total_and_of_what_is_free_now() -> None:
    # the three sweeps on one head (4 CPUs declared): the third was told 2 fit while other jobs held all 4
    spec = parse_spec("name: t\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 2, num_steps: 5}\n")
    assert concurrency_note(spec, {"CPU": 4.0}, {"CPU": 0.0}) == (
        "cluster fits 2 trial(s) at once (2 CPU, 0 GPU each at most); 0 fit in what is free now (0 of 4 CPU free); "
        "running 1 — other work holds the rest: its trials wait until it is released (a warm group is held until its "
        "sweep ends; budget.max_queue_s bounds the wait)")
    assert concurrency_note(spec, {"CPU": 4.0}, {"CPU": 2.0}) == (
        "cluster fits 2 trial(s) at once (2 CPU, 0 GPU each at most); 1 fit in what is free now (2 of 4 CPU free); "
        "running 1")
    two = parse_spec("name: t\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 2, num_steps: 5, "
                     "max_concurrent_trials: 2}\n")
    assert concurrency_note(two, {"CPU": 4.0}, {"CPU": 3.0}).endswith(
        "1 fit in what is free now (3 of 4 CPU free); running 2 — other work holds the rest: 1 of its trials wait "
        "until it is released (a warm group is held until its sweep ends; budget.max_queue_s bounds the wait)")


def test_a_trial_says_how_many_cores_it_used(data_dir: Path) -> None:
    cfg = TrialConfig(workload="image-cnn", batch_size=16, precision="32", lr=1e-3, num_steps=10, num_warmup_steps=2,
                      num_dataloader_workers=1, telemetry_period_s=0.05, data_dir=str(data_dir),
                      workload_params={"image_size": 16, "num_train_images": 256, "num_val_images": 32, "width": 8})
    final = train(cfg, ListReporter(), torch.device("cpu"))
    used = final[contract.CPU_CORES_USED]
    assert used == pytest.approx((final[contract.CPU_WORKER_PCT] + final[contract.CPU_LOADERS_PCT]) / 100)
    assert 0 < used <= 2.5  # this machine has 2 cores
