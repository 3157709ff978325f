"""The sweep's trials as rows (sweeps/results/outcome.py): the throughput every sentence says its ratios in."""

from __future__ import annotations

from sweeps.results.outcome import TrialRow, speed_key
from sweeps.spec import parse_spec
from trainables import contract

SAMPLES, TOKENS = contract.throughput_key("samples"), contract.throughput_key("tokens")
SPEC = """
name: speed
trainable: {name: gpt-lm}
space: {batch_size: {type: categorical, choices: [4, 8]}}
budget: {num_trials: 2, num_steps: 20}
"""


def _row(n: int, **metrics: float) -> TrialRow:
    return TrialRow(f"t{n}", n, {"batch_size": 4 * n}, f"r{n}", "ok", "", "", dict(metrics))


def test_the_objective_first_then_samples_then_tokens_measured_above_zero_by_every_row_or_by_one() -> None:
    by_loss = parse_spec(SPEC + "objective: {metric: loss/val, mode: min}\n")
    both = [_row(1, **{SAMPLES: 10.0, TOKENS: 640.0}), _row(2, **{SAMPLES: 20.0, TOKENS: 1280.0})]
    assert speed_key(by_loss, both) == SAMPLES  # a loss objective is no throughput: samples/s comes first
    by_tokens = parse_spec(SPEC + f"objective: {{metric: {TOKENS}, mode: max}}\n")
    assert speed_key(by_tokens, both) == TOKENS  # the objective, when it is one
    one_zero = [_row(1, **{SAMPLES: 0.0, TOKENS: 640.0}), _row(2, **{SAMPLES: 20.0, TOKENS: 1280.0})]
    assert speed_key(by_loss, one_zero) == TOKENS  # a 0 is no measured throughput to divide by
    assert speed_key(by_loss, one_zero, any) == SAMPLES  # one row measured it: enough where `any` is asked
    assert speed_key(by_loss, [_row(1, **{SAMPLES: 5.0}), _row(2, **{TOKENS: 9.0})]) is None
    assert speed_key(by_loss, [_row(1, **{"loss/val": 1.0})], any) is None
