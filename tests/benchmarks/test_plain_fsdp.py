"""The plain FSDP2 reference loop (benchmarks/plain_fsdp.py): a real 2-rank gloo run, sharded and checkpointed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.bench_module import REPO


@pytest.mark.parametrize("ac", ["full"])
def test_two_gloo_ranks_train_sharded_and_write_the_result(tmp_path: Path, ac: str) -> None:
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(REPO / "benchmarks" / "plain_fsdp.py"), "--workload", "gpt-lm", "--params",
           json.dumps({"n_layer": 2, "n_embd": 32, "seq_len": 32}), "--batch-size", "4", "--num-steps", "4",
           "--num-warmup-steps", "2", "--precision", "bf16-mixed", "--strategy", "fsdp_no_reshard",
           "--activation-checkpointing", ac, "--data-dir", str(tmp_path / "data"), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert (r["world_size"], r["backend"], r["unit"], r["strategy"], r["activation_checkpointing"]) == \
        (2, "gloo", "tokens", "fsdp_no_reshard", ac)
    assert r["sharded_blocks"] == 2  # fsdp() ran: each block and the root sharded (a DDP run has no such key)
    assert r["items"] == 2 * 4 * 4 * 32 and r["throughput"] > 0  # 2 ranks x 4 measured steps x 4 sequences x 32


def test_its_blocks_are_checkpointed_then_sharded_without_autocast() -> None:
    """Without a process group: the wrapper's choices, on one rank's mesh of one (gloo, world 1)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from tests.helpers.bench_module import load
    from trainables import registry
    from trainables.workloads.base import BuildContext

    pf, pd = load("plain_fsdp"), load("plain_ddp")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    try:
        wl = registry.build("gpt-lm", {"n_layer": 2, "n_embd": 32, "seq_len": 32}, BuildContext("/tmp/unused", 0))
        args = pf.parse(["--out", "x", "--activation-checkpointing", "full", "--precision", "bf16-mixed"])
        model, p = pf.fsdp(wl.model, wl, args, pd.plan(False, 0, "bf16-mixed"), 1)
        blocks = [m for m in model.modules() if isinstance(m, FSDPModule)]
        assert len(blocks) == 3 and model in blocks  # each of the 2 blocks, and the root
        assert all("CheckpointWrapper" in type(b).__name__ for b in wl.model.blocks)
        assert p.autocast_dtype is None  # the policy casts to bf16, not autocast
        assert all(type(x).__name__ == "DTensor" for x in model.parameters())
    finally:
        dist.destroy_process_group()
