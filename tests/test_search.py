"""Monotone skipping in the searcher, without running trials."""

from __future__ import annotations

from sweeps import runner
from sweeps.spec import parse_spec

SPEC = """\
name: s
trainable: {name: mlp-tabular}
space:
  batch_size: {type: categorical, choices: [16, 32, 64, 128]}
  precision: {type: categorical, choices: ["32", "bf16-mixed"]}
budget: {num_trials: 50, num_steps: 5}
"""


def test_no_batch_at_or_above_an_oom_bound_is_proposed() -> None:
    spec = parse_spec(SPEC)
    search = runner._searcher(spec, "tok")
    assert search is not None
    runner._OOM_BOUNDS["tok"] = {("32", False): 64}
    try:
        proposals = [search.suggest(f"t{i}") for i in range(30)]
        for i in range(30):
            search.on_trial_complete(f"t{i}", {"throughput/samples_per_s": 1.0})
        assert all(isinstance(p, dict) for p in proposals)
        fp32 = [p["batch_size"] for p in proposals if p["precision"] == "32"]
        bf16 = [p["batch_size"] for p in proposals if p["precision"] == "bf16-mixed"]
        assert fp32 and max(fp32) < 64  # bounded for fp32 ...
        assert bf16 and max(bf16) >= 64  # ... and only for fp32
    finally:
        runner._OOM_BOUNDS.pop("tok", None)


def test_search_ends_when_nothing_feasible_is_left() -> None:
    spec = parse_spec(SPEC.replace('["32", "bf16-mixed"]', '["32"]'))
    search = runner._searcher(spec, "tok2")
    assert search is not None
    runner._OOM_BOUNDS["tok2"] = {("32", False): 16}  # even the smallest batch ran out of memory
    try:
        assert search.suggest("t0") == search.FINISHED
    finally:
        runner._OOM_BOUNDS.pop("tok2", None)
