"""FSDP2 and activation checkpointing (trainables/sharding.py), correct before fast, on 2 gloo CPU ranks.

One pair of ranks (tests/helpers/sharding_ranks.py, spawned once for the file) runs every scenario; the tests
read what it found. The ranks run with glibc's mmap threshold fixed (`MALLOC_MMAP_THRESHOLD_`), so a freed tensor
leaves the resident set at once and the peak follows the live tensors, not the heap's reuse of freed pages."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from trainables.contract import TrialConfig
from trainables.loop_errors import UnsupportedError
from trainables.sharding import Wrapping, find_blocks, shard
from trainables.workloads.declared import GPT_PRESETS
from trainables.workloads.gpt_lm import GPT

CPU = torch.device("cpu")
# One process takes the whole file: the ranks' fixture is per module, and per process under xdist (each spawn ~70 s).
pytestmark = pytest.mark.xdist_group("sharding")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[dict[str, Any]]:
    """What rank 0 found (memory: the max over both ranks, as the loop combines it)."""
    import torch.multiprocessing as mp

    from tests.helpers.sharding_ranks import run

    out = tmp_path_factory.mktemp("sharding")
    before = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # the spawned ranks inherit it
    try:
        mp.spawn(run, args=(2, _free_port(), str(out), str(data_dir)), nprocs=2)
    finally:
        if before is None:
            del os.environ["MALLOC_MMAP_THRESHOLD_"]
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = before
    found = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert found[0]["loops"]["rss_ddp_none"] == found[1]["loops"]["rss_ddp_none"]  # the loop's max over ranks
    yield found[0]


def test_fsdp_gradients_equal_one_process_and_a_summed_gradient_fails(ranks: dict[str, Any]) -> None:
    """pytorch#162338: FSDP2 over gloo summing gradients instead of averaging them trains "fine" at a
    world-size-times learning rate; the same check that passes the real reduction fails the summed one."""
    p = ranks["parity"]
    for ac in ("none", "selective", "full"):  # AC equal to no AC, and to one process, within fp32 rounding
        assert p[f"fsdp_{ac}"] < 1e-5, (ac, p)
    assert p["fsdp_summed"] == pytest.approx(1.0, abs=1e-3)  # twice the gradient: off by all of it
    assert p["fsdp_accumulated"] < 1e-5, p  # 2 micro-batches a rank, each reduce-scattered: the same gradients
    # hybrid sharding, on one node of 2 ranks and on 2 nodes of 1 (replicated): the same gradients
    assert p["hsdp_1x2"] < 1e-5 and p["hsdp_2x1"] < 1e-5, p


def test_hsdp_needs_as_many_ranks_on_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainables.sharding import node_layout

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert node_layout(4) == (2, 2)
    with pytest.raises(UnsupportedError, match=r"strategy hsdp needs the same number of ranks on every node, and the "
                                               r"trial's 3 ranks run \[2\] per node"):
        node_layout(3)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert node_layout(2) == (1, 2)  # no launcher said: one node


def test_each_ac_mode_trains_under_fsdp_and_says_what_it_wrapped(ranks: dict[str, Any]) -> None:
    loops = ranks["loops"]
    first, last, val = loops["trains_none"]
    assert last < first - 0.5 and val < first - 0.5
    for ac in ("selective", "full"):  # the same losses: recomputation changes no number
        assert loops[f"trains_{ac}"] == pytest.approx(loops["trains_none"], rel=1e-5)
        assert loops[f"tags_{ac}"] == {"memory/blocks": "2 x _Block (blocks)", "memory/sharding": "fsdp over 2 rank(s)"}
    val, autocast = loops["bf16_no_reshard"]  # bf16 parameters through MixedPrecisionPolicy, never autocast
    assert val < first - 0.5 and autocast.startswith("none")
    val, blocks = loops["hf"]  # a Hugging Face causal LM shards with no glue
    assert val < 5 and blocks.endswith("(model.layers)"), blocks


def test_peak_memory_per_rank_fsdp_below_ddp_and_full_ac_below_none(ranks: dict[str, Any]) -> None:
    """Measured and predicted, in the same order: FSDP below DDP, full checkpointing below selective below none;
    the prediction's gaps (model states, activations) are the measured ones within a third (the resident set also
    holds the process's libraries and data, the same in every trial: its gaps are comparable, its values not)."""
    loops = ranks["loops"]
    ddp, fsdp, full = loops["rss_ddp_none"], loops["rss_fsdp_none"], loops["rss_ddp_full"]
    selective = loops["rss_ddp_selective"]
    assert fsdp < ddp - 0.02, loops  # half the model states: ~55 MB less per rank
    assert full < ddp - 0.03, loops  # a block's input kept instead of its activations: ~80 MB less
    assert full < selective < ddp, loops
    p = {k: loops[f"predicted_{k}"][0] for k in ("ddp_none", "fsdp_none", "ddp_selective", "ddp_full")}
    assert p["fsdp_none"] < p["ddp_none"] and p["ddp_full"] < p["ddp_selective"] < p["ddp_none"], p
    for lean, what in (("fsdp_none", "model states"), ("ddp_full", "activations")):
        predicted, measured = p["ddp_none"] - p[lean], ddp - loops[f"rss_{lean}"]
        assert abs(predicted - measured) < measured / 3, (what, predicted, measured, loops)


def test_dcp_round_trip_and_a_sharded_trial_resumes(ranks: dict[str, Any]) -> None:
    rt = ranks["round_trip"]
    assert rt["outputs"] == 0.0 and rt["after_a_step"] == 0.0 and rt["measured_steps"] == 7
    restored, steps, uninterrupted = ranks["loops"]["resumed"]
    assert restored == 3 and steps == uninterrupted == 6  # the checkpoint at measured step 3, the rest run


def test_blocks_are_named_found_or_absent() -> None:
    gpt = GPT(GPT_PRESETS["tiny"])
    assert find_blocks(gpt).describe() == "2 x _Block (blocks)"
    assert find_blocks(gpt, "blocks").count == 2
    with pytest.raises(UnsupportedError, match="Workload.blocks names 'ln_f'"):
        find_blocks(gpt, "ln_f")
    mixed = nn.Sequential(nn.ModuleList([nn.Linear(2, 2), nn.ReLU()]), nn.Linear(2, 2))
    assert find_blocks(mixed).describe() == "none: the model is one unit"  # a list of unlike modules is no run of blocks


def test_no_blocks_is_sharded_whole_and_ac_refused_with_the_fix() -> None:
    flat = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    with pytest.raises(UnsupportedError, match="Workload.blocks"):
        shard(flat, find_blocks(flat), Wrapping("ddp", "selective", False, "32"), CPU, 1)


def test_a_hugging_face_lm_has_blocks_without_glue() -> None:
    from examples.hf_causal_lm import PARAMS, build
    from trainables.workloads.base import BuildContext

    wl = build(dict(PARAMS), BuildContext(".", 0))
    assert find_blocks(wl.model).describe() == "2 x LlamaDecoderLayer (model.layers)"


def test_fp16_cannot_follow_the_sharding() -> None:
    with pytest.raises(ValueError, match="16-mixed cannot train with strategy fsdp"):
        TrialConfig(workload="gpt-lm", num_steps=1, strategy="fsdp", precision="16-mixed")
    TrialConfig(workload="gpt-lm", num_steps=1, strategy="fsdp", precision="bf16-mixed")


def test_cpu_offload_needs_a_shard_to_move_and_a_cpu_has_nothing_to_move() -> None:
    from sweeps.spec import SpecError, parse_spec

    with pytest.raises(ValueError, match="cpu_offload needs a sharded strategy .* strategy ddp has none"):
        TrialConfig(workload="gpt-lm", num_steps=1, strategy="ddp", cpu_offload=True)
    text = (Path(__file__).resolve().parents[2] / "examples" / "memory.yaml").read_text()
    with pytest.raises(SpecError, match="space: cpu_offload needs a sharded strategy.*drop one from the space"):
        parse_spec(text.replace("  lr: 1.0e-3\n", "  lr: 1.0e-3\n  cpu_offload: true\n"))
    sharded = (text.replace("choices: [ddp, fsdp, fsdp_no_reshard]", "choices: [fsdp, fsdp_no_reshard]")
               .replace("  lr: 1.0e-3\n", "  lr: 1.0e-3\n  cpu_offload: true\n").replace("num_trials: 18 ", "num_trials: 12 "))
    parse_spec(sharded)
    # on GPUs, clipping offloaded gradients all-reduces a CPU tensor, which NCCL cannot: refused, naming the fix
    with pytest.raises(ValueError, match="cpu_offload with max_grad_norm 1 on GPUs.*set max_grad_norm 0"):
        TrialConfig(workload="gpt-lm", num_steps=1, strategy="fsdp", cpu_offload=True, use_gpu=True, max_grad_norm=1.0)
    TrialConfig(workload="gpt-lm", num_steps=1, strategy="fsdp", cpu_offload=True, max_grad_norm=1.0)  # gloo: fine
    gpu = sharded.replace("  use_gpu: false", "  use_gpu: true").replace("  lr: 1.0e-3\n", "  lr: 1.0e-3\n  max_grad_norm: 1.0\n")
    with pytest.raises(SpecError, match="space: cpu_offload with max_grad_norm 1 on GPUs"):
        parse_spec(gpu)
    # sharded on one gloo rank: on a CPU the offload policy has nothing to move, and the trial's tag says so
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        gpt = GPT(GPT_PRESETS["tiny"])
        layout = shard(gpt, find_blocks(gpt), Wrapping.of("fsdp", "none", False, "32", offload=True), CPU, 1)
        assert layout.sharded and layout.tags["memory/sharding"].endswith(
            "cpu_offload: nothing to move without CUDA (the model is in host memory already)")
        assert all(p.device.type == "cpu" for p in gpt.parameters())
    finally:
        dist.destroy_process_group()


def test_the_spec_refuses_fp16_with_sharding_and_takes_the_memory_example() -> None:
    from sweeps.spec import SpecError, parse_spec

    text = (Path(__file__).resolve().parents[2] / "examples" / "memory.yaml").read_text()
    spec = parse_spec(text)
    assert set(spec.space.searched()) == {"strategy", "activation_checkpointing", "batch_size"}
    assert spec.budget.global_batch_size == 16  # each micro-batch's accumulation follows
    bad = text.replace("  lr: 1.0e-3\n", "  lr: 1.0e-3\n  precision: {type: categorical, choices: ['32', 16-mixed]}\n")
    with pytest.raises(SpecError, match="16-mixed cannot train with strategy fsdp.*drop one from the space"):
        parse_spec(bad.replace("num_trials: 18 ", "num_trials: 36 "))
