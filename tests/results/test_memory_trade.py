"""The answer in memory (sweeps/results/memory_trade.py): the best's peak beside its prediction, and the trade."""

from __future__ import annotations

from sweeps.results.memory_trade import memory_sentence
from sweeps.results.outcome import Probed, SweepOutcome, TrialRow, probed_from, probed_tag
from sweeps.results.report import answer, configuration
from sweeps.spec import parse_spec
from trainables import contract

SPEC = """
name: memory
trainable: {name: gpt-lm}
space:
  strategy: {type: categorical, choices: [ddp, fsdp]}
  activation_checkpointing: {type: categorical, choices: [none, full]}
  batch_size: 8
search: {algorithm: grid}
budget: {num_trials: 4, num_steps: 20}
"""


def _row(n: int, strategy: str, ac: str, tput: float, peak: float, predicted: float | None = None,
         key: str = contract.MEM_PEAK_RSS_GIB) -> TrialRow:
    metrics = {contract.throughput_key("tokens"): tput, key: peak,
               **({contract.MEM_PREDICTED_GIB: predicted} if predicted is not None else {})}
    return TrialRow(f"t{n}", n, {"strategy": strategy, "activation_checkpointing": ac, "batch_size": 8}, f"r{n}",
                    "ok", "", "", metrics)


def test_the_best_and_the_leanest_with_what_the_leanest_saves_and_costs() -> None:
    spec = parse_spec(SPEC)
    rows = [_row(1, "ddp", "none", 1000.0, 0.80, 0.30), _row(2, "fsdp", "none", 900.0, 0.72, 0.25),
            _row(3, "ddp", "full", 800.0, 0.70, 0.14), _row(4, "fsdp", "full", 700.0, 0.60, 0.10)]
    outcome = SweepOutcome(spec, "p", "u", rows, 1.0)
    said = memory_sentence(outcome, lambda t: configuration(outcome, t))
    assert said == ("Memory (resident set, libraries and data included): the best, trial 1, peaks at 0.80 GiB per "
                    "rank (predicted 0.30); the least, trial 4 (strategy fsdp, activation_checkpointing full), 0.60 "
                    "GiB per rank (predicted 0.10): 25% less, at 0.70x the best's throughput/tokens_per_s")
    assert said in answer(outcome)


def test_a_gpu_sweep_says_the_allocator_peak_and_a_best_that_is_also_the_leanest() -> None:
    spec = parse_spec(SPEC)
    key = contract.MEM_MAX_ALLOCATED_GIB
    rows = [_row(1, "fsdp", "full", 1000.0, 30.0, 29.0, key), _row(2, "ddp", "none", 900.0, 70.0, None, key)]
    said = memory_sentence(SweepOutcome(spec, "p", "u", rows, 1.0), str)
    assert said.startswith("Memory (allocator peak): the best, trial 1, peaks at 30.00 GiB per rank (predicted 29.00), "
                           "the least of the sweep (the most: trial 2")
    assert said.endswith("70.00 GiB per rank)")


def test_nothing_said_without_a_memory_setting_searched_or_a_measured_peak() -> None:
    rows = [_row(1, "ddp", "none", 1000.0, 0.8), _row(2, "ddp", "none", 900.0, 0.7)]
    fixed = parse_spec(SPEC.replace("strategy: {type: categorical, choices: [ddp, fsdp]}", "strategy: ddp").replace(
        "activation_checkpointing: {type: categorical, choices: [none, full]}", "lr: {type: categorical, choices: [0.001, 0.01]}"
    ).replace("num_trials: 4", "num_trials: 2"))
    assert memory_sentence(SweepOutcome(fixed, "p", "u", rows, 1.0), str) == ""
    unmeasured = [TrialRow("t1", 1, {}, "r1", "ok", "", "", {contract.throughput_key("tokens"): 1.0})] * 2
    assert memory_sentence(SweepOutcome(parse_spec(SPEC), "p", "u", unmeasured, 1.0), str) == ""


FRONTIER = SPEC.replace("  batch_size: 8\n", "  batch_size: {type: categorical, choices: [8, 16]}\n").replace(
    "strategy: {type: categorical, choices: [ddp, fsdp]}", "strategy: ddp").replace(
    "choices: [none, full]", "choices: [none, selective]")


def _at(n: int, batch: int, ac: str, tput: float | None, status: str = "ok") -> TrialRow:
    metrics = {contract.throughput_key("tokens"): tput} if tput is not None else {}
    return TrialRow(f"t{n}", n, {"strategy": "ddp", "activation_checkpointing": ac, "batch_size": batch}, f"r{n}",
                    status, "", "", metrics)


def test_a_best_at_its_memory_frontier_says_which_setting_fits_the_larger_batch_and_at_what_cost() -> None:
    spec = parse_spec(FRONTIER)
    rows = [_at(1, 8, "none", 1000.0), _at(2, 16, "none", None, "oom"), _at(3, 8, "selective", 880.0),
            _at(4, 16, "selective", 950.0)]
    said = memory_sentence(SweepOutcome(spec, "p", "u", rows, 1.0), str)
    assert said == ("Memory-bound: batch_size 8 is the largest that fit with activation_checkpointing none (16 ran out "
                    "of memory: trial 2); 16 fit with activation_checkpointing selective (trial 4), which costs 12% of "
                    "the throughput at batch_size 8 (trial 3 vs trial 1), and ran at 0.95x the best's "
                    "throughput/tokens_per_s"), said
    # only what was measured: no leaner trial at 16, then no OOM above the best, then no trade searched
    assert memory_sentence(SweepOutcome(spec, "p", "u", rows[:3], 1.0), str).endswith(
        "(16 ran out of memory: trial 2); no trial ran it with another memory setting")
    assert memory_sentence(SweepOutcome(spec, "p", "u", [rows[0], rows[2], rows[3]], 1.0), str) == ""
    assert memory_sentence(SweepOutcome(spec, "p", "u", [rows[0], _at(2, 16, "selective", None, "oom")], 1.0), str) == ""


def test_a_best_at_the_frontier_the_memory_probe_found_says_so_from_the_probe() -> None:
    """With the probe on, a batch that does not fit never runs as a trial: the frontier is the probe's."""
    spec = parse_spec(FRONTIER)
    none = {"precision": "32", "strategy": "ddp", "activation_checkpointing": "none", "num_workers": 2,
            "params.hidden": 64}  # the probe names a model param as the space does; a trial logs workload.hidden
    probed = [Probed(none, 8, 16), Probed({**none, "activation_checkpointing": "selective"}, 16, None)]
    rows = [_at(1, 8, "none", 1000.0), _at(3, 8, "selective", 880.0), _at(4, 16, "selective", 950.0)]
    for r in rows:  # as every trial logs them
        r.params |= {"precision": "32", "num_workers": 2, "workload.hidden": "64"}  # MLflow gives text back
    said = memory_sentence(SweepOutcome(spec, "p", "u", rows, 1.0, probed=probed), str)
    assert said == ("Memory-bound: batch_size 8 is the largest that fit with activation_checkpointing none (16 ran out "
                    "of memory in the memory probe); 16 fit with activation_checkpointing selective (trial 4), which "
                    "costs 12% of the throughput at batch_size 8 (trial 3 vs trial 1), and ran at 0.95x the best's "
                    "throughput/tokens_per_s"), said
    # no trial at 16 with another setting: the probe's own finding, said as the probe's
    assert memory_sentence(SweepOutcome(spec, "p", "u", rows[:2], 1.0, probed=probed), str).endswith(
        "(16 ran out of memory in the memory probe); 16 fits with activation_checkpointing selective (the memory "
        "probe; no trial ran it)")
    # the probe's frontier of other settings (another precision), or a best below its frontier: nothing to say
    for other in ({"precision": "bf16-mixed"}, {"params.hidden": 32}):
        not_theirs = [Probed({**none, **other}, 8, 16), Probed({**none, **other, "activation_checkpointing": "selective"}, 16, None)]
        assert memory_sentence(SweepOutcome(spec, "p", "u", rows[:2], 1.0, probed=not_theirs), str) == "", other
    assert memory_sentence(SweepOutcome(spec, "p", "u", rows[:2], 1.0, probed=[Probed(none, 16, 32)]), str) == ""
    # read back from the parent run's tag, as `sweeps report` does
    assert probed_from(probed_tag(probed)) == probed and probed_from({}) == []
    assert probed_from({"sweep.probe_frontier": "[{cut short"}) == []
