"""Warm worker groups, for real: one long-lived Ray Train group (2 gloo ranks) serves trial after
trial; a trial's numbers do not depend on what ran before it; clean failures keep the group, a
crash retires it and the next trial gets a fresh one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sweeps.service.runner import run_sweep
from sweeps.spec import parse_spec

pytestmark = pytest.mark.ray

SPEC = """\
name: warm
trainable: {{name: tests.helpers.faulty:warm_modes, params: {{}}}}
space:
  params.mode: {{type: categorical, choices: [same1, other, oom, config, same2, crash, same3]}}
  batch_size: 32
  lr: 0.01
search: {{algorithm: grid}}
budget: {{num_trials: 7, num_steps: 8, num_warmup_steps: 2, report_interval_s: 0.01, max_retries: 0,
          max_identical_failures: 0}}
scaling: {{num_workers: 2, cpus_per_worker: 1, reuse_workers: true}}
telemetry: {{period_s: 0}}
tracking: {{uri: "sqlite:///{db}", experiment: warm}}
storage_path: {storage}
seed: 5
"""


@pytest.fixture(scope="module")
def warm_sweep(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory, new_store: Callable[[Path], Path]) -> tuple:
    """The 7-trial sweep on warm groups, shared with the cold test (which compares its numbers)."""
    tmp = tmp_path_factory.mktemp("warm")
    text = SPEC.format(db=new_store(tmp / "mlflow.db"), storage=tmp / "results")
    lines: list[str] = []
    outcome = run_sweep(parse_spec(text), text, echo=lines.append)
    return outcome, lines


def test_a_warm_group_serves_trials_in_isolation_and_is_replaced_after_a_crash(warm_sweep: tuple) -> None:
    outcome, lines = warm_sweep
    by_mode = {t.params["workload.mode"]: t for t in outcome.trials}
    assert {m: t.status for m, t in by_mode.items()} == {
        "same1": "ok", "other": "ok", "oom": "oom", "config": "config", "same2": "ok", "crash": "crash", "same3": "ok"}, \
        [(t.params["workload.mode"], t.status, t.reason) for t in outcome.trials]
    same = [by_mode[m].metrics for m in ("same1", "same2", "same3")]
    # the same seeded trial: first in its group, after other trials (and failures), in a fresh group
    assert same[0]["loss/val"] == pytest.approx(same[1]["loss/val"], rel=1e-6) == pytest.approx(same[2]["loss/val"], rel=1e-6)
    assert same[0]["pool/group"] == same[1]["pool/group"] != same[2]["pool/group"]  # the crash retired the first group
    assert (same[0]["pool/trial_in_group"], same[1]["pool/trial_in_group"], same[2]["pool/trial_in_group"]) == ("1", "5", "1")
    assert "out of memory" in by_mode["oom"].reason and "hidden" in by_mode["config"].reason
    assert any("warm worker groups: 2 started for 7 trial(s) (1 restart to replace a failed group, " in line
               and "; sweep wall" in line for line in lines), lines[-3:]


def test_cold_mode_gives_the_same_numbers_and_classifies_the_same(warm_sweep: tuple, tmp_path: Path, new_store: Callable[[Path], Path]) -> None:
    # scaling.reuse_workers: false, a new Ray Train run per trial: the same seeded trial's loss/val
    # as in a warm group, and the same failure kind
    text = SPEC.format(db=new_store(tmp_path / "mlflow.db"), storage=tmp_path / "results")
    text = text.replace("[same1, other, oom, config, same2, crash, same3]", "[same1, oom]")
    text = text.replace("num_trials: 7", "num_trials: 2").replace("reuse_workers: true", "reuse_workers: false")
    lines: list[str] = []
    outcome = run_sweep(parse_spec(text), text, echo=lines.append)
    by_mode = {t.params["workload.mode"]: t for t in outcome.trials}
    assert {m: t.status for m, t in by_mode.items()} == {"same1": "ok", "oom": "oom"}
    warm = {t.params["workload.mode"]: t for t in warm_sweep[0].trials}
    assert by_mode["same1"].metrics["loss/val"] == pytest.approx(warm["same1"].metrics["loss/val"], rel=1e-6)
    assert "out of memory" in by_mode["oom"].reason
    assert "pool/group" not in by_mode["same1"].metrics
    assert any(line.startswith("one Ray Train run per trial; sweep wall") for line in lines)
