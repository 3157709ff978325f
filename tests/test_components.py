"""Each of the loop's components on its own, in one process, without a loop around it: the trial's length
(`length.py`), the measured window (`window.py`), the checkpointer (`checkpoint.py`), the evaluator
(`evaluate.py`), the data loader (`loader.py`) and the build (`build.py`); and two of the service's:
the circuit breaker's streak (`sweeps.service.breaker`) and the sweep's saved state
(`sweeps.service.saved_state`). Their behaviour inside the loop is pinned by tests/test_loop_spine.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from trainables import contract
from trainables.contract import TrialConfig
from trainables.loop_errors import WorkloadError

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


def test_the_window_counts_only_its_own_steps_and_reports_them() -> None:
    from trainables.instruments import Instruments
    from trainables.window import MeasuredWindow

    win = MeasuredWindow(CPU, Instruments(), "samples", world_size=1, small_batches_per_step=1)
    assert not win.measuring
    win.start(sub_every=1, report_every=2, warm_steps_s=0.3)
    for _ in range(4):
        win.count(16, 0, torch.tensor(0.5), micros=1)
        win.step_done()
    assert win.steps == 4 and win.report_due()
    final = win.report(4, final=True)  # the window's part: the loop adds validation and marks it final
    assert final[contract.STEPS] == 4 and final[contract.WORLD_SIZE] == 1 and final[contract.WINDOW_S] > 0
    assert final["throughput/samples_per_s"] > 0 and final[contract.LOSS_TRAIN] == pytest.approx(0.5)
    assert "throughput/samples_per_s_cv_pct" in final and win.warm_steps_s == 0.3


def test_a_checkpoint_round_trips_model_optimizer_and_schedule(tmp_path: Path) -> None:
    from trainables.checkpoint import Checkpointer, Saved, save_state

    def saved(seed: int) -> Saved:
        torch.manual_seed(seed)
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()
        return Saved(model, optimizer, None, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0))

    first = saved(0)
    save_state(tmp_path, first, measured=7)
    again = Checkpointer(every=5, resume_from=str(tmp_path), device=CPU, rank=0)
    assert again.done_before == 7 and again.due(10) and not again.due(7)
    other = saved(1)
    again.restore_into(other)
    assert torch.equal(other.model.weight, first.model.weight)
    assert other.optimizer.state_dict()["state"][0]["step"] == first.optimizer.state_dict()["state"][0]["step"]
    assert Checkpointer(every=0, resume_from=None, device=CPU, rank=0).done_before == 0


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


def test_the_build_and_the_loader_give_what_a_trial_trains_with(tmp_path: Path) -> None:
    from trainables.build import build
    from trainables.loader import close_loader, make_loader, stream

    t = build(_cfg(data_dir=str(tmp_path), precision="bf16-mixed"), CPU)
    assert t.world == 1 and t.m.ddp is None and t.m.forward_model is t.m.model and t.inst.comm is None
    assert t.m.flops[1] == "counted" and t.m.flops[0] and t.facts.build_s > 0
    loader, sampler = make_loader(t.m.wl, t.cfg, t.pin, train=True, rank=0, world=1)
    batches = stream(loader, sampler, needed=lambda: 100)
    seen = [next(batches) for _ in range(len(loader) + 2)]  # past one epoch: the next one starts
    assert all(b[0].shape[0] == 16 for b in seen)
    close_loader(loader, batches)
    with pytest.raises(WorkloadError, match="fewer than batch_size=10000: lower batch_size"):
        make_loader(t.m.wl, _cfg(batch_size=10_000), t.pin, train=True, rank=0, world=1)


def test_the_breakers_streak_counts_the_same_failure_in_a_row() -> None:
    from sweeps.service.breaker import FailureStreak

    streak = FailureStreak(limit=3)
    assert streak.add("error", "rank 0: ImportError: no module x") == ""
    assert streak.add("error", "rank 1: ImportError: no module x") == ""  # another rank said it: the same
    assert streak.add("ok", "") == ""  # a success breaks the streak
    for _ in range(2):
        assert streak.add("crash", "gloo [127.0.0.1]:4000 Connection reset") == ""
    assert streak.add("crash", "gloo [127.0.0.1]:4111 Connection reset").startswith("3 trials in a row failed the same way")
    assert FailureStreak(limit=0).add("error", "x") == ""  # 0: never


def test_the_saved_state_round_trips_and_a_second_holder_of_the_lock_is_refused(tmp_path: Path) -> None:
    from sweeps.service.saved_state import STATE_FILE, SweepLocked, SweepState, same_spec, sweep_lock
    from sweeps.spec import parse_spec

    text = f"name: s\ntrainable: {{name: mlp-tabular}}\nbudget: {{num_trials: 1, num_steps: 2}}\nstorage_path: {tmp_path}\n"
    state = SweepState(text, "tok", "run-1", "sqlite:///x")
    state.write(tmp_path / "s")
    assert SweepState.read(tmp_path / "s") == state and (tmp_path / "s" / STATE_FILE).exists()
    spec = parse_spec(text)
    assert same_spec(text, spec) and same_spec("# a comment\n" + text, spec)
    assert not same_spec(text.replace("num_steps: 2", "num_steps: 3"), spec) and not same_spec("name: [", spec)
    with sweep_lock(spec):
        with pytest.raises(SweepLocked, match=r"sweep s is already running: pid \d+ on host "):
            with sweep_lock(spec):
                pass
    with sweep_lock(spec):  # released when its holder left
        pass
