"""The checkpointer on its own (`trainables/checkpoint.py`).

Each component of the loop is pinned inside the loop by tests/loop/test_loop_spine.py."""

from __future__ import annotations

from pathlib import Path

import torch

CPU = torch.device("cpu")




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
