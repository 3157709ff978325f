"""Fastest *correct*: the noise scale against a known answer, equal-data budgets, time to target (no Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sweeps.results.outcome import SweepOutcome, TrialRow, end_status
from sweeps.results.quality import annotate, prediction_error, spearman
from sweeps.spec import parse_spec
from tests.helpers.linreg import analytic_noise_scale
from trainables import contract
from trainables.contract import TrialConfig
from trainables.loop import train
from trainables.noise_scale import NoiseScale, estimates
from trainables.reporting import ListReporter

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
LINREG = {"dim": 16, "sigma": 1.0, "delta_norm": 2.0}


def test_the_estimators_recover_a_known_gradient_and_covariance() -> None:
    # E|g_B|^2 = |G|^2 + tr(Sigma)/B exactly: the estimators invert it
    g2, trace = 3.0, 96.0
    assert estimates(g2 + trace / 8, g2 + trace / 64, 8, 64) == pytest.approx((g2, trace))
    ns = NoiseScale(CPU, beta=0.9)
    assert ns.update(g2 + trace / 8, g2 + trace / 64, steps=5, b_small=8, b_big=64) == pytest.approx(trace / g2)
    assert ns.update(float("nan"), 1.0, steps=5, b_small=8, b_big=64) == pytest.approx(trace / g2)  # skipped
    with pytest.raises(ValueError):
        estimates(1.0, 1.0, 64, 64)


def test_noise_scale_on_two_gloo_ranks_matches_the_analytic_answer(tmp_path: Path) -> None:
    """Linear regression at fixed weights, 2 DDP ranks under plain torchrun: within 20% of B_noise."""
    out = tmp_path / "metrics.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "trainables.launch", "--workload", "tests.helpers.linreg:build", "--params", json.dumps(LINREG),
           "--num-steps", "300", "--num-warmup-steps", "2", "--batch-size", "32", "--lr", "1e-9",
           "--telemetry-period-s", "0", "--metrics-path", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads(line) for line in out.read_text().splitlines()]
    final = reports[-1]
    truth = analytic_noise_scale(16, 1.0, 2.0)  # 21 samples
    assert final[contract.GRAD_NOISE_SCALE] == pytest.approx(truth, rel=0.2), (final[contract.GRAD_NOISE_SCALE], truth)


def test_one_rank_measures_it_from_its_micro_batches(data_dir: Path) -> None:
    cfg = TrialConfig(workload="tests.helpers.linreg:build", workload_params=LINREG, batch_size=32, grad_accum_steps=2,
                      precision="32", lr=1e-9, num_steps=300, num_warmup_steps=2, telemetry_period_s=0,
                      data_dir=str(data_dir))
    final = train(cfg, ListReporter(), CPU)
    assert final[contract.GRAD_NOISE_SCALE] == pytest.approx(analytic_noise_scale(16, 1.0, 2.0), rel=0.2)
    # without accumulation one rank has only one batch size: nothing to estimate, so nothing reported
    plain = train(TrialConfig(**{**cfg.to_dict(), "grad_accum_steps": 1, "num_steps": 5}), ListReporter(), CPU)
    assert contract.GRAD_NOISE_SCALE not in plain


def test_an_equal_data_budget_gives_every_batch_size_the_same_samples(data_dir: Path) -> None:
    base = dict(workload="mlp-tabular", workload_params={}, precision="32", lr=1e-3, num_steps=1,
                num_warmup_steps=2, num_items=4096, telemetry_period_s=0, data_dir=str(data_dir))
    small = train(TrialConfig(batch_size=32, **base), ListReporter(), CPU)  # type: ignore[arg-type]
    large = train(TrialConfig(batch_size=128, grad_accum_steps=1, **base), ListReporter(), CPU)  # type: ignore[arg-type]
    assert small[contract.seen_key("samples")] == large[contract.seen_key("samples")] == 4096
    assert (small[contract.STEPS], large[contract.STEPS]) == (4096 // 32 - 2, 4096 // 128 - 2)
    # a budget no global batch divides: the last step takes only what completes it (fewer micro-batches,
    # the last one cut), so 32 x 4 accumulated and 100 x 1 see exactly the budget too
    odd = {**base, "num_items": 1000}
    accum = train(TrialConfig(batch_size=32, grad_accum_steps=4, **odd), ListReporter(), CPU)  # type: ignore[arg-type]
    wide = train(TrialConfig(batch_size=100, **odd), ListReporter(), CPU)  # type: ignore[arg-type]
    assert accum[contract.seen_key("samples")] == wide[contract.seen_key("samples")] == 1000
    assert (accum[contract.STEPS], wide[contract.STEPS]) == (6, 8)  # 2 warm-up + 6 (the last 24 samples); 2 + 8


def test_time_to_target_stops_at_the_evaluation_that_meets_it(data_dir: Path) -> None:
    base = dict(workload="mlp-tabular", workload_params={}, precision="32", lr=3e-3, batch_size=64, num_steps=200,
                num_warmup_steps=2, eval_every_steps=5, target_metric=contract.LOSS_VAL, telemetry_period_s=0,
                data_dir=str(data_dir))
    quiet = ListReporter()
    met = train(TrialConfig(target_max=0.6, **base), quiet, CPU)  # type: ignore[arg-type]
    assert not any(contract.ELAPSED_S in r for r in quiet.reports)  # no report per evaluation unless asked
    assert met[contract.LOSS_VAL] <= 0.6
    assert met[contract.STEPS_TO_TARGET] % 5 == 0 and met[contract.STEPS_TO_TARGET] < 202
    assert met[contract.TIME_TO_TARGET_S] >= met[contract.EVAL_TOTAL_S] > 0
    assert met[contract.TARGET_BEST] == met[contract.LOSS_VAL]
    reporter = ListReporter()
    missed = train(TrialConfig(target_max=1e-6, report_evals=True, **{**base, "num_steps": 18}), reporter, CPU)  # type: ignore[arg-type]
    assert contract.TIME_TO_TARGET_S not in missed and missed[contract.EVALS] == 4  # steps 5, 10, 15, 20
    assert missed[contract.TARGET_BEST] > 1e-6
    # the report after each evaluation (step 20 is the last: its values are in the final one) carries the
    # quality curve over the time-to-target clock, which ASHA compares trials on
    curve = [(r[contract.ELAPSED_S], r[contract.LOSS_VAL]) for r in reporter.reports if contract.ELAPSED_S in r]
    assert len(curve) == 3 and all(r[contract.FINAL] == 0 for r in reporter.reports[:-1])
    assert [t for t, _ in curve] == sorted(t for t, _ in curve) and curve[0][0] > 0
    assert min(v for _, v in curve) >= missed[contract.TARGET_BEST]



# --- across trials: guardrail, prediction, infeasible (no Ray, synthetic rows) ---------------------


_SPEC = """\
name: q
trainable: {{name: mlp-tabular}}
space: {{batch_size: {{type: categorical, choices: [16, 64]}}, precision: {{type: categorical, choices: ["32", "16-mixed"]}}}}
{objective}
budget: {{num_trials: 3, {length}, num_warmup_steps: 2{extra}}}
"""


def _row(n: int, precision: str, gb: int, **metrics: float) -> TrialRow:
    return TrialRow(f"t{n}", n, {"precision": precision, "global_batch_size": gb, "num_warmup_steps": 2},
                    run_id=f"run{n}", status="ok", metrics=dict(metrics))


def test_the_guardrail_flags_a_trial_worse_than_the_fp32_reference_at_equal_data() -> None:
    spec = parse_spec(_SPEC.format(objective="", length="num_samples: 4096", extra=""))
    rows = [_row(1, "32", 32, **{"loss/val": 1.00, "throughput/samples_per_s": 100, "progress/samples_seen": 4096}),
            _row(2, "16-mixed", 32, **{"loss/val": 1.20, "throughput/samples_per_s": 300,  # fastest, but 20% worse
                                        "progress/samples_seen": 4112}),  # a batch the loop could not cut: shown
            _row(3, "32", 128, **{"loss/val": 1.03, "throughput/samples_per_s": 200})]
    outcome = SweepOutcome(spec, "p", "sqlite://", rows, 1.0)
    note, updates = annotate(outcome)
    assert "reference trial 1" in note
    assert rows[1].degraded.startswith("loss/val 1.2 is 20.0% worse") and not rows[2].degraded
    assert "at equal data (saw 4,112 samples, the reference 4,096)" in rows[1].degraded
    assert outcome.best is rows[2]  # the degraded trial is never ranked best, even on throughput
    assert updates["run2"] == ({"quality/gap_pct": pytest.approx(20.0)}, {"sweep.degraded": rows[1].degraded})
    steps = parse_spec(_SPEC.format(objective="", length="num_steps: 10", extra=""))
    assert annotate(SweepOutcome(steps, "p", "sqlite://", [_row(1, "32", 32, **{"loss/val": 1.0})], 1.0))[0].startswith(
        "off: budget.num_steps")


def test_prediction_is_leave_one_out_and_a_missed_target_is_infeasible() -> None:
    spec = parse_spec(_SPEC.format(objective="objective: {metric: time/to_target_s, target: {metric: loss/val, max: 1.5}}",
                                   length="num_samples: 8192", extra=", eval_every_steps: 10"))
    # S = S_min (1 + B_noise/B) with S_min = 40 for both: 40 x (1 + 32/32) = 80 and 40 x (1 + 32/128) = 50
    common = {"time/eval_total_s": 0.0, "progress/evals": 8.0}
    a = _row(1, "32", 32, **{"progress/steps_to_target": 80, "stats/grad_noise_scale": 32, "time/step_ms": 10,
                             "progress/samples_seen": 32 * 80, "progress/steps": 78, "time/to_target_s": 0.8, **common})
    b = _row(2, "32", 128, **{"progress/steps_to_target": 50, "stats/grad_noise_scale": 32, "time/step_ms": 20,
                              "progress/samples_seen": 128 * 50, "progress/steps": 48, "time/to_target_s": 1.0, **common})
    annotate(SweepOutcome(spec, "p", "sqlite://", [a, b], 1.0))
    assert a.metrics["predict/time_to_target_s"] == pytest.approx(80 * 0.010)  # from b's S_min alone
    assert b.metrics["predict/time_to_target_s"] == pytest.approx(50 * 0.020)
    assert prediction_error(a) == pytest.approx(0.0)
    assert a.metrics["predict/error_pct"] == pytest.approx(0.0) and b.metrics["predict/error_pct"] == pytest.approx(0.0)
    assert spearman([1, 2, 3], [10, 30, 20]) == pytest.approx(0.5) and spearman([1], [1]) is None
    status, reason, missing = end_status(spec, {"progress/final": 1, "loss/val": 1.7, "quality/target_best": 1.62,
                                                "progress/evals": 12}, "", False)
    assert (status, missing) == ("infeasible", []) and "best loss/val=1.62 in 12 evaluations" in reason
