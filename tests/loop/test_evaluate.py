"""The evaluator on its own (`trainables/evaluate.py`): its target and its own time.

Each component of the loop is pinned inside the loop by tests/loop/test_loop_spine.py."""

from __future__ import annotations

from typing import Any

import torch

from trainables import contract
from trainables.contract import TrialConfig

CPU = torch.device("cpu")




def _cfg(**kw: Any) -> TrialConfig:
    base: dict[str, Any] = dict(workload="mlp-tabular", workload_params={"num_train_rows": 256, "num_val_rows": 64},
                                batch_size=16, num_steps=10, num_warmup_steps=3, telemetry_period_s=0)
    return TrialConfig(**(base | kw))


def test_the_evaluator_stops_on_its_target_and_counts_its_own_time() -> None:
    from trainables.evaluate import Evaluator
    from trainables.telemetry import StepTimer

    losses = iter([0.9, 0.7, 0.4])
    evals = Evaluator(_cfg(eval_every_steps=5, target_metric="loss/val", target_max=0.5), StepTimer(CPU),
                      lambda: {"loss/val": next(losses)})
    evals.start_clock()
    assert [evals.due(s) for s in (4, 5, 10)] == [False, True, True]
    for step in (5, 10, 15):
        evals.run(step)
    assert evals.reached is not None and evals.reached[1] == 15 and evals.best == 0.4
    figures = evals.figures()
    assert figures[contract.EVALS] == 3 and figures[contract.STEPS_TO_TARGET] == 15
    assert figures[contract.TIME_TO_TARGET_S] >= 0 and figures[contract.TARGET_BEST] == 0.4
    assert evals.final_validation() == {"loss/val": 0.4}  # the evaluation that met it, not a new one
