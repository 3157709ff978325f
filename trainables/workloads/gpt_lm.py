"""`gpt-lm`: a decoder-only transformer (nanoGPT-style) on token shards on disk.

The text is generated in-repo by a seeded grammar (people counting things, small-number
arithmetic, animals doing things), tokenized word by word and written once as uint16 memmap
shards; sequences are read from the memmap in the dataset. Attention uses
`scaled_dot_product_attention`; the vocabulary is padded to a multiple of 128.

Training FLOPs per token (for MFU) = 6·N + 12·L·d·T, with N the parameters excluding the
position embedding (the token embedding counts: it is the tied LM head's matmul), L layers,
d the width and T the sequence length (PaLM appendix B; nanoGPT's estimate_mfu).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from trainables.workloads.base import BuildContext, Workload, ensure_cached
from trainables.workloads.declared import GPT_PRESETS as PRESETS  # noqa: F401  # re-exported
from trainables.workloads.declared import GptLmParams as Params
from trainables.workloads.declared import Preset

UNIT = "tokens"
_FORMAT_VERSION = 1


# --- data: generated text -> word tokens -> uint16 shards -------------------------------

_NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
            "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
            "nineteen", "twenty"]
_NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
_THINGS = ["apples", "books", "coins", "stones", "letters", "keys", "cups", "maps"]
_VERBS = ["has", "sees", "finds", "keeps", "sells", "counts"]
_ANIMALS = ["cat", "dog", "fox", "owl", "bee", "cow"]
_ADJS = ["small", "big", "red", "quiet", "quick", "old"]
_ACTS = ["chases", "watches", "follows", "ignores"]
_WORDS = ["<eos>", ".", "plus", "is", "the", "and", "then", *_NUMBERS, *_NAMES, *_THINGS, *_VERBS,
          *_ANIMALS, *_ADJS, *_ACTS]
VOCAB = {w: i for i, w in enumerate(dict.fromkeys(_WORDS))}


def _sentence(rng: np.random.Generator) -> list[str]:
    kind = rng.integers(3)
    if kind == 0:
        return [rng.choice(_NAMES), rng.choice(_VERBS), _NUMBERS[rng.integers(21)], rng.choice(_THINGS), "."]
    if kind == 1:
        a = int(rng.integers(11))
        b = int(rng.integers(11))
        return [_NUMBERS[a], "plus", _NUMBERS[b], "is", _NUMBERS[a + b] if a + b <= 20 else "twenty", "."]
    return ["the", rng.choice(_ADJS), rng.choice(_ANIMALS), rng.choice(_ACTS), "the", rng.choice(_ANIMALS), "."]


def generate_tokens(num_tokens: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty(num_tokens, dtype=np.uint16)
    n = 0
    while n < num_tokens:
        ids = [VOCAB[w] for w in _sentence(rng)]
        take = min(len(ids), num_tokens - n)
        out[n : n + take] = ids[:take]
        n += take
    return out


def ensure_token_shards(p: Preset, data_dir: str, seed: int) -> Path:
    root = Path(data_dir) / f"gpt-lm-v{_FORMAT_VERSION}-n{p.num_train_tokens}-{p.num_val_tokens}-seed{seed}"

    def write(tmp: Path) -> None:
        generate_tokens(p.num_train_tokens, seed).tofile(tmp / "train.bin")
        generate_tokens(p.num_val_tokens, seed + 1).tofile(tmp / "val.bin")

    return ensure_cached(root, write)


class TokenWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping windows of `seq_len + 1` tokens read from a uint16 memmap."""

    def __init__(self, path: Path, seq_len: int) -> None:
        self.path, self.seq_len = path, seq_len
        self.length = (os.path.getsize(path) // 2 - 1) // seq_len
        self._data: np.memmap[Any, Any] | None = None  # opened lazily, in each loader process

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint16, mode="r")
        start = index * self.seq_len
        chunk = torch.from_numpy(self._data[start : start + self.seq_len + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


# --- model -------------------------------------------------------------------------------


class _Attention(nn.Module):
    def __init__(self, p: Preset) -> None:
        super().__init__()
        self.n_head = p.n_head
        self.c_attn = nn.Linear(p.n_embd, 3 * p.n_embd)
        self.c_proj = nn.Linear(p.n_embd, p.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class _Block(nn.Module):
    def __init__(self, p: Preset) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(p.n_embd)
        self.attn = _Attention(p)
        self.ln_2 = nn.LayerNorm(p.n_embd)
        self.mlp = nn.Sequential(nn.Linear(p.n_embd, 4 * p.n_embd), nn.GELU(approximate="tanh"), nn.Linear(4 * p.n_embd, p.n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, p: Preset) -> None:
        super().__init__()
        self.wte = nn.Embedding(p.vocab_size, p.n_embd)
        self.wpe = nn.Embedding(p.seq_len, p.n_embd)
        self.blocks = nn.ModuleList(_Block(p) for _ in range(p.n_layer))
        self.ln_f = nn.LayerNorm(p.n_embd)
        self.lm_head = nn.Linear(p.n_embd, p.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        for name, param in self.named_parameters():
            if param.dim() >= 2:
                std = 0.02 / math.sqrt(2 * p.n_layer) if name.endswith("c_proj.weight") or name.endswith("mlp.2.weight") else 0.02
                nn.init.normal_(param, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(param)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # type: ignore[no-any-return]


def flops_per_token(model: GPT, p: Preset) -> float:
    """6·N + 12·L·d·T (see the module docstring)."""
    n = sum(q.numel() for q in model.parameters()) - model.wpe.weight.numel()
    return 6.0 * n + 12.0 * p.n_layer * p.n_embd * p.seq_len


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def build(params: Params, ctx: BuildContext) -> Workload:
    p = params.resolved()
    assert len(VOCAB) <= p.vocab_size, "the generated text's vocabulary must fit the model's"
    root = ensure_token_shards(p, ctx.data_dir, ctx.seed)
    model = GPT(p)
    return Workload(
        model=model,
        train_dataset=TokenWindows(root / "train.bin", p.seq_len),
        val_dataset=TokenWindows(root / "val.bin", p.seq_len),
        loss_fn=lm_loss,
        unit=UNIT,
        items_per_sample=p.seq_len,
        flops_per_item=flops_per_token(model, p),
    )
