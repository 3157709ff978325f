"""The searcher on its own (no trials run): monotone OOM skipping, infeasibility fed back to
Optuna as constraints, deferred classification of errored trials, grid mode, multi-objective."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from sweeps.search.live_state import SearchState, running
from sweeps.search.plan import SizeRuns
from sweeps.search.searcher import SweepSearch, make_scheduler, make_searcher
from sweeps.search.trials import fixed_knobs
from sweeps.spec import parse_spec
from trainables.contract import FINAL

SPEC = """\
name: s
trainable: {name: mlp-tabular}
space:
  batch_size: {type: categorical, choices: [16, 32, 64, 128]}
  precision: {type: categorical, choices: ["32", "bf16-mixed"]}
budget: {num_trials: 50, num_steps: 5}
"""
TPUT = "throughput/samples_per_s"


@pytest.fixture
def state() -> Iterator[SearchState]:
    """The running sweep's search state, as the sweep's controller sets it."""
    with running(SearchState()) as s:
        yield s


def _searcher(text: str) -> SweepSearch:
    search = make_searcher(parse_spec(text))
    assert search is not None
    return search


def test_no_batch_at_or_above_an_oom_bound_is_proposed(state: SearchState) -> None:
    search = _searcher(SPEC)
    state.record_oom({"batch_size": 64, "precision": "32", "compile": False, "num_workers": 2})
    proposals = [search.suggest(f"t{i}") for i in range(30)]
    for i in range(30):
        search.on_trial_complete(f"t{i}", {TPUT: 1.0, FINAL: 1})
    ran = [p for p in proposals if isinstance(p, dict)]
    assert proposals[len(ran):] == [search.FINISHED] * (30 - len(ran))  # the space ran out, none twice
    fp32 = sorted(p["batch_size"] for p in ran if p["precision"] == "32")
    bf16 = sorted(p["batch_size"] for p in ran if p["precision"] == "bf16-mixed")
    assert fp32 == [16, 32]  # bounded for fp32 ...
    assert bf16 == [16, 32, 64, 128]  # ... and only for fp32
    skipped = [t for t in search.study.trials if t.constraints.get("fits", 0) > 0]
    assert skipped and all(t.state == optuna.trial.TrialState.COMPLETE for t in skipped)  # told, not dropped


def test_search_ends_when_nothing_feasible_is_left(state: SearchState) -> None:
    search = _searcher(SPEC.replace('["32", "bf16-mixed"]', '["32"]'))
    state.record_oom({"batch_size": 16, "precision": "32", "compile": False, "num_workers": 2})  # even the smallest
    assert search.suggest("t0") == search.FINISHED


def test_errored_trials_are_told_once_classified(state: SearchState) -> None:
    search = _searcher(SPEC)
    for t in ("oom", "crash", "ok"):
        assert isinstance(search.suggest(t), dict)
    search.on_trial_complete("oom", error=True)  # Tune tells the searcher before the callback classifies
    search.on_trial_complete("crash", error=True)
    search.on_trial_complete("ok", {TPUT: 5.0, FINAL: 1})
    own = lambda: [t for t in search.study.trials if "repeat_of" not in t.user_attrs]  # noqa: E731 - not the repeats told
    states = [t.state for t in own()]
    assert states[0] == states[1] == optuna.trial.TrialState.RUNNING  # not yet told
    state.failures.update({"oom": "oom", "crash": "crash"})
    search.suggest("next")
    trials = own()
    assert trials[0].state == optuna.trial.TrialState.COMPLETE and trials[0].constraints == {"fits": 1.0}
    assert trials[1].state == optuna.trial.TrialState.FAIL  # a crash says nothing about the configuration
    assert trials[2].value == 5.0 and trials[2].constraints == {"fits": 0.0}


def test_a_trial_stopped_early_is_pruned_not_complete(state: SearchState) -> None:
    search = _searcher(SPEC)
    search.suggest("t")
    search.on_trial_result("t", {"loss/train": 1.0})  # no objective yet: must not raise
    search.on_trial_complete("t", {TPUT: 9.0, FINAL: 0})
    assert search.study.trials[0].state == optuna.trial.TrialState.PRUNED


LANDSCAPE = """\
name: c
trainable: {name: mlp-tabular}
space: {lr: {type: float, low: 0.001, high: 1.0}}
objective: {metric: throughput/samples_per_s, mode: max, constraints: [{metric: loss/val, max: 1.0}]}
budget: {num_trials: 60, num_steps: 5}
seed: 3
"""


def _infeasible_proposals(search: SweepSearch, tell_as_fail: bool, state: SearchState, n: int = 60) -> int:
    """Throughput rises with lr but loss/val breaks its bound above lr=0.6: the unconstrained
    optimum is infeasible. Returns how many of the last 30 proposals landed there."""
    late = 0
    for i in range(n):
        lr = search.suggest(f"t{i}")["lr"]  # type: ignore[index]
        infeasible = lr > 0.6
        late += infeasible and i >= n - 30
        if infeasible and tell_as_fail:  # what plain OptunaSearch does with a failed trial
            search.on_trial_complete(f"t{i}", error=True)
            state.failures[f"t{i}"] = "crash"
        else:
            search.on_trial_complete(f"t{i}", {TPUT: 100 * lr, "loss/val": 0.5 + lr, FINAL: 1})
    return late


def test_constraints_teach_the_sampler_the_infeasible_region(state: SearchState) -> None:
    ours = _infeasible_proposals(_searcher(LANDSCAPE), False, state)
    with running(SearchState()) as other:  # another sweep
        ignored = _infeasible_proposals(_searcher(LANDSCAPE), True, other)
    # Ignoring failures, TPE keeps proposing the region it cannot see; with constraints it learns.
    assert ours <= 6 and ours < ignored / 2, (ours, ignored)


def test_grid_visits_every_point_once_smallest_batch_first_and_skips_above_oom(state: SearchState) -> None:
    text = SPEC.replace("num_trials: 50", "num_trials: 8") + "search: {algorithm: grid}\n"
    search = _searcher(text)
    fixed = fixed_knobs(parse_spec(text))
    assert state.grid_skips(fixed) == []
    seen = []
    for i in range(8):
        p = search.suggest(f"t{i}")
        if not isinstance(p, dict):
            break
        seen.append((p["precision"], p["batch_size"]))
        if p == {"precision": "32", "batch_size": 32}:  # runs out of memory
            search.on_trial_complete(f"t{i}", error=True)
            state.failures[f"t{i}"] = "oom"
            state.record_oom({**p, "compile": False, "num_workers": 2})
            # the progress lines learn at once which points will never run, before the searcher reaches them
            assert [(q["precision"], q["batch_size"]) for q in state.grid_skips(fixed)] == [("32", 64), ("32", 128)]
        else:
            search.on_trial_complete(f"t{i}", {TPUT: 1.0, FINAL: 1})
    assert seen == [("32", 16), ("32", 32), ("bf16-mixed", 16), ("bf16-mixed", 32), ("bf16-mixed", 64),
                    ("bf16-mixed", 128)]
    assert search.suggest("after") == search.FINISHED
    assert [(q["precision"], q["batch_size"]) for q in state.grid_skips(fixed)] == [("32", 64), ("32", 128)]


def test_multi_objective_tells_both_values(state: SearchState) -> None:
    text = SPEC + "objective: {metric: [throughput/samples_per_s, loss/val], mode: [max, min]}\n"
    search = _searcher(text)
    search.suggest("t")
    search.on_trial_complete("t", {TPUT: 10.0, "loss/val": 2.0, FINAL: 1})
    assert search.study.trials[0].values == [10.0, 2.0] and len(search.study.directions) == 2


def test_asha_compares_trials_at_equal_measured_steps() -> None:
    spec = parse_spec(SPEC + "search: {early_stopping: {grace_steps: 2, reduction_factor: 2}}\n")
    scheduler = make_scheduler(spec)
    assert type(scheduler).__name__ == "AsyncHyperBandScheduler"
    assert (scheduler._time_attr, scheduler._metric, scheduler._mode) == ("progress/steps", TPUT, "max")


def test_asha_on_a_target_compares_the_quality_curve_at_equal_training_time() -> None:
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    text = SPEC.replace("num_steps: 5", "num_samples: 4096, eval_every_steps: 10") + (
        "objective: {metric: time/to_target_s, target: {metric: loss/val, max: 0.5}}\n"
        "search: {early_stopping: {grace_s: 1.0, reduction_factor: 2}}\n")
    scheduler = make_scheduler(parse_spec(text))
    assert (scheduler._time_attr, scheduler._metric, scheduler._mode) == ("time/elapsed_s", "loss/val", "min")
    assert scheduler._stop_last_trials is False  # past the top rung (8 s) a trial runs on to its target
    assert sorted(m for m, _ in scheduler._brackets[0]._rungs) == [1.0, 2.0, 4.0, 8.0]
    ahead, behind = SimpleNamespace(trial_id="a"), SimpleNamespace(trial_id="b")
    for t in (ahead, behind):
        scheduler.on_trial_add(None, t)
    # a report between evaluations has no loss/val: nothing to compare, the trial continues
    assert scheduler.on_trial_result(None, behind, {"time/elapsed_s": 5.0, TPUT: 9.0}) == TrialScheduler.CONTINUE
    assert scheduler.on_trial_result(None, ahead, {"time/elapsed_s": 1.1, "loss/val": 2.0}) == TrialScheduler.CONTINUE
    # at the 1 s rung the other trial's loss is worse: stopped
    assert scheduler.on_trial_result(None, behind, {"time/elapsed_s": 1.2, "loss/val": 3.0}) == TrialScheduler.STOP


def test_a_target_with_another_objective_keeps_asha_on_steps() -> None:
    text = SPEC.replace("num_steps: 5", "num_steps: 50, eval_every_steps: 10") + (
        "objective: {metric: throughput/samples_per_s, target: {metric: loss/val, max: 0.5}}\n"
        "search: {early_stopping: {grace_steps: 10, reduction_factor: 3}}\n")
    scheduler = make_scheduler(parse_spec(text))
    assert (scheduler._time_attr, scheduler._metric) == ("progress/steps", TPUT)


def test_an_oom_bounds_the_batch_only_for_the_same_own_params() -> None:
    state = SearchState()
    wide = {"precision": "32", "compile": False, "batch_size": 64, "params.hidden": 512}
    state.record_oom(wide)
    assert state.oom_excluded({**wide, "batch_size": 128}) == 64
    assert state.oom_excluded({**wide, "params.hidden": 64}) is None  # a narrower model may fit
    assert state.oom_excluded({**wide, "batch_size": 32}) is None


def test_after_a_probe_settings_it_did_not_measure_are_bounded_by_its_smallest_failure(state: SearchState) -> None:

    eager = {"precision": "bf16-mixed", "compile": False}
    compiled = {**eager, "compile": True}
    assert state.oom_excluded({**compiled, "batch_size": 4096}) is None  # no probe, no trial: nothing bounds it
    state.record_probe(eager, 256)
    assert state.oom_excluded({**compiled, "batch_size": 256}) == 256  # unmeasured: the probe saw 256 fail
    assert state.oom_excluded({**compiled, "batch_size": 64}) is None
    assert state.oom_skip_reason({**compiled, "batch_size": 256}) == (
        "the memory probe saw batch_size=256 run out of memory and did not measure precision=bf16-mixed, compile=True")
    state.record_probe(compiled, None)  # measured: every batch it tried fit
    assert state.oom_excluded({**compiled, "batch_size": 4096}) is None
    state.record_oom({**compiled, "batch_size": 512})  # a trial learns more than the probe did
    assert state.oom_excluded({**compiled, "batch_size": 512}) == 512
    assert state.oom_skip_reason({**compiled, "batch_size": 1024}) == (
        "batch_size=512 already ran out of memory with precision=bf16-mixed, compile=True")


def test_the_searcher_is_tunes_public_searcher_and_its_state_survives_save_restore(state: SearchState, tmp_path: Path) -> None:
    from ray.tune.search import Searcher
    from ray.tune.search.optuna import OptunaSearch

    search = _searcher(SPEC)
    assert isinstance(search, Searcher) and not isinstance(search, OptunaSearch)
    first = search.suggest("a")
    search.on_trial_complete("a", {TPUT: 3.0, FINAL: 1})
    pending = search.suggest("b")
    search.save(str(tmp_path / "s.pkl"))
    again = _searcher(SPEC)
    again.restore(str(tmp_path / "s.pkl"))
    again.on_trial_complete("b", {TPUT: 4.0, FINAL: 1})  # a trial asked before the save is told after it
    assert [t.value for t in again.study.trials] == [3.0, 4.0] and [t.params for t in again.study.trials] == [first, pending]


SIXTEEN = """\
name: s
trainable: {name: mlp-tabular}
space:
  num_workers: {type: categorical, choices: [1, 2]}
  batch_size: {type: categorical, choices: [16, 64]}
  precision: {type: categorical, choices: ["32", "bf16-mixed"]}
  params.hidden: {type: categorical, choices: [32, 64]}
search: {algorithm: tpe%s}
budget: {num_trials: %d, num_steps: 5}
"""
CV = "throughput/samples_per_s_cv_pct"


def _value(config: dict[str, Any]) -> float:
    """A landscape with a clear winner region (TPE then keeps proposing near it)."""
    return 100.0 * config["batch_size"] * (0.5 if config["precision"] == "bf16-mixed" else 1.0) / config["num_workers"]


def _drive(search: SweepSearch, n: int, at_once: int = 1, cv: float = 1.0,
           value: Any = _value) -> list[dict[str, Any] | str]:
    """Tune's way: up to `at_once` trials running, each told its value when it ends."""
    handed: list[dict[str, Any] | str] = []
    running: list[tuple[str, dict[str, Any]]] = []
    for i in range(n):
        config = search.suggest(f"t{i}")
        handed.append(config)  # type: ignore[arg-type]
        if isinstance(config, dict):
            running.append((f"t{i}", config))
        if len(running) >= at_once or not isinstance(config, dict):
            for tid, c in running:
                search.on_trial_complete(tid, {TPUT: value(c), CV: cv, FINAL: 1})
            running = []
    return handed


@pytest.mark.parametrize("at_once", [1, 3])
def test_tpe_never_hands_out_a_configuration_twice(state: SearchState, at_once: int) -> None:
    """12 trials over a 16-point space: 12 distinct configurations (TPE alone repeated 3-4 of 12 here)."""
    search = _searcher(SIXTEEN % ("", 12))
    handed = _drive(search, 12, at_once)
    keys = {tuple(sorted(c.items())) for c in handed if isinstance(c, dict)}
    assert len(keys) == 12 and all(isinstance(c, dict) for c in handed)
    repeats = [t for t in search.study.trials if "repeat_of" in t.user_attrs]
    assert all(t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL) for t in repeats)


def test_an_exhausted_space_stops_and_says_so(state: SearchState) -> None:
    search = _searcher(SIXTEEN % ("", 24))
    handed = _drive(search, 24)
    ran = [c for c in handed if isinstance(c, dict)]
    assert len(ran) == len({tuple(sorted(c.items())) for c in ran}) == 16
    assert handed[16:] == [search.FINISHED] * 8
    assert state.exhausted == "every one of the space's 16 configurations has run (16 trials)"


def test_an_exhausted_space_replicates_the_close_calls_when_asked(state: SearchState) -> None:
    search = _searcher(SIXTEEN % (", when_exhausted: replicate", 24))
    # cv 5%: 6,400/s (batch 64, fp32, 1 rank; either width) and nothing else within 5% of it
    handed = _drive(search, 24, cv=5.0)
    ran = [c for c in handed if isinstance(c, dict)]
    assert len(ran) == 24
    replicas = ran[16:]
    assert {(c["batch_size"], c["precision"], c["num_workers"]) for c in replicas} == {(64, "32", 1)}
    assert sorted(c["params.hidden"] for c in replicas) == [32] * 4 + [64] * 4  # the least replicated first
    firsts = {v for k, v in state.replicate_of.items()}
    assert len(state.replicate_of) == 8 and len(firsts) == 2  # each names its configuration's first trial
    assert "replicate the close calls" in state.exhausted


def test_no_close_call_no_replicate(state: SearchState) -> None:
    search = _searcher(SIXTEEN % (", when_exhausted: replicate", 24))
    wider = lambda c: _value(c) * (1.01 if c["params.hidden"] == 64 else 1.0)  # noqa: E731 - 1% apart, cv 0.01%
    handed = _drive(search, 24, cv=0.01, value=wider)
    assert sum(isinstance(c, dict) for c in handed) == 16
    assert state.exhausted.endswith("the best configuration is clear of the others beyond their noise: "
                                            "nothing to replicate")


def test_the_worker_count_is_held_for_runs_of_trials(state: SearchState) -> None:
    """TPE alternated num_workers 1 <-> 2 (7 warm groups for 12 trials); held in runs of 12 / (2 + 1) = 4:
    one run of each count first (the pool's first group, 1 rank, then 2), then the count TPE picks."""
    search = _searcher(SIXTEEN % ("", 12))
    sizes = [c["num_workers"] for c in _drive(search, 12) if isinstance(c, dict)]
    assert sizes[:8] == [1] * 4 + [2] * 4
    changes = sum(a != b for a, b in zip(sizes, sizes[1:], strict=False))
    assert changes <= 2, sizes  # at most 3 groups
    assert state.runs is not None and state.runs.run_length == 4



def test_the_restarts_the_plan_expects_are_what_the_runs_pay_on_average(state: SearchState) -> None:
    """Issue 15: a 12-trial TPE sweep over num_workers [1, 2] paid 2 restarts where the plan expected 1.5.
    The runs of 12 / (2 + 1) = 4: 1,1,1,1 on the pool's first group (1 rank: no restart), 2,2,2,2 (one
    restart, certain), then a run of the count the sampler picks for trial 9: back to 1 (a second restart)
    or on at 2 (none). Every sweep pays 1 or 2, so each is 0.5 off the 1.5 expected: variance, not bias.

    Which, depends on the landscape: about half the time trial 9 is still among TPE's 10 random start-up
    trials (even odds), else (proposals of what ran, told to Optuna, pass 10) TPE picks the count that
    measured faster. Where 1 rank is faster the sweeps pay 1.8 on average, where 2 are, 1.2; before the
    sweep has measured which (the plan, the first ETA), each is as likely, and the mean is the plan's 1.5:
    40 seeded sweeps of each through the real searcher, within 3 binomial standard errors (0.17)."""
    from sweeps.service.progress import planned_restarts

    text = SIXTEEN % ("", 12)
    runs = SizeRuns.of(parse_spec(text))
    assert runs is not None and runs.expected_restarts(12) == planned_restarts(parse_spec(text)) == 1.5
    paid: dict[int, list[int]] = {1: [], 2: []}
    for faster, seed in itertools.product(paid, range(40)):
        def value(c: dict[str, Any], faster: int = faster) -> float:
            return 100.0 * c["batch_size"] * (2.0 if c["num_workers"] == faster else 1.0)

        sizes = [c["num_workers"] for c in _drive(_searcher(f"{text}seed: {seed}\n"), 12, value=value)
                 if isinstance(c, dict)]
        assert sizes[:8] == [1] * 4 + [2] * 4 and len(set(sizes[8:])) == 1, sizes  # the runs, as planned
        paid[faster].append(sum(a != b for a, b in zip([1, *sizes], sizes, strict=False)))  # 1st group: 1 rank
    assert set(paid[1]) == set(paid[2]) == {1, 2}
    mean = statistics.fmean(paid[1] + paid[2])
    assert statistics.fmean(paid[1]) > 1.5 > statistics.fmean(paid[2]), paid
    assert abs(mean - 1.5) <= 3 * 0.5 / math.sqrt(80), (mean, paid)
