"""The worker count searched for real (Ray Tune + warm Ray Train groups of both sizes + MLflow): 1 and 2
gloo ranks x two batch sizes in one grid, each size on its own warm group, the 2-rank trials carrying
their scaling efficiency against their 1-rank twin and the all-reduce wait, the answer naming the ranks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeps.results.report import answer, best_fragment
from sweeps.service.runner import run_sweep
from sweeps.spec import parse_spec
from sweeps.tracking import child_runs
from trainables.contract import ALLREDUCE_WAIT_PCT, SCALING_EFFICIENCY_PCT

pytestmark = pytest.mark.ray

RANKS = """\
name: ranks
trainable: {{name: mlp-tabular, params: {{num_train_rows: 2048}}}}
space:
  num_workers: {{type: categorical, choices: [1, 2]}}
  batch_size: {{type: categorical, choices: [32, 64]}}
  lr: 1.0e-3
search: {{algorithm: grid}}
budget: {{num_trials: 4, num_steps: 20, num_warmup_steps: 4, report_interval_s: 0.5}}
telemetry: {{period_s: 0}}
tracking: {{uri: "sqlite:///{db}", experiment: ranks}}
storage_path: {storage}
"""


def test_one_and_two_ranks_in_one_sweep_on_warm_groups_of_both_sizes(ray_cluster: None, tmp_path: Path,
                                                                    new_store: Callable[[Path], Path]) -> None:
    new_store(tmp_path / "ranks.db")
    text = RANKS.format(db=tmp_path / "ranks.db", storage=tmp_path / "ranks")
    lines: list[str] = []
    outcome = run_sweep(parse_spec(text), text, echo=lines.append)
    assert [t.status for t in outcome.trials] == ["ok"] * 4, [(t.status, t.reason) for t in outcome.trials]
    by_size = {n: [t for t in outcome.trials if t.params["num_workers"] == n] for n in (1, 2)}
    groups = {n: {t.metrics["pool/group"] for t in rows} for n, rows in by_size.items()}
    # each size on one warm group of its own (grid: the worker count varies slowest, so one resize)
    assert len(groups[1]) == len(groups[2]) == 1 and groups[1] != groups[2], groups
    assert all(t.metrics["progress/world_size"] == n for n, rows in by_size.items() for t in rows)
    client = MlflowClient(f"sqlite:///{tmp_path / 'ranks.db'}")
    exp = client.get_experiment_by_name("ranks")
    children = {c.data.tags["sweep.trial_id"]: c for c in child_runs(client, exp.experiment_id, outcome.parent_run_id)}
    for t in by_size[2]:
        logged = children[t.trial_id].data
        twin = next(o for o in by_size[1] if o.params["batch_size"] == t.params["batch_size"])
        want = 100.0 * t.metrics["throughput/samples_per_s"] / (twin.metrics["throughput/samples_per_s"] * 2)
        assert logged.metrics[SCALING_EFFICIENCY_PCT] == pytest.approx(want)  # from the measured figures
        assert logged.metrics[ALLREDUCE_WAIT_PCT] >= 0.0
        assert logged.params["global_batch_size"] == str(2 * t.params["batch_size"])
        assert f"against 1 rank (trial {twin.number}" in logged.tags["sweep.verdict_reason"]
        # the trace of both ranks, cited with the rank that waited most in the all-reduce (warm groups)
        assert "trace (warm-up steps 2-3): compute" in logged.tags["sweep.verdict_reason"]
        assert logged.metrics["trace/comm_pct"] >= logged.metrics["trace/comm_exposed_pct"] >= 0
        assert len(client.list_artifacts(children[t.trial_id].info.run_id, "trace")) == 2
    for t in by_size[1]:
        assert SCALING_EFFICIENCY_PCT not in children[t.trial_id].data.metrics
        assert ALLREDUCE_WAIT_PCT not in children[t.trial_id].data.metrics
    best = outcome.best
    assert best is not None
    assert f"it runs on **{best.params['num_workers']} rank" in answer(outcome)
    assert f"num_workers: {best.params['num_workers']}" in best_fragment(outcome)


def test_tpe_over_the_worker_count_holds_it_never_repeats_and_says_when_the_space_ran_out(
        ray_cluster: None, tmp_path: Path, new_store: Callable[[Path], Path]) -> None:
    """TPE with 6 trials over the grid's 4 points: each runs once (TPE alone proposed repeats), the worker
    count is held in runs (6 / (2 + 1) = 2 trials: one group per count, one restart, counted and priced),
    then the search stops and says so."""
    new_store(tmp_path / "ranks.db")
    text = RANKS.format(db=tmp_path / "ranks.db", storage=tmp_path / "tpe").replace(
        "algorithm: grid", "algorithm: tpe").replace("num_trials: 4", "num_trials: 6").replace("name: ranks", "name: tpe")
    lines: list[str] = []
    outcome = run_sweep(parse_spec(text), text, echo=lines.append)
    assert [t.status for t in outcome.trials] == ["ok"] * 4, [(t.status, t.reason) for t in outcome.trials]
    configs = [(t.params["num_workers"], t.params["batch_size"]) for t in outcome.trials]
    assert len(set(configs)) == 4 and [n for n, _ in configs] == [1, 1, 2, 2], configs
    assert outcome.exhausted == "every one of the space's 4 configurations has run (4 trials)"
    planned = next(line for line in lines if line.startswith("planned: "))
    assert "; 2 warm worker group start(s) (1 restart(s) to change the worker count, planned) x " in planned, planned
    said = next(line for line in lines if line.startswith("warm worker groups: "))
    assert said.startswith("warm worker groups: 2 started for 4 trial(s) (1 restart to change the worker count (or type), "), said
    client = MlflowClient(f"sqlite:///{tmp_path / 'ranks.db'}")
    assert client.get_run(outcome.parent_run_id).data.tags["sweep.exhausted"] == outcome.exhausted
    assert "The search ran out of configurations: every one of the space's 4" in answer(outcome)
