"""Quality-aware sweeps for real (Ray Tune + warm Ray Train groups + MLflow): equal data across batch
sizes, and time to a target with the noise scale and the predicted time on every child run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeps.results.money import money_sentence
from sweeps.results.quality import DEGRADED_TAG
from sweeps.service.runner import run_sweep
from sweeps.spec import parse_spec
from sweeps.tracking import child_runs

pytestmark = pytest.mark.ray

EQUAL_DATA = """\
name: equal-data
trainable: {{name: mlp-tabular, params: {{num_train_rows: 4096}}}}
space:
  batch_size: {{type: categorical, choices: [16, 64]}}   # per worker: global 32 and 128
  lr: 1.0e-3
lr_scaling: {{rule: linear, reference_batch_size: 32}}
quality: {{tolerance: 0.05}}
search: {{algorithm: grid}}
budget: {{num_trials: 2, num_samples: 8192, num_warmup_steps: 2, report_interval_s: 0.5}}
scaling: {{num_workers: 2, cpus_per_worker: 1}}
telemetry: {{period_s: 0}}
tracking: {{uri: "sqlite:///{db}", experiment: equal}}
storage_path: {storage}
"""

TIME_TO_TARGET = """\
name: ttt
trainable: {{name: gpt-lm, params: {{preset: tiny}}}}
space:
  batch_size: {{type: categorical, choices: [4, 16]}}
  lr: 2.0e-3
lr_scaling: {{rule: sqrt, reference_batch_size: 8}}
objective: {{metric: time/to_target_s, target: {{metric: loss/val, max: {target}}}}}
search: {{algorithm: grid}}
budget: {{num_trials: 2, num_tokens: 262144, eval_every_steps: 10, num_warmup_steps: 3, report_interval_s: 0.5}}
scaling: {{num_workers: 2, cpus_per_worker: 1}}
telemetry: {{period_s: 0}}
tracking: {{uri: "sqlite:///{db}", experiment: ttt}}
storage_path: {storage}
"""

ASHA_TTT = """\
name: asha-ttt
trainable: {{name: mlp-tabular}}
space:
  batch_size: 16
  lr: {{type: categorical, choices: [1.0e-3, 1.0e-7]}}   # the second one barely moves: behind at every rung
objective: {{metric: time/to_target_s, target: {{metric: loss/val, max: 0.17}}}}
search: {{algorithm: grid, early_stopping: {{grace_s: 0.05, reduction_factor: 2}}}}
budget: {{num_trials: 2, num_steps: 600, eval_every_steps: 10, num_warmup_steps: 2, report_interval_s: 0.5}}
scaling: {{num_workers: 2, cpus_per_worker: 1}}
telemetry: {{period_s: 0}}
tracking: {{uri: "sqlite:///{db}", experiment: asha}}
storage_path: {storage}
"""

USD_TTT = """\
name: usd-ttt
trainable: {{name: mlp-tabular}}
space:
  batch_size: 16
  lr: {{type: categorical, choices: [1.0e-7, 1.0e-3]}}   # the first never reaches the target
objective: {{metric: cost/usd_to_target, target: {{metric: loss/val, max: 0.17}}}}
search: {{algorithm: grid}}
budget: {{num_trials: 2, num_steps: 600, eval_every_steps: 10, num_warmup_steps: 2, report_interval_s: 0.5}}
scaling: {{num_workers: 2, cpus_per_worker: 1}}
cost: {{prices: {{cpu: {{usd_per_hour: 0.05, date: 2026-11-27, source: test price}}}}}}
telemetry: {{period_s: 0}}
tracking: {{uri: "sqlite:///{db}", experiment: usd}}
storage_path: {storage}
"""


def _children(db: Path, experiment: str, parent: str) -> list:
    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    return sorted(child_runs(client, exp.experiment_id, parent), key=lambda c: int(c.data.params["batch_size"]))


def test_equal_data_then_time_to_target(ray_cluster: None, tmp_path: Path, new_store: Callable[[Path], Path]) -> None:
    for db in ("eq.db", "ttt.db", "asha.db", "usd.db"):
        new_store(tmp_path / db)
    # equal data: global batch 32 and 128 train on the same 8192 samples; lr follows the batch (linear rule)
    text = EQUAL_DATA.format(db=tmp_path / "eq.db", storage=tmp_path / "eq")
    outcome = run_sweep(parse_spec(text), text, echo=lambda line: None)
    assert [t.status for t in outcome.trials] == ["ok", "ok"], [(t.status, t.reason) for t in outcome.trials]
    small, large = _children(tmp_path / "eq.db", "equal", outcome.parent_run_id)
    assert [c.data.params["global_batch_size"] for c in (small, large)] == ["32", "128"]
    assert small.data.metrics["progress/samples_seen"] == large.data.metrics["progress/samples_seen"] == 8192
    assert (small.data.metrics["progress/steps"], large.data.metrics["progress/steps"]) == (8192 / 32 - 2, 8192 / 128 - 2)
    assert float(small.data.params["lr_effective"]) == pytest.approx(1e-3)
    assert float(large.data.params["lr_effective"]) == pytest.approx(4e-3)
    assert small.data.params["lr"] == large.data.params["lr"] == "0.001" and small.data.params["num_samples"] == "8192"
    # the guardrail compared both with the fp32 reference (the smaller global batch): gaps logged, flags if past 5%
    assert small.data.metrics["quality/gap_pct"] == 0.0
    gap = large.data.metrics["quality/gap_pct"]
    assert (DEGRADED_TAG in large.data.tags) == (gap > 5.0), (gap, large.data.tags.get(DEGRADED_TAG))
    for c in (small, large):  # 2 gloo ranks: the noise scale comes from the all-reduce
        assert c.data.metrics["stats/grad_noise_scale"] > 0

    # time to target: each trial evaluates every 10 steps and stops at the target
    text = TIME_TO_TARGET.format(target=2.4, db=tmp_path / "ttt.db", storage=tmp_path / "ttt")
    outcome = run_sweep(parse_spec(text), text, echo=lambda line: None)
    assert [t.status for t in outcome.trials] == ["ok", "ok"], [(t.status, t.reason) for t in outcome.trials]
    best = outcome.best
    assert best is not None and best.metrics["time/to_target_s"] == min(t.metrics["time/to_target_s"] for t in outcome.trials)
    for c in _children(tmp_path / "ttt.db", "ttt", outcome.parent_run_id):
        m = c.data.metrics
        assert c.data.params["workload"] == "gpt-lm" and m["throughput/tokens_per_s"] > 0  # the LM workload, in tokens
        assert m["loss/val"] <= 2.4 and m["progress/steps_to_target"] % 10 == 0
        assert m["time/to_target_s"] > m["time/eval_total_s"] > 0
        assert m["stats/grad_noise_scale"] > 0
        # leave-one-out: each trial's prediction comes from the other trial's S_min
        assert m["predict/time_to_target_s"] > 0

    # ASHA on the same curve: at equal training time the lr=1e-7 trial's loss/val is behind: pruned
    text = ASHA_TTT.format(db=tmp_path / "asha.db", storage=tmp_path / "asha")
    outcome = run_sweep(parse_spec(text), text, echo=lambda line: None)
    good, bad = outcome.trials
    assert good.status == "ok" and good.metrics["loss/val"] <= 0.17, (good.status, good.reason)
    assert bad.status == "pruned" and "stopped by ASHA after" in bad.reason and "loss/val=" in bad.reason, (bad.status, bad.reason)
    assert bad.metrics["progress/steps"] < 600 and bad.metrics["loss/val"] > 0.17

    # dollars to the target: the trial that misses it is measured and infeasible, the sweep runs on to its end
    # and ranks by dollars to the target; the cheapest is the best
    text = USD_TTT.format(db=tmp_path / "usd.db", storage=tmp_path / "usd")
    outcome = run_sweep(parse_spec(text), text, echo=lambda line: None)
    missed, reached = outcome.trials
    assert (missed.status, reached.status) == ("infeasible", "ok"), [(t.status, t.reason) for t in outcome.trials]
    assert "did not reach loss/val <= 0.17" in missed.reason and not outcome.stopped_reason
    assert outcome.best is reached and reached.metrics["cost/usd_to_target"] == pytest.approx(
        0.10 * reached.metrics["time/to_target_s"] / 3600)  # 2 cores at $0.05 a core-hour
    assert money_sentence(outcome, str).startswith(f"**Cheapest: trial {reached.number}**")
