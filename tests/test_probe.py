"""The memory-frontier probe on warm workers, with an injected memory limit on one rank."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeps.probe import batch_candidates
from sweeps.runner import run_sweep
from sweeps.spec import IntParam, SpecError, parse_spec

SPEC = """\
name: probe
trainable: {{name: 'tests.faulty:oom_on_rank1_above', params: {{limit: 48}}}}
space:
  batch_size: {{type: categorical, choices: [8, 16, 32, 64, 128, 256, 512]}}
  precision: {{type: categorical, choices: ["32", "bf16-mixed"]}}
  lr: {{type: float, low: 1.0e-3, high: 1.0e-2, log: true}}
search: {{probe_batch_size: true}}
budget: {{num_trials: 3, num_steps: 4, num_warmup_steps: 1, report_interval_s: 0.01}}
telemetry: {{period_s: 0}}
tracking: {{uri: "sqlite:///{db}", experiment: probe}}
storage_path: {storage}
seed: 2
"""


@pytest.mark.ray
def test_the_probe_finds_each_precisions_frontier_and_the_search_stays_below_it(ray_cluster: None, tmp_path: Path) -> None:
    text = SPEC.format(db=tmp_path / "mlflow.db", storage=tmp_path / "r")
    lines: list[str] = []
    outcome = run_sweep(parse_spec(text), text, echo=lines.append)
    probes = [line for line in lines if line.startswith("memory probe")]
    assert len(probes) == 2, lines
    for line in probes:  # rank 1 alone runs out above 48: the frontier is 32, found in <= ceil(log2(7)) + 1 tries
        assert "largest batch_size that fits 32, 64 does not" in line, line
        tried = int(line.split("(")[1].split(" of ")[0])
        assert tried <= math.ceil(math.log2(7)) + 1
    assert [t.status for t in outcome.trials] == ["ok"] * 3 and all(t.params["batch_size"] <= 32 for t in outcome.trials)
    tags = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(outcome.parent_run_id).data.tags
    assert tags["sweep.probe.32"].startswith("largest batch_size that fits 32") and "sweep.probe.bf16-mixed" in tags


def test_probe_candidates_and_refusals() -> None:
    assert batch_candidates(IntParam(type="int", low=3, high=100, log=True)) == [3, 4, 8, 16, 32, 64, 100]
    base = "name: t\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 2, num_steps: 5}\nsearch: {probe_batch_size: true}\n"
    with pytest.raises(SpecError, match="batch_size is fixed, so there is nothing to probe"):
        parse_spec(base)
    with pytest.raises(SpecError, match="the probe runs on warm worker groups; set scaling.reuse_workers: true"):
        parse_spec(base + "space: {batch_size: {type: categorical, choices: [8, 16]}}\nscaling: {reuse_workers: false}\n")
