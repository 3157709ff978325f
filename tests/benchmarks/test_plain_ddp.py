"""The plain DDP reference loop (benchmarks/plain_ddp.py): its CUDA branch with fakes, and one real CPU run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.helpers.bench_module import REPO, load

pd = load("plain_ddp")


def test_plan_cuda_and_cpu() -> None:
    gpu = pd.plan(True, 1, "bf16-mixed", pin_memory=True)
    assert (gpu.backend, gpu.device, gpu.pin_memory, gpu.non_blocking, gpu.fused_adamw, gpu.autocast_dtype) == \
        ("nccl", torch.device("cuda", 1), True, True, True, torch.bfloat16)
    cpu = pd.plan(False, 1, "32", pin_memory=True)  # pinning without CUDA would do nothing: off
    assert (cpu.backend, cpu.device, cpu.pin_memory, cpu.non_blocking, cpu.fused_adamw, cpu.autocast_dtype) == \
        ("gloo", torch.device("cpu"), False, False, False, None)


def test_cuda_device_is_set_before_nccl_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append(("init", backend, kw)))
    pd.init_distributed(pd.plan(True, 3))
    assert calls == [("set_device", torch.device("cuda", 3)), ("init", "nccl", {"device_id": torch.device("cuda", 3)})]


def test_collectives_use_the_plans_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL reduces CUDA tensors only: the window's tensors are made on the plan's device, and the
    barrier waits for the GPU and names it."""
    made, reduced, calls = [], [], []
    real_tensor = torch.tensor

    def tensor(data: Any, **kw: Any) -> torch.Tensor:
        made.append(kw.get("device"))
        return real_tensor(data, **{**kw, "device": "cpu"})  # no GPU here: the values still reduce

    monkeypatch.setattr(torch, "tensor", tensor)
    monkeypatch.setattr(dist, "all_reduce", lambda t, op: reduced.append(op))
    p = pd.plan(True, 1)
    assert pd.reduce_window(2.5, 640, p) == (2.5, 640)
    assert made == [torch.device("cuda", 1)] * 2
    assert reduced == [dist.ReduceOp.MAX, dist.ReduceOp.SUM]

    monkeypatch.setattr(torch.cuda, "synchronize", lambda d: calls.append(("synchronize", d)))
    monkeypatch.setattr(dist, "barrier", lambda **kw: calls.append(("barrier", kw)))
    pd.barrier(p)
    assert calls == [("synchronize", torch.device("cuda", 1)), ("barrier", {"device_ids": [1]})]


def test_main_plans_from_cuda_and_local_rank(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[Any] = []

    class Stop(Exception):
        pass

    def init(p: Any) -> None:
        seen.append(p)
        raise Stop

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(pd, "init_distributed", init)
    with pytest.raises(Stop):
        pd.main(["--out", str(tmp_path / "r.json"), "--precision", "bf16-mixed", "--pin-memory"])
    assert (seen[0].backend, seen[0].device, seen[0].non_blocking) == ("nccl", torch.device("cuda", 1), True)


def test_real_cpu_run_of_a_step_fn_workload(tmp_path: Path) -> None:
    """dict batches through the workload's own step_fn and optimizer_fn, bf16 autocast, one gloo rank."""
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           str(REPO / "benchmarks" / "plain_ddp.py"), "--workload", "examples.dict_batch_model:build",
           "--params", json.dumps({"num_rows": 512}), "--batch-size", "16", "--num-steps", "4",
           "--num-warmup-steps", "2", "--precision", "bf16-mixed", "--data-dir", str(tmp_path / "data"), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["backend"], result["device"], result["unit"], result["world_size"]) == ("gloo", "cpu", "samples", 1)
    assert result["items"] == 4 * 16 and result["throughput"] > 0 and result["precision"] == "bf16-mixed"
