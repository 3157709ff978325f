"""The trial's length on its own (`trainables/length.py`): how many steps the window plans and runs.

Each component of the loop is pinned inside the loop by tests/loop/test_loop_spine.py."""

from __future__ import annotations

from typing import Any

import torch

from trainables.contract import TrialConfig

CPU = torch.device("cpu")




def _cfg(**kw: Any) -> TrialConfig:
    base: dict[str, Any] = dict(workload="mlp-tabular", workload_params={"num_train_rows": 256, "num_val_rows": 64},
                                batch_size=16, num_steps=10, num_warmup_steps=3, telemetry_period_s=0)
    return TrialConfig(**(base | kw))


def test_the_length_plans_the_window_from_warm_up_and_runs_on_to_its_floor() -> None:
    from trainables.length import TrialLength

    length = TrialLength(_cfg(num_steps=10, min_window_s=2.0), world=1)
    assert length.last_step() == 13 and length.batches_needed() == 13
    length.plan(None, warm_step_s=0.1)  # 2 s at 0.1 s a step: 20 measured steps, not 10
    assert length.planned == 20 and length.horizon == 20 and length.last_step() == 23
    assert length.extend_due(20) and length.extend(window_s=1.5, measured=20)  # ran faster than planned: on
    assert length.planned > 20 and length.extended == 1
    assert not length.extend(window_s=2.1, measured=length.planned)  # the floor is met
    capped = TrialLength(_cfg(num_steps=1000, max_window_s=1.0), world=1)
    capped.plan(None, warm_step_s=0.1)
    assert capped.planned == 10  # the box holds 10 steps of warm-up's speed
    assert capped.cap_due(5, sub_windows=3, marked=True)
    capped.cap(window_s=1.05, measured=5)  # past the box at step 5: the window ends there
    assert capped.planned == 5 and not capped.more_after(5)
