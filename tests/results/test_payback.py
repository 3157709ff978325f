"""When compile pays for itself (sweeps/results/payback.py): its extra seconds against its saving per step."""

from __future__ import annotations

from sweeps.results.outcome import SweepOutcome, TrialRow
from sweeps.results.payback import payback_sentence
from sweeps.results.report import answer
from sweeps.spec import parse_spec
from trainables import contract

SPEC = """
name: compile
trainable: {name: gpt-lm}
space:
  compile: {type: categorical, choices: [false, true]}
  batch_size: {type: categorical, choices: [8, 16]}
search: {algorithm: grid}
budget: {num_trials: 4, num_steps: 20}
"""


def _row(n: int, compiled: bool, batch: int, tput: float, step_ms: float, warmup_s: float) -> TrialRow:
    metrics = {contract.throughput_key("tokens"): tput, contract.STEP_TIME_MS: step_ms, contract.WARMUP_S: warmup_s}
    return TrialRow(f"t{n}", n, {"compile": compiled, "batch_size": batch}, f"r{n}", "ok", "", "", metrics)


def test_compile_says_its_seconds_and_the_step_it_pays_back_at() -> None:
    rows = [_row(1, False, 16, 1000.0, 100.0, 5.0), _row(2, True, 16, 1130.0, 88.0, 46.0),
            _row(3, False, 8, 900.0, 60.0, 4.0), _row(4, True, 8, 800.0, 70.0, 40.0)]
    outcome = SweepOutcome(parse_spec(SPEC), "p", "u", rows, 1.0)
    said = payback_sentence(outcome)
    assert said == ("Compile: trial 2 spent 41 s more before its measured window than trial 1 (compile off) and takes "
                    "12.0 ms less per step (88.0 vs 100.0 ms): it pays for itself after 3,417 steps (41 s / 12.0 ms)")
    assert said in answer(outcome)
    # a compiled trial no faster per step never pays back; with no twin, or compile not searched: nothing
    slow = SweepOutcome(parse_spec(SPEC), "p", "u", rows[2:], 1.0)
    assert payback_sentence(slow).endswith("is no faster per step (70.0 vs 60.0 ms): it never pays back here")
    assert payback_sentence(SweepOutcome(parse_spec(SPEC), "p", "u", [rows[0], rows[3]], 1.0)) == ""
    fixed = parse_spec(SPEC.replace("{type: categorical, choices: [false, true]}", "false").replace("4,", "2,"))
    assert payback_sentence(SweepOutcome(fixed, "p", "u", rows, 1.0)) == ""


def test_a_compiled_trial_that_compiled_no_graph_is_said_to_understate_a_first_compile() -> None:
    rows = [_row(1, False, 16, 1000.0, 100.0, 5.0), _row(2, True, 16, 1130.0, 88.0, 6.0)]
    warm = {contract.COMPILE_GRAPHS: 0, contract.COMPILE_CACHE_MISSES: 0, contract.COMPILE_CACHE_HITS: 0}  # a warm
    # rank's second compiled trial: dynamo captured nothing
    rows[1].metrics |= warm
    said = payback_sentence(SweepOutcome(parse_spec(SPEC), "p", "u", rows, 1.0))
    assert said.startswith("Compile: trial 2 spent 1 s more before its measured window than trial 1 (compile off; "
                           "trial 2 compiled no graph: it ran code an earlier trial of its warm process compiled, so a "
                           "first compile adds more than this) and takes 12.0 ms less per step"), said
    rows[1].metrics |= {contract.COMPILE_GRAPHS: 2, contract.COMPILE_CACHE_HITS: 4}  # captured, all from the cache
    assert "it took its graphs from the compile cache, so" in payback_sentence(SweepOutcome(parse_spec(SPEC), "p", "u", rows, 1.0))
    rows[1].metrics |= {contract.COMPILE_CACHE_HITS: 0}  # the cache off: inductor counts nothing, yet it compiled
    assert "(compile off) and takes" in payback_sentence(SweepOutcome(parse_spec(SPEC), "p", "u", rows, 1.0))
    rows[1].metrics |= {contract.COMPILE_CACHE_MISSES: 4}  # it compiled: its seconds hold that
    assert "(compile off) and takes" in payback_sentence(SweepOutcome(parse_spec(SPEC), "p", "u", rows, 1.0))
