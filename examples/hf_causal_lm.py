"""A Hugging Face causal LM swept as it is: dict batches, its own loss, padding not counted.

The model is built from a `transformers` config (random init: nothing is downloaded). Batches are
what a Hugging Face training script feeds: a dict of `input_ids`, `attention_mask` and `labels`,
padded per batch by a `collate_fn`, with -100 labels on the padding. The model computes its own
loss (`model(**batch).loss`), so the step is one line; throughput counts only real tokens.

The data: short sequences that count up from a random start by a random stride (mod the
vocabulary), of random length, so the loss really falls and padding really varies per batch.

    trainable: {name: examples.hf_causal_lm:build}
    space: {params.hidden_size: {type: categorical, choices: [32, 64]}, grad_accum_steps: ...}
"""

from __future__ import annotations

from typing import Any

import torch

from trainables import BuildContext, Workload

UNIT = "tokens"  # what count_items counts: the spec's default objective is throughput/tokens_per_s
# The params this trainable takes, with their defaults; read from this file without running it,
# so `sweeps validate` rejects a misspelt `params.<name>` before anything starts.
PARAMS = {
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "vocab_size": 128,
    "num_train_seqs": 1024,
    "num_val_seqs": 128,
    "min_len": 8,
    "max_len": 48,
    "pad_to": 0,  # 0: pad each batch to its longest sequence; N: pad every batch to N tokens
    "dropout": 0.0,
}
PAD, BOS, FIRST = 0, 1, 2  # token ids: padding, start of sequence, first "number"


def make_sequences(num: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (num,), generator=gen).tolist()
    starts = torch.randint(0, vocab - FIRST, (num,), generator=gen).tolist()
    strides = torch.randint(1, 4, (num,), generator=gen).tolist()
    return [torch.tensor([BOS] + [FIRST + (s + i * k) % (vocab - FIRST) for i in range(n - 1)])
            for n, s, k in zip(lengths, starts, strides, strict=True)]


class Collate:
    """Pads a list of sequences into a Hugging Face batch; a class, so loader workers can pickle it."""

    def __init__(self, pad_to: int) -> None:
        self.pad_to = pad_to

    def __call__(self, seqs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        width = max(self.pad_to, max(len(s) for s in seqs))
        ids = torch.full((len(seqs), width), PAD, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = s
            mask[i, : len(s)] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def count_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Real tokens only: padding costs compute but teaches nothing."""
    return int(batch["attention_mask"].sum())


def step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> Any:
    return model(**batch)  # a CausalLMOutput: the loop takes its .loss


def token_accuracy(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Share of next tokens predicted exactly, over the real (non-padding) targets."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    target = batch["labels"][:, 1:]
    real = target != -100
    hits = (logits[:, :-1].argmax(-1) == target) & real
    return {"token_accuracy": hits.sum() / real.sum().clamp(min=1)}


def build(params: dict[str, Any], ctx: BuildContext) -> Workload:
    from transformers import AutoModelForCausalLM, LlamaConfig

    p = params
    if p["min_len"] < 2 or p["max_len"] < p["min_len"]:
        raise ValueError(f"need 2 <= min_len <= max_len, got min_len={p['min_len']}, max_len={p['max_len']}")
    config = LlamaConfig(
        vocab_size=p["vocab_size"], hidden_size=p["hidden_size"], intermediate_size=4 * p["hidden_size"],
        num_hidden_layers=p["num_layers"], num_attention_heads=p["num_heads"], num_key_value_heads=p["num_heads"],
        max_position_embeddings=max(p["max_len"], p["pad_to"]), attention_dropout=p["dropout"],
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=None, use_cache=False, tie_word_embeddings=True,
    )
    torch.manual_seed(ctx.seed)  # same initial weights on every rank
    model = AutoModelForCausalLM.from_config(config)
    n_params = sum(q.numel() for q in model.parameters())
    train = make_sequences(p["num_train_seqs"], p["min_len"], p["max_len"], p["vocab_size"], ctx.seed)
    val = make_sequences(p["num_val_seqs"], p["min_len"], p["max_len"], p["vocab_size"], ctx.seed + 1)
    return Workload(
        model=model,
        train_dataset=train,  # type: ignore[arg-type]  # a list is a map-style dataset
        val_dataset=val,  # type: ignore[arg-type]
        step_fn=step,
        count_items=count_tokens,
        collate_fn=Collate(p["pad_to"]),
        eval_fn=token_accuracy,
        unit=UNIT,
        flops_per_item=6.0 * n_params,  # 6·N per token; attention's share is small at these lengths
    )
