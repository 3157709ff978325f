"""FLOPs counted on one batch against exact and analytic counts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainables.flop_count import flops_per_item
from trainables.workloads.declared import GPT_PRESETS
from trainables.workloads.gpt_lm import GPT, flops_per_token, lm_loss


def _mse_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


def _count(batch: tuple[torch.Tensor, torch.Tensor]) -> int:
    return batch[0].shape[0]


def test_linear_is_exactly_forward_plus_two_backward_matmuls() -> None:
    # Input that needs its gradient (as inside a network): fwd 2·B·i·o, bwd 2·B·i·o (input) + 2·B·i·o (weight).
    lin, b, i, o = nn.Linear(32, 16), 8, 32, 16
    x = torch.randn(b, i, requires_grad=True)
    assert flops_per_item(lin, _mse_step, (x, torch.randn(b, o)), _count) == 2 * i * o * 3


def test_first_layer_has_no_input_gradient_and_the_model_is_left_untouched() -> None:
    bn = nn.BatchNorm1d(20)
    model = nn.Sequential(nn.Linear(10, 20), bn, nn.Dropout(0.5), nn.Linear(20, 4))
    assert bn.running_mean is not None
    before = bn.running_mean.clone()
    batch = (torch.randn(6, 10), torch.randn(6, 4))
    rng = torch.get_rng_state()
    got = flops_per_item(model, _mse_step, batch, _count)
    assert got == 2 * 10 * 20 * 2 + 2 * 20 * 4 * 3  # the first weight has no input to differentiate for
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(bn.running_mean, before) and torch.equal(torch.get_rng_state(), rng)


def test_gpt_matches_the_analytic_six_n_per_token() -> None:
    p = GPT_PRESETS["tiny"]
    model = GPT(p)
    idx = torch.randint(0, p.vocab_size, (2, p.seq_len))
    got = flops_per_item(model, lambda m, b: lm_loss(m(b[0]), b[1]), (idx, idx), lambda b: b[0].numel())
    # 6·N + 12·L·d·T counts biases and LayerNorms as matmul FLOPs; the counter does not (< 2%).
    assert got == pytest.approx(flops_per_token(model, p), rel=0.02)


def test_a_step_the_counter_cannot_run_gives_none() -> None:
    def broken(model: nn.Module, batch: object) -> torch.Tensor:
        raise RuntimeError("unsupported op")

    assert flops_per_item(nn.Linear(2, 2), broken, (torch.ones(1, 2), None), lambda b: 1) is None
    # No matmul at all: nothing counted, so no figure rather than 0.
    assert flops_per_item(nn.Identity(), lambda m, b: m(b).sum(), torch.ones(3, requires_grad=True), lambda b: 3) is None


def test_the_loop_counts_flops_for_a_workload_that_does_not_declare_them(data_dir) -> None:  # type: ignore[no-untyped-def]
    from trainables import contract
    from trainables.contract import TrialConfig
    from trainables.loop import train
    from trainables.reporting import ListReporter

    cfg = TrialConfig(workload="image-cnn", batch_size=16, precision="32", lr=1e-3, num_steps=4, num_warmup_steps=2,
                      telemetry_period_s=0, data_dir=str(data_dir),
                      workload_params={"image_size": 16, "num_train_images": 64, "num_val_images": 32, "width": 8,
                                       "depth": 1})
    final = train(cfg, ListReporter(), torch.device("cpu"))
    assert final["perf/flops_source"] == "counted" and final[contract.TFLOPS] > 0
    assert contract.MFU_PCT not in final  # no peak table for a CPU: MFU stays absent (the sweep adds perf/sol_pct)
    gpt = train(TrialConfig(workload="gpt-lm", batch_size=2, precision="32", lr=1e-3, num_steps=2, num_warmup_steps=1,
                            telemetry_period_s=0, data_dir=str(data_dir)), ListReporter(), torch.device("cpu"))
    assert gpt["perf/flops_source"] == "declared"


def test_a_sweep_scores_trials_against_this_machines_figures(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from sweeps.results import sol

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []
    monkeypatch.setattr(sol, "measured_apart", lambda: calls.append(1) or {"matmul/fp32_tflops_per_s_per_core": 0.1})
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    first = sol.SpeedOfLight.for_sweep(uri)
    again = sol.SpeedOfLight.for_sweep(uri)  # cached: measured once
    assert len(calls) == 1 and first.sources == again.sources
    key = sol.local_key()
    kind, name = key.split(":", 1)
    metrics = {"device/type": kind, "device/name": name, "perf/tflops_per_s": 0.05, "progress/world_size": 2}
    assert again.score_trial(metrics, {"precision": "32", "cpus_per_worker": 1}) == {"perf/sol_pct": pytest.approx(25.0)}
    assert again.score_trial({**metrics, "device/name": "another CPU"}, {"precision": "32"}) == {}  # no figures: absent
