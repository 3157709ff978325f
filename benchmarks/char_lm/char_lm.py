"""A user's own model, as issue 41's user brought it: a character-level Transformer LM in ~25 lines of glue
(`benchmarks/no_trial_wasted.py` sweeps it). Text: a seeded grammar of short sentences, one byte per token."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from trainables import BuildContext, Workload

_WORDS = "the cat dog fox sees chases keeps one two three apples stones and then is plus".split()


class CharLM(nn.Module):
    def __init__(self, d_model: int, seq_len: int) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(128, d_model), nn.Parameter(torch.zeros(seq_len, d_model))
        self.block = nn.TransformerEncoderLayer(d_model, 4, 4 * d_model, dropout=0.0, batch_first=True)
        self.head = nn.Linear(d_model, 128)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.emb(x) + self.pos, src_mask=self.mask, is_causal=True))


def build(params: dict[str, Any], ctx: BuildContext) -> Workload:
    seq_len, rows = int(params.get("seq_len", 64)), int(params.get("num_rows", 4096))
    gen = torch.Generator().manual_seed(ctx.seed)
    words = [_WORDS[i] for i in torch.randint(len(_WORDS), (rows * seq_len // 4,), generator=gen)]
    data = torch.tensor(list(" ".join(words).encode()[: rows * (seq_len + 1)]), dtype=torch.long) % 128
    seqs = data[: (len(data) // (seq_len + 1)) * (seq_len + 1)].view(-1, seq_len + 1)
    cut = len(seqs) * 7 // 8
    return Workload(model=CharLM(int(params.get("d_model", 32)), seq_len),
                    train_dataset=TensorDataset(seqs[:cut, :-1], seqs[:cut, 1:]),
                    val_dataset=TensorDataset(seqs[cut:, :-1], seqs[cut:, 1:]),
                    loss_fn=lambda logits, y: F.cross_entropy(logits.reshape(-1, 128), y.reshape(-1)),
                    unit="samples")
