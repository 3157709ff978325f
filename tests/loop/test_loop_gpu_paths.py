"""GPU code paths checked on CPU: compile wraps the DDP model; the report cadence is timed with a
device sync at the warm-up boundaries (asynchronous CUDA steps otherwise look too fast)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import trainables.loop
from trainables.contract import TrialConfig
from trainables.loop import train
from trainables.reporting import ListReporter
from trainables.telemetry import StepTimer

CFG = dict(workload="mlp-tabular", workload_params={"num_train_rows": 512, "num_val_rows": 64}, batch_size=16,
           precision="32", lr=1e-3, num_steps=3, num_warmup_steps=3)


def _rank(rank: int, port: int, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        seen: list[str] = []
        trainables.loop.torch.compile = lambda m, **kw: seen.append(type(m).__name__) or m  # type: ignore[assignment]
        train(TrialConfig(**CFG, compile=True, telemetry_period_s=0), ListReporter(), torch.device("cpu"))  # type: ignore[arg-type]
        out.put((rank, seen))
    finally:
        dist.destroy_process_group()


def test_compile_wraps_the_ddp_model_so_all_reduce_overlaps_backward() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert got == {0: ["DistributedDataParallel"], 1: ["DistributedDataParallel"]}


def test_warm_up_boundaries_are_timed_after_a_device_sync(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[bool] = []
    now = StepTimer.now
    monkeypatch.setattr(StepTimer, "now", lambda self, sync=False: calls.append(sync) or now(self, sync))
    train(TrialConfig(**CFG, data_dir=str(tmp_path)), ListReporter(), torch.device("cpu"))  # type: ignore[arg-type]
    assert calls == [True, True]  # step 1 (start of the timed warm-up) and the end of warm-up
    synced: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(str(device)))
    StepTimer(torch.device("cuda", 0)).now(sync=True)
    assert synced == ["cuda:0"]
