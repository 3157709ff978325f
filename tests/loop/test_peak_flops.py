"""GPU layouts the metrics can represent, per-rank peaks for MFU, and the verdict's best signal
(pure logic: no GPU on this machine)."""

from __future__ import annotations

import pytest

from sweeps.results.verdict import verdict
from sweeps.spec import SpecError, parse_spec
from trainables.peak_flops import cluster_peak, peak_flops

BASE = "name: t\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 2, num_steps: 5}\n"


@pytest.mark.parametrize("scaling,expected", [
    ("{use_gpu: true, gpus_per_worker: 0.5}", "gpus_per_worker must be 1 with use_gpu (two or more ranks would share one GPU"),
    ("{use_gpu: true, gpus_per_worker: 2}", "gpus_per_worker must be 1 with use_gpu (the DDP loop drives one GPU per rank"),
])
def test_layouts_ddp_cannot_run_or_would_misreport_are_refused(scaling: str, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(BASE + f"scaling: {scaling}\n")
    assert expected in str(info.value)


def test_accelerator_type_reaches_ray_train() -> None:
    from sweeps.search.trials import resolve_trial
    from sweeps.service.trial import make_trainer

    spec = parse_spec(BASE + "scaling: {use_gpu: true, accelerator_type: H100, num_workers: 4}\n")
    trainer = make_trainer(resolve_trial(spec, {}), spec.scaling, "n", "/tmp", callbacks=[])
    sc = trainer.scaling_config
    assert sc.accelerator_type == "H100" and sc.num_workers == 4 and sc.resources_per_worker["GPU"] == 1


def test_mfu_peak_is_each_ranks_own_and_mixed_models_are_tagged() -> None:
    h100, a100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
    peak, facts = cluster_peak([(h100, "u0"), (h100, "u1")], "bf16-mixed")
    assert peak == pytest.approx(2 * 989.4e12) and facts == {"device/gpu_count": "2"}
    peak, facts = cluster_peak([(h100, "u0"), (a100, "u1")], "bf16-mixed")
    assert peak == pytest.approx(peak_flops(h100, "bf16-mixed") + peak_flops(a100, "bf16-mixed"))  # type: ignore[operator]
    assert facts["device/gpu_models_mixed"] == f"{a100} x1, {h100} x1"
    peak, facts = cluster_peak([(h100, "u0"), (h100, "u0")], "bf16-mixed")  # two ranks, one GPU
    assert peak is None and facts["device/gpu_count"] == "1" and "gpu_shared" in " ".join(facts)
    assert cluster_peak([(h100, "u0"), ("Some New GPU", "u1")], "bf16-mixed")[0] is None  # unknown: absent, not wrong


@pytest.mark.parametrize("metrics,name", [
    ({"gpu/util_mean_pct": 100.0, "gpu/sm_active_mean_pct": 35.0, "time/data_wait_pct": 2.0}, "underutilised"),
    ({"gpu/util_mean_pct": 100.0, "gpu/sm_active_mean_pct": 85.0, "time/data_wait_pct": 2.0}, "compute-bound"),
    ({"gpu/util_mean_pct": 100.0, "gpu/sm_active_mean_pct": 40.0, "time/data_wait_pct": 30.0}, "input-bound"),
])
def test_verdict_prefers_gpm_sm_activity_over_nvml_utilisation(metrics: dict[str, float], name: str) -> None:
    v = verdict(metrics, {})
    assert v.name == name and ("SM active (GPM)" in v.reason)
