"""A streaming workload: an `IterableDataset` that shards itself by rank and by loader worker.

The loop does not wrap an IterableDataset in a `DistributedSampler` (it cannot index one), so
the dataset decides what each reader sees: here every (rank, loader worker) pair reads its own
slice of the stream (`BuildContext.rank`/`world_size` from the builder, `get_worker_info()`
inside the loader worker). The training stream is endless by default; a finite one must last
for (num_warmup_steps + num_steps) x grad_accum_steps batches per rank, or the trial fails as
`config` saying how many it yielded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import IterableDataset, get_worker_info

from trainables import BuildContext, Workload

PARAMS = {"num_features": 8, "train_rows_per_shard": 0, "num_val_rows": 512}  # 0: an endless training stream


class Stream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """Rows of a noisy linear problem; row i goes to the reader with i % readers == reader."""

    def __init__(self, weight: torch.Tensor, seed: int, rank: int, world: int, rows_per_shard: int,
                 total_rows: int = 0) -> None:
        self.weight, self.seed, self.rank, self.world = weight, seed, rank, world
        self.rows_per_shard, self.total_rows = rows_per_shard, total_rows

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        readers, reader = self.world * workers, self.rank * workers + worker
        if self.total_rows:  # a fixed set (validation): each row read by exactly one reader
            rows: Any = range(reader, self.total_rows, readers)
        else:
            rows = iter(int, 1) if not self.rows_per_shard else range(self.rows_per_shard // workers)
        gen = torch.Generator().manual_seed(self.seed * 100_003 + reader)
        for i in rows:
            if self.total_rows:
                gen.manual_seed(self.seed * 100_003 + 7 * i + 1)  # row i is the same whoever reads it
            x = torch.randn(self.weight.shape[0], generator=gen)
            yield x, x @ self.weight + 0.1 * torch.randn((), generator=gen)


def build(params: dict[str, Any], ctx: BuildContext) -> Workload:
    weight = torch.randn(params["num_features"], generator=torch.Generator().manual_seed(ctx.seed))
    torch.manual_seed(ctx.seed)
    model = nn.Sequential(nn.Linear(params["num_features"], 32), nn.GELU(), nn.Linear(32, 1), nn.Flatten(0))
    return Workload(
        model=model,
        train_dataset=Stream(weight, ctx.seed, ctx.rank, ctx.world_size, params["train_rows_per_shard"]),
        val_dataset=Stream(weight, ctx.seed + 1, ctx.rank, ctx.world_size, 0, total_rows=params["num_val_rows"]),
        loss_fn=F.mse_loss,
    )
