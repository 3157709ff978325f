"""The loop's behaviour pinned across its refactor into a spine with components: two-rank CPU
trials (fixed steps, three precisions, equal data with a cut tail, min_window_s, a checkpoint and a
resume from it, a memory probe that fits and one with an injected OOM on one rank, a target met,
the evaluation curve) give the same final keys, step and item counts, report counts and failure
points as the loop before it (tests/data/loop_spine_golden.json, written by that loop)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "loop_spine_golden.json"


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("spine")
    out = tmp / "scenarios.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "tests/helpers/loop_scenarios.py", str(tmp / "data"), str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    if os.environ.get("SWEEPS_WRITE_GOLDEN"):  # only when the behaviour changes on purpose: say why in the commit
        GOLDEN.write_text(out.read_text())
    return json.loads(out.read_text())


def test_every_scenario_matches_the_pinned_behaviour(scenarios: dict) -> None:
    golden = json.loads(GOLDEN.read_text())
    assert sorted(scenarios) == sorted(golden)
    for name, want in golden.items():
        assert scenarios[name] == want, name


def test_the_pinned_behaviour_is_what_it_claims(scenarios: dict) -> None:
    assert scenarios["probe_oom"]["error"] == "OutOfMemoryError"
    assert scenarios["probe_oom"]["where"][0] == "probe-agree"  # both ranks stopped at the agreement
    assert scenarios["equal_data_tail"]["counts"]["progress/samples_seen"] in (1001, 1002)
    assert scenarios["resumed"]["counts"]["progress/restored_from_step"] == 4
    assert scenarios["target"]["counts"]["progress/steps_to_target"] == 4
    assert scenarios["min_window"]["longer_than_num_steps"]
