"""The memory model (trainables/memory_model.py): model states by strategy, activations from one forward."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from trainables.memory_model import (
    Activations,
    ParamCounts,
    measure_activations,
    model_states,
    optimizer_bytes_per_param,
)
from trainables.sharding import find_blocks
from trainables.workloads.declared import GPT_PRESETS
from trainables.workloads.gpt_lm import GPT, lm_loss


def test_model_states_by_strategy() -> None:
    """Bytes per rank from the parameter count: AdamW's 16 per parameter under DDP (+4 for the buckets with
    peers), a 1/world shard of them under FSDP2 plus what it gathers (the root and two blocks, or all)."""
    n = ParamCounts(1000, 100, (300, 300, 300))
    assert model_states(n, 1, "ddp", 4, 8) == 16_000
    assert model_states(n, 2, "ddp", 4, 8) == 20_000
    assert model_states(n, 2, "fsdp", 4, 8) == 8_000 + 4 * (100 + 600)
    assert model_states(n, 2, "fsdp", 2, 8) == 8_000 + 2 * (100 + 600)  # bf16 parameters gathered
    assert model_states(n, 2, "fsdp_no_reshard", 4, 8) == 8_000 + 4 * 1000
    assert model_states(n, 4, "fsdp", 4, 8) < model_states(n, 2, "fsdp", 4, 8)
    # offloaded to the host (a GPU's CPUOffloadPolicy): the device holds what is gathered, nothing of the shard
    assert model_states(n, 2, "fsdp", 2, 8, offloaded=True) == 2 * (100 + 600)
    # hybrid: sharded over a node's 2 ranks (the caller passes those, whatever the world), gathered as fsdp
    assert model_states(n, 2, "hsdp", 4, 8) == model_states(n, 2, "fsdp", 4, 8) == 8_000 + 4 * 700


def test_optimizer_state_is_known_for_adam_and_sgd_only() -> None:
    p = [nn.Parameter(torch.zeros(2))]
    assert optimizer_bytes_per_param(torch.optim.AdamW(p)) == 8
    assert optimizer_bytes_per_param(torch.optim.SGD(p, lr=0.1, momentum=0.9)) == 4
    assert optimizer_bytes_per_param(torch.optim.SGD(p, lr=0.1)) == 0
    assert optimizer_bytes_per_param(torch.optim.Adagrad(p)) is None  # unknown: no prediction, not a guess


class _Chain(nn.Module):
    """Two blocks of Linear(8, 16) -> ReLU -> Linear(16, 8), and a head: every saved tensor known by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)) for _ in range(2))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x).sum()


def test_activations_counted_by_hand_for_each_mode() -> None:
    """fp32, one sample: each block saves its input (32 B, for the first Linear's weight gradient) and ReLU's
    output (64 B, which the second Linear saves too: counted once); the head saves its input (32 B, the second
    block's output). Full checkpointing keeps each block's input, and the backward recomputes one block at a time
    (96 B live at once); selective keeps the block's input and the first matmul's output of each block (every
    other matmul, torchtitan's rule) and recomputes the rest of one block: here more than no checkpointing at all,
    so no more than that is predicted."""
    model, x = _Chain(), torch.randn(1, 8)
    acts = measure_activations(model, find_blocks(model), lambda m: m(x))
    inputs = 2 * 32
    assert acts.none == 2 * (32 + 64) + 32
    assert acts.full == 32 + inputs + 96  # the head's input, what each block gets, one block recomputed
    assert 32 + inputs + 2 * 64 + (96 - 64) > acts.none == acts.selective
    assert acts.full < acts.selective <= acts.none
    assert acts.first_grad == 64  # the largest saved tensor, ReLU's output: its gradient comes with all of them
    # the same forward counts what each mode runs again in backward: a block's two matmuls are 2 x 8 x 16 FLOPs
    # each; full recomputes both in both blocks, selective the one of each block whose output it does not keep
    assert (acts.recomputed_flops("none"), acts.recomputed_flops("full"), acts.recomputed_flops("selective")) == \
        (0.0, 2 * 2 * 256.0, 2 * 256.0)
    per_token = dataclasses.replace(acts, items=8)  # in the workload's unit: the sample's 8 tokens, say
    assert per_token.recomputed_flops("full") == 1024.0 / 8


def test_hardware_flops_beside_the_models() -> None:
    """MFU counts the model's FLOPs; HFU adds the recomputation, the same peak for both."""
    from trainables.build import flops_metrics
    from trainables.contract import HFU_PCT, HW_TFLOPS, MFU_PCT, TFLOPS, throughput_key

    wl = type("W", (), {"unit": "tokens"})()
    final = {throughput_key("tokens"): 1e6}
    got = flops_metrics(final, wl, 1e13, 4e6, 1e6)  # type: ignore[arg-type]
    assert got == {TFLOPS: pytest.approx(4.0), HW_TFLOPS: pytest.approx(5.0), MFU_PCT: pytest.approx(40.0),
                   HFU_PCT: pytest.approx(50.0)}
    assert set(flops_metrics(final, wl, None, 4e6, None)) == {TFLOPS}  # type: ignore[arg-type]  # not measured: absent


def test_a_gpt_orders_the_modes_and_the_measurement_changes_nothing() -> None:
    preset = dataclasses.replace(GPT_PRESETS["tiny"], seq_len=64)
    torch.manual_seed(0)
    model = GPT(preset)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    idx = torch.randint(0, preset.vocab_size, (1, preset.seq_len))
    one = measure_activations(model, find_blocks(model), lambda m: lm_loss(m(idx), idx))
    assert 0 < one.full < one.selective < one.none
    two = measure_activations(model, find_blocks(model), lambda m: lm_loss(m(idx.repeat(2, 1)), idx.repeat(2, 1)))
    assert two.none == pytest.approx(2 * one.none, rel=0.02)  # fp32: nothing saved once a forward, all per sample
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    counts = ParamCounts.of(model, find_blocks(model))
    assert counts.total == sum(p.numel() for p in model.parameters()) == counts.root + sum(counts.blocks)
    assert len(counts.blocks) == preset.n_layer


def test_autocasts_weight_copies_are_paid_once_per_forward_not_per_sample() -> None:
    """Under bf16 autocast each Linear saves a 16-bit copy of its weight, whatever the batch: scaling one sample's
    forward by the micro-batch counted those copies once per sample (a GPT-2 medium at micro-batch 16 was
    predicted 25% over the allocator's peak on an H100, 2026-11-28). The forwards of one sample and of two split
    them out, and the fit then gives a forward of 8 samples what it saves."""
    preset = dataclasses.replace(GPT_PRESETS["tiny"], seq_len=16)
    torch.manual_seed(0)
    model = GPT(preset)
    blocks = find_blocks(model)
    idx = torch.randint(0, preset.vocab_size, (8, preset.seq_len))

    def saved(n: int) -> Activations:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return measure_activations(model, blocks, lambda m: lm_loss(m(idx[:n]), idx[:n]))

    fit, eight = Activations.fit(saved(1), saved(2)), saved(8)
    assert fit.fixed_none > 0 and fit.fixed_full > 0  # the weight copies (all in the blocks, and the head's)
    for mode in ("none", "selective", "full"):
        assert fit.of(mode, 8) - 8 * fit.first_grad == pytest.approx(eight.of(mode) - eight.first_grad, rel=0.01)
    assert saved(1).of("none") * 8 > 1.1 * eight.of("none")  # the per-sample scaling it replaces
    # sharded, FSDP2 gathers the 16-bit parameters (its model states) and autocast copies none
    assert fit.of("none", 8, fixed=False) == fit.of("none", 8) - fit.fixed_none
    # the loss's fp32 log-softmax of a sample's logits is the largest saved tensor that grows with the batch (the
    # head's 16-bit weight copy is as large as two samples' of it, and stays): its gradient, per sample
    assert fit.first_grad == preset.seq_len * preset.vocab_size * 4


def test_the_first_gradient_is_never_a_weight_copy_and_never_lives_with_the_recomputed_block() -> None:
    """An MLP under bf16 autocast: its weights' 16-bit copies (up to 256 KiB) stay from one sample to two, its
    largest per-sample tensor (a 512-wide bf16 output, 1 KiB) doubles. Checkpointed, the block backward recomputes
    lives after the first gradient is freed: the larger of the two counts, not both."""
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 128),
                          nn.ReLU(), nn.Linear(128, 10))
    x = torch.randn(2, 64)

    def saved(n: int) -> Activations:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return measure_activations(model, find_blocks(model), lambda m: m(x[:n]).float().pow(2).sum())

    fit = Activations.fit(saved(1), saved(2))
    assert fit.first_grad == 512 * 2 and max(saved(1).sizes) == 512 * 256 * 2
    acts = Activations(none=100, selective=60, full=40, first_grad=10, rebuilt_selective=5, rebuilt_full=30)
    assert (acts.of("none", 2), acts.of("selective", 2), acts.of("full", 2)) == (220, 130, 80)


def test_a_model_without_blocks_has_one_figure() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    x = torch.randn(1, 8)
    acts = measure_activations(model, find_blocks(model), lambda m: m(x).sum())
    assert acts.none == acts.selective == acts.full == 32 + 64
