"""The trial's data loading: a DataLoader per rank (sharded, shuffled, timed out), and its batches.

Its batches come epoch after epoch, a loader worker's death is said as the loader failure it is, and its
workers are shut down when the trial ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Subset

from trainables.contract import TrialConfig
from trainables.loop_errors import WorkloadError
from trainables.workloads.base import Workload


def make_loader(
    wl: Workload, cfg: TrialConfig, pin: bool, train: bool, rank: int, world: int
) -> tuple[DataLoader[Any], DistributedSampler[Any] | None]:
    """A map-style dataset is sharded and shuffled here; an IterableDataset shards itself."""
    dataset = wl.train_dataset if train else wl.val_dataset
    iterable = isinstance(dataset, IterableDataset)
    sampler: DistributedSampler[Any] | None = None
    if train and world > 1 and not iterable:
        sampler = DistributedSampler(dataset, world, rank, shuffle=True, seed=cfg.seed, drop_last=True)
    elif not train and not iterable:  # exact shard, no padding: every validation sample counted once
        dataset = Subset(dataset, range(rank, len(dataset), world))  # type: ignore[arg-type]
    workers = cfg.num_dataloader_workers
    loader = DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        shuffle=train and sampler is None and not iterable,
        sampler=sampler,
        num_workers=workers,
        collate_fn=wl.collate_fn,
        pin_memory=pin,
        drop_last=train,
        persistent_workers=train and workers > 0 and cfg.persistent_workers,
        prefetch_factor=cfg.prefetch_factor if workers > 0 else None,
        timeout=cfg.loader_timeout_s if workers > 0 else 0,  # a hung loader worker fails the trial
        generator=torch.Generator().manual_seed(cfg.seed + rank) if sampler is None else None,
    )
    if train and not iterable and len(loader) == 0:
        raise WorkloadError(
            f"the training set has {len(dataset)} samples (per rank), fewer than batch_size="  # type: ignore[arg-type]
            f"{cfg.batch_size}: lower batch_size or enlarge the dataset"
        )
    return loader, sampler


def stream(loader: DataLoader[Any], sampler: DistributedSampler[Any] | None,
             needed: Callable[[], int]) -> Iterator[Any]:
    """Epoch after epoch of a map-style dataset; an IterableDataset's stream once, which must last."""
    if isinstance(loader.dataset, IterableDataset):
        n = 0
        for batch in handed_over(loader):
            n += 1
            yield batch
        raise WorkloadError(
            f"the training IterableDataset ended after {n} batches on this rank, but the trial needs {needed()} "
            "((num_warmup_steps + measured steps) x grad_accum_steps; budget.min_window_s may add measured steps): "
            "make the stream longer (or endless), or lower budget.num_steps / budget.min_window_s")
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from handed_over(loader)
        epoch += 1


def handed_over(loader: DataLoader[Any]) -> Iterator[Any]:
    """Yield the loader's batches, a worker's death during a hand-over said as the loader failure it is.

    A worker that dies while it hands a batch over through shared memory can surface as the hand-over's
    connection reset rather than as torch's "DataLoader worker (pid(s) ...) exited unexpectedly" (seen on a
    loaded 2-core machine): said the same way, so it reads, and is classified, as the loader failure it is."""
    it = iter(loader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except (ConnectionError, EOFError) as exc:
            if not loader.num_workers:
                raise
            workers = list(getattr(it, "_workers", ()))
            pids = [w.pid for w in workers if not w.is_alive()] or [w.pid for w in workers]
            raise RuntimeError(f"DataLoader worker (pid(s) {', '.join(map(str, pids))}) died handing over a batch "
                               f"({type(exc).__name__}: {exc})") from exc
        yield batch


def close_loader(loader: DataLoader[Any], batches: Iterator[Any]) -> None:
    """Shut the loader's worker processes down now rather than at garbage collection.

    After a failure, the traceback keeps the iterator (and PyTorch's SIGCHLD watch over its workers) alive."""
    close = getattr(batches, "close", None)
    if close is not None:
        close()
    iterator = getattr(loader, "_iterator", None)  # persistent workers live on the loader
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None  # type: ignore[attr-defined]
