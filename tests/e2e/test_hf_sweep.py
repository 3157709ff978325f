"""A Hugging Face model swept as it is, for real: 2 gloo workers per trial, bf16 autocast,
gradient accumulation searched, MLflow children carrying the knobs, its own params and eval/*."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeps.service.runner import run_sweep
from sweeps.spec import parse_spec
from sweeps.tracking import child_runs

pytestmark = pytest.mark.ray

SPEC = """\
name: hf-sweep
trainable:
  name: examples.hf_causal_lm:build
  params: {{num_layers: 1, num_train_seqs: 256, num_val_seqs: 32, max_len: 24}}
space:
  batch_size: 4
  precision: bf16-mixed
  grad_accum_steps: {{type: categorical, choices: [1, 2]}}
  params.hidden_size: 32
  max_grad_norm: 1.0
objective: {{constraints: [{{metric: eval/token_accuracy, min: 0.0}}]}}
search: {{algorithm: grid}}
budget: {{num_trials: 2, num_steps: 8, num_warmup_steps: 2, report_interval_s: 0.01}}
scaling: {{num_workers: 2, cpus_per_worker: 1}}
telemetry: {{period_s: 0.05}}
tracking: {{uri: "sqlite:///{db}", experiment: hf}}
storage_path: {storage}
"""


def test_a_hugging_face_model_sweeps_end_to_end(ray_cluster: None, tmp_path: Path, new_store: Callable[[Path], Path]) -> None:
    new_store(tmp_path / "mlflow.db")
    text = SPEC.format(db=tmp_path / "mlflow.db", storage=tmp_path / "results")
    spec = parse_spec(text)
    assert spec.objective.primary == "throughput/tokens_per_s"  # the unit follows the trainable
    outcome = run_sweep(spec, text, echo=lambda line: None)
    assert [t.status for t in outcome.trials] == ["ok", "ok"], [(t.status, t.reason) for t in outcome.trials]

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("hf")
    children = child_runs(client, exp.experiment_id, outcome.parent_run_id)
    assert sorted(c.data.params["grad_accum_steps"] for c in children) == ["1", "2"]
    for child in children:
        p, m = child.data.params, child.data.metrics
        assert p["precision"] == "bf16-mixed" and p["workload.hidden_size"] == "32" and p["workload.num_layers"] == "1"
        assert int(p["global_batch_size"]) == 4 * int(p["grad_accum_steps"]) * 2
        assert 0.0 <= m["eval/token_accuracy"] <= 1.0 and m["throughput/tokens_per_s"] > 0
        assert "throughput/samples_per_s" not in m and m["progress/world_size"] == 2
