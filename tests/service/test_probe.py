"""The memory-frontier probe: on warm workers with an injected memory limit on one rank, and on its
own with a fake memory model in place of the workers (every combination of memory settings probed,
and the search bounded by what the probe saw)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from sweeps.results.outcome import PROBED_TAG, probed_from
from sweeps.search.live_state import SearchState, running
from sweeps.search.searcher import SweepSearch, make_searcher
from sweeps.service import probe
from sweeps.service.probe import batch_candidates, probe_frontier
from sweeps.service.runner import run_sweep
from sweeps.spec import IntParam, SpecError, SweepSpec, parse_spec
from trainables.contract import FINAL

SPEC = """\
name: probe
trainable: {{name: 'tests.helpers.faulty:oom_on_rank1_above', params: {{limit: 48}}}}
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
def test_the_probe_finds_each_precisions_frontier_and_the_search_stays_below_it(ray_cluster: None, tmp_path: Path,
                                                                               new_store: Callable[[Path], Path]) -> None:
    new_store(tmp_path / "mlflow.db")
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


# --- the probe on its own: a fake memory model in place of the warm workers ------------------------

BATCHES = [8, 16, 32, 64, 128, 256, 512]
UNIT = """\
name: u
trainable: {{name: mlp-tabular}}
space:
  batch_size: {{type: categorical, choices: {batches}}}
  precision: {{type: categorical, choices: ["32", "bf16-mixed"]}}
  compile: {{type: categorical, choices: [false, true]}}
  lr: {{type: float, low: 1.0e-3, high: 1.0e-2, log: true}}
{extra}search: {{probe_batch_size: true{grid}}}
budget: {{num_trials: 60, num_steps: 5}}
seed: 1
"""
Memory = Callable[[dict[str, Any]], int]  # the largest batch that fits with these knobs


def _unit(extra: str = "", grid: bool = False, batches: list[int] = BATCHES) -> SweepSpec:
    return parse_spec(UNIT.format(batches=batches, extra=extra, grid=", algorithm: grid" if grid else ""))


def _memory(knobs: dict[str, Any]) -> int:
    """Compiled fits twice the batch of uncompiled, bf16 twice fp32's, a wider model less."""
    fits = (64 if knobs["compile"] else 32) * (2 if knobs["precision"] == "bf16-mixed" else 1)
    return fits * 32 // int(knobs.get("params.hidden", 32))


@pytest.fixture
def state() -> Iterator[SearchState]:
    """The running sweep's search state, as the sweep's controller sets it."""
    with running(SearchState()) as s:
        yield s


def _probe(spec: SweepSpec, state: SearchState, memory: Memory, monkeypatch: pytest.MonkeyPatch,
           fails: Callable[[dict[str, Any]], str] = lambda knobs: "") -> tuple[list[str], dict[str, str], list[dict[str, Any]]]:
    """Run the probe against `memory` (and `fails`: a failure kind other than oom, or ""); returns
    its lines, its tags and the knobs of every candidate it tried."""
    tried: list[dict[str, Any]] = []

    def fake_try(queue: Any, spec: SweepSpec, knobs: dict[str, Any]) -> tuple[str, str]:
        tried.append(knobs)
        if fails(knobs):
            return fails(knobs), "it broke"
        return ("fits", "") if knobs["batch_size"] <= memory(knobs) else ("oom", "CUDA out of memory")

    monkeypatch.setattr(probe, "_try", fake_try)
    lines: list[str] = []
    tags = probe_frontier(spec, None, state, lines.append)
    return lines, tags, tried


def _proposals(search: SweepSearch, n: int) -> list[dict[str, Any]]:
    """What the search proposes in `n` asks, each told as a finished trial (grid: until it ends)."""
    out = []
    for i in range(n):
        p = search.suggest(f"t{i}")
        if not isinstance(p, dict):
            break
        out.append(p)
        search.on_trial_complete(f"t{i}", {"throughput/samples_per_s": float(p["batch_size"]), FINAL: 1})
    return out


def _fails_at(memory: Memory, knobs: dict[str, Any], batches: list[int] = BATCHES) -> int:
    return min((b for b in batches if b > memory(knobs)), default=10**9)


def test_every_precision_and_compile_combination_is_probed_and_bounds_only_itself(
        state: SearchState, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _unit("  params.hidden: {type: categorical, choices: [32, 64]}\n")
    lines, tags, tried = _probe(spec, state, _memory, monkeypatch)
    combos = Counter((k["precision"], k["compile"], k["params.hidden"]) for k in tried)
    assert set(combos) == {(p, c, h) for p in ("32", "bf16-mixed") for c in (False, True) for h in (32, 64)}
    assert max(combos.values()) <= math.ceil(math.log2(len(BATCHES) + 1))  # a binary search per combination
    assert "memory probe bf16-mixed, compile, params.hidden=32: largest batch_size that fits 128, 256 does not" \
        in "\n".join(lines), lines
    assert tags["sweep.probe.32.params.hidden.64"].startswith("largest batch_size that fits 16, 32 does not")
    assert len(lines) == len(tags) - 1 == 8  # a line and a tag each, and the findings for the answer (PROBED_TAG)
    assert len(probed_from(tags)) == 8
    search = make_searcher(spec)
    assert search is not None
    proposals = _proposals(search, 60)
    for p in proposals:  # never at or above the batch the probe saw fail with the same settings
        assert p["batch_size"] < _fails_at(_memory, p), p
    # and the bound is that combination's own: compiled bf16 at hidden=32 still reaches 128
    for c in (False, True):
        for b in BATCHES:
            knobs = {"precision": "bf16-mixed", "compile": c, "params.hidden": 32, "batch_size": b, "num_workers": 2}
            assert (state.oom_excluded(knobs) is not None) is (b > _memory(knobs)), knobs


def test_settings_the_probe_did_not_measure_are_bounded_by_the_smallest_batch_it_saw_fail(
        state: SearchState, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _unit("  params.hidden: {type: int, low: 32, high: 256}\n")  # a range: only its first value is probed
    # fp32 compiled tries 64 (fits), 256 (oom), then 128 stops it on a failure other than oom: not measured
    _, tags, tried = _probe(spec, state, _memory, monkeypatch,
                            fails=lambda k: "error" if (k["precision"], k["compile"], k["batch_size"]) == ("32", True, 128) else "")
    assert tags["sweep.probe.32.compile.params.hidden.32"].endswith("64 fits, 256 oom, 128 error); stopped: error: it broke")
    assert {k["params.hidden"] for k in tried} == {32} and len(tags) == 5
    assert len(probed_from(tags)) == 3  # the stopped one's frontier was not measured: nothing for the answer to cite
    smallest = 64  # fp32 uncompiled at hidden=32 fits 32
    for p, c, h in [("bf16-mixed", True, 100), ("32", False, 33), ("32", True, 32)]:
        knobs = {"precision": p, "compile": c, "params.hidden": h, "num_workers": 2}
        assert state.oom_excluded({**knobs, "batch_size": smallest}) == smallest, knobs
        assert state.oom_excluded({**knobs, "batch_size": smallest // 2}) is None, knobs
    measured = {"precision": "bf16-mixed", "compile": True, "params.hidden": 32, "batch_size": 128, "num_workers": 2}
    assert state.oom_excluded(measured) is None  # a measured combination keeps its own, larger, bound
    search = make_searcher(spec)
    assert search is not None
    proposals = _proposals(search, 60)
    unmeasured = [p for p in proposals if p["params.hidden"] != 32]
    assert unmeasured and all(p["batch_size"] < smallest for p in unmeasured)


H100 = "  params.hidden: 32\n"  # fixed: part of every key, probed once


@pytest.mark.parametrize("compiled_fits", [64, 256])
def test_the_h100_case_a_compiled_batch_runs_only_where_the_probe_saw_it_fit(
        compiled_fits: int, state: SearchState, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU run: the probe measured only uncompiled bf16 (64 fits, 256 does not), and batch 256
    with compile=True then ran out of memory as a trial."""
    batches = [16, 64, 256, 1024]
    spec = parse_spec(UNIT.format(batches=batches, extra=H100, grid=", algorithm: grid")
                      .replace('["32", "bf16-mixed"]', '["bf16-mixed"]').replace(
                          "lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}", "lr: 3.0e-4")
                      .replace("num_trials: 60", "num_trials: 8"))

    def memory(knobs: dict[str, Any]) -> int:
        return compiled_fits if knobs["compile"] else 64

    lines, tags, _ = _probe(spec, state, memory, monkeypatch)
    assert lines[0].startswith("memory probe bf16-mixed: largest batch_size that fits 64, 256 does not"), lines
    assert lines[1].startswith(f"memory probe bf16-mixed, compile: largest batch_size that fits {compiled_fits}, "
                               f"{batches[batches.index(compiled_fits) + 1]} does not"), lines
    assert set(tags) == {"sweep.probe.bf16-mixed", "sweep.probe.bf16-mixed.compile", PROBED_TAG}
    found = {p.setting["compile"]: (p.fits, p.fails) for p in probed_from(tags)}
    assert found == {False: (64, 256), True: (compiled_fits, batches[batches.index(compiled_fits) + 1])}, found
    search = make_searcher(spec)
    assert search is not None
    ran = [(p["batch_size"], p["compile"]) for p in _proposals(search, 20)]
    expected = [(16, False), (64, False), (16, True), (64, True)] + ([(256, True)] if compiled_fits == 256 else [])
    assert ran == expected
