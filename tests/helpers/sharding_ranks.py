"""Two gloo ranks (torch.multiprocessing) that run every sharding scenario of tests/loop/test_sharding.py once,
in one process group, and write what each found to `<out>/rank<r>.json` (one start-up for the whole file)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainables import contract
from trainables.checkpoint import Saved, apply_state, read_state, save_state
from trainables.contract import TrialConfig
from trainables.launch import leave
from trainables.loop import train
from trainables.reporting import ListReporter
from trainables.sharding import BLOCKS_TAG, Wrapping, find_blocks, shard
from trainables.workloads.declared import Preset
from trainables.workloads.gpt_lm import GPT, lm_loss

CPU = torch.device("cpu")
SMALL = Preset(2, 4, 64, 32, 256, 0, 0)  # the parity and round-trip model: 2 blocks
# where memory shows on a CPU: 4.3M parameters (69 MB of model states under DDP with AdamW), and a micro-batch
# whose activations (~0.4 GB without checkpointing) dwarf a block's input (~8 MB)
MEMORY_GPT = {"preset": "tiny", "n_layer": 4, "n_embd": 384, "seq_len": 256, "num_val_tokens": 4096}


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient (a sharded one gathered), by name."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        if g is None:
            continue
        out[name.replace("_checkpoint_wrapped_module.", "")] = g.full_tensor() if hasattr(g, "full_tensor") else g
    return out


def _ratio(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """The worst |got - ref| / |ref| over the parameters (0: the same gradients)."""
    assert set(got) == set(ref), (sorted(got), sorted(ref))
    return max(float((got[k] - ref[k]).norm() / ref[k].norm()) for k in ref)


def _sharded_grads(base: torch.nn.Module, ac: str, x: torch.Tensor, y: torch.Tensor, world: int,
                   force_sum: bool = False, strategy: str = "fsdp") -> dict[str, torch.Tensor]:
    model = copy.deepcopy(base)
    layout = shard(model, find_blocks(model), Wrapping(strategy, ac, False, "32"), CPU, world)
    # what the memory prediction divides the model states by (the build hands it on)
    assert layout.shard_over == (int(os.environ["LOCAL_WORLD_SIZE"]) if strategy == "hsdp" else world), (strategy, layout)
    if force_sum:
        # the #162338 trap, injected: reduce-scatter sums and nothing divides (gloo has no PREMUL_SUM)
        model.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]
        model.set_gradient_divide_factor(1.0)  # type: ignore[operator]
    lm_loss(model(x), y).backward()
    return _grads(model)


def parity(rank: int, world: int) -> dict[str, Any]:
    """Gradients on the same global batch: one process vs 2 FSDP ranks (each AC mode; summed instead of averaged)."""
    torch.manual_seed(0)
    base = GPT(SMALL)
    data = torch.randint(0, SMALL.vocab_size, (8, SMALL.seq_len + 1), generator=torch.Generator().manual_seed(1))
    x, y = data[:, :-1], data[:, 1:]
    reference = copy.deepcopy(base)
    lm_loss(reference(x), y).backward()  # one process, the whole global batch
    ref = _grads(reference)
    mine = slice(rank * 4, rank * 4 + 4)  # this rank's half
    out = {f"fsdp_{ac}": _ratio(_sharded_grads(base, ac, x[mine], y[mine], world), ref)
           for ac in ("none", "selective", "full")}
    out["fsdp_summed"] = _ratio(_sharded_grads(base, "none", x[mine], y[mine], world, force_sum=True), ref)
    # two micro-batches a rank, each reduce-scattered as the loop does (gradients accumulate in the shards)
    model = copy.deepcopy(base)
    shard(model, find_blocks(model), Wrapping("fsdp", "none", False, "32"), CPU, world)
    for half in (slice(mine.start, mine.start + 2), slice(mine.start + 2, mine.stop)):
        (lm_loss(model(x[half]), y[half]) / 2).backward()
    out["fsdp_accumulated"] = _ratio(_grads(model), ref)
    # hybrid: one node of 2 ranks (sharded over both), then 2 nodes of 1 rank each (replicated, as torchrun
    # --nnodes 2 would set LOCAL_WORLD_SIZE), checkpointed in full
    for nodes, per_node in ((1, 2), (2, 1)):
        os.environ["LOCAL_WORLD_SIZE"] = str(per_node)
        try:
            out[f"hsdp_{nodes}x{per_node}"] = _ratio(_sharded_grads(base, "full", x[mine], y[mine], world,
                                                                    strategy="hsdp"), ref)
        finally:
            del os.environ["LOCAL_WORLD_SIZE"]
    return out


def round_trip(rank: int, world: int, tmp: Path) -> dict[str, Any]:
    """A DCP save and load of an FSDP2 model and its AdamW state: equal outputs, and an equal next step."""
    data = torch.randint(0, SMALL.vocab_size, (4, SMALL.seq_len + 1), generator=torch.Generator().manual_seed(2 + rank))
    x, y = data[:, :-1], data[:, 1:]

    def built(seed: int) -> Saved:
        torch.manual_seed(seed)
        model = GPT(SMALL)
        shard(model, find_blocks(model), Wrapping("fsdp", "none", False, "32"), CPU, world)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        lm_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        return Saved(model, opt, None, None, sharded=True)

    first = built(0)
    save_state(tmp, first, measured=7, rank=rank)
    dist.barrier()
    other = built(1)
    state = read_state(str(tmp), CPU)
    apply_state(state, other)
    with torch.no_grad():
        same_out = float((first.model(x) - other.model(x)).abs().max())
    for s in (first, other):  # the optimizer's moments came back too: the next step moves both alike
        lm_loss(s.model(x), y).backward()
        s.optimizer.step()
    with torch.no_grad():
        same_step = float((first.model(x) - other.model(x)).abs().max())
    return {"outputs": same_out, "after_a_step": same_step, "measured_steps": state["measured_steps"]}


def _cfg(data_dir: str, **kw: Any) -> TrialConfig:
    base: dict[str, Any] = dict(workload="gpt-lm", workload_params={"seq_len": 32, "num_val_tokens": 2048}, batch_size=8,
                                precision="32", lr=3e-3, num_steps=6, num_warmup_steps=2, report_interval_s=1e-6,
                                data_dir=data_dir, telemetry_period_s=0.5, trace_steps=0, grad_noise_scale=False)
    base.update(kw)
    return TrialConfig(**base)


class _Kept(ListReporter):
    """Every rank's checkpoint files copied into one folder, as Ray Train puts them together."""

    def __init__(self, into: Path) -> None:
        super().__init__()
        self.into = into

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        if checkpoint_dir is not None:
            shutil.copytree(checkpoint_dir, self.into, dirs_exist_ok=True)
        super().report(metrics, checkpoint_dir)


def loops(rank: int, world: int, data_dir: str, tmp: Path) -> dict[str, Any]:
    """The loop itself: each AC mode trains under FSDP (bf16 too); per-rank peak memory by strategy and AC;
    a checkpointed sharded trial resumed."""
    out: dict[str, Any] = {}
    for ac in ("none", "selective", "full"):
        rep = ListReporter()
        final = train(_cfg(data_dir, strategy="fsdp", activation_checkpointing=ac), rep, CPU)
        out[f"trains_{ac}"] = [rep.reports[0][contract.LOSS_TRAIN], final[contract.LOSS_TRAIN],
                               final[contract.LOSS_VAL]]
        out[f"tags_{ac}"] = {k: v for k, v in final.items() if k.startswith("memory/") and isinstance(v, str)}
    final = train(_cfg(data_dir, strategy="fsdp_no_reshard", precision="bf16-mixed", grad_accum_steps=2),
                  ListReporter(), CPU)
    out["bf16_no_reshard"] = [final[contract.LOSS_VAL], final.get("precision/autocast_dtype")]
    for strategy, ac in (("ddp", "none"), ("fsdp", "none"), ("ddp", "selective"), ("ddp", "full")):
        final = train(_cfg(data_dir, workload_params=MEMORY_GPT, strategy=strategy, activation_checkpointing=ac,
                           batch_size=6, num_steps=2, num_warmup_steps=1, lr=1e-4), ListReporter(), CPU)
        out[f"rss_{strategy}_{ac}"] = final[contract.MEM_PEAK_RSS_GIB]
        out[f"predicted_{strategy}_{ac}"] = [final.get(contract.MEM_PREDICTED_GIB),
                                             final.get(contract.MEM_PREDICTED_ACTIVATIONS_GIB)]
    final = train(_cfg(data_dir, workload="examples.hf_causal_lm:build", workload_params={"num_val_seqs": 32},
                       strategy="fsdp",
                       activation_checkpointing="selective"), ListReporter(), CPU)
    out["hf"] = [final[contract.LOSS_VAL], final.get(BLOCKS_TAG, "")]  # tags: rank 0's report
    kept = tmp / "kept"
    first = train(_cfg(data_dir, strategy="fsdp", checkpoint_every_steps=3), _Kept(kept), CPU)
    dist.barrier()
    again = train(_cfg(data_dir, strategy="fsdp"), ListReporter(), CPU, resume_from=str(kept))
    out["resumed"] = [again.get(contract.RESTORED_FROM), again[contract.STEPS], first[contract.STEPS]]
    return out


def run(rank: int, world: int, port: int, out: str, data_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        tmp = Path(out) / "shared"  # one folder both ranks see (one machine)
        found: dict[str, Any] = {"parity": parity(rank, world)}
        found["round_trip"] = round_trip(rank, world, tmp / "dcp")
        found["loops"] = loops(rank, world, data_dir, tmp)
        Path(out, f"rank{rank}.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()
    # a gloo group's threads outlive it and can abort the interpreter's finalization (SIGABRT, "terminate called
    # without an active exception": the clean clone of c0e3929, every test here errored)
    leave(0)


if __name__ == "__main__":  # by hand: python -m tests.helpers.sharding_ranks OUT DATA_DIR
    import torch.multiprocessing as mp

    mp.spawn(run, args=(2, 29531, sys.argv[1], sys.argv[2]), nprocs=2)
    print(json.dumps(json.loads(Path(sys.argv[1], "rank0.json").read_text()), indent=1))
