"""The build and the data loader on their own (`trainables/build.py`, `trainables/loader.py`).

Each component of the loop is pinned inside the loop by tests/loop/test_loop_spine.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from trainables.contract import TrialConfig
from trainables.loop_errors import WorkloadError

CPU = torch.device("cpu")




def _cfg(**kw: Any) -> TrialConfig:
    base: dict[str, Any] = dict(workload="mlp-tabular", workload_params={"num_train_rows": 256, "num_val_rows": 64},
                                batch_size=16, num_steps=10, num_warmup_steps=3, telemetry_period_s=0)
    return TrialConfig(**(base | kw))


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


def test_a_fused_optimizer_of_the_users_is_refused_where_cpu_offload_steps_the_shards_in_host_memory() -> None:
    from trainables.build import make_optimizer
    from trainables.workloads.base import Workload

    model = torch.nn.Linear(4, 2)
    for fused in (True, False):
        wl = Workload(model=model, train_dataset=[], val_dataset=[],
                      optimizer_fn=lambda m, lr, fused=fused: torch.optim.AdamW(m.parameters(), lr=lr, fused=fused))
        offloaded = _cfg(strategy="fsdp", cpu_offload=True)
        if fused:  # a CUDA device object is enough: the refusal comes before any step
            with pytest.raises(WorkloadError, match="fused AdamW.*cpu_offload true.*fused=False, or set cpu_offload false"):
                make_optimizer(wl, model, offloaded, torch.device("cuda"))
        else:
            assert isinstance(make_optimizer(wl, model, offloaded, torch.device("cuda")), torch.optim.AdamW)
        assert isinstance(make_optimizer(wl, model, _cfg(), torch.device("cuda")), torch.optim.AdamW)  # no offload
        assert isinstance(make_optimizer(wl, model, offloaded, CPU), torch.optim.AdamW)  # nothing offloaded on a CPU
