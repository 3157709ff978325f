"""THE per-worker training loop: DDP + AMP, shared by every workload.

Runs the same under Ray Train (which sets up the process group) and plain `torchrun`.
Order per step, as in nanoGPT: fetch batch (timed as data wait) -> copy to device ->
autocast forward -> scaled backward -> step/update -> zero_grad(set_to_none=True).
Nothing syncs with the host per step; losses are accumulated on the device and read
only when reporting, which happens every `report_every` steps, agreed by all ranks.
"""

from __future__ import annotations

import contextlib
import logging
import math
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from trainables import contract, registry
from trainables.contract import CHECKPOINT_FILE, TrialConfig
from trainables.devinfo import device_facts
from trainables.errors import DivergedError, WorkloadError
from trainables.flops import peak_flops
from trainables.precision import Precision, resolve_precision
from trainables.reporting import Reporter
from trainables.telemetry import StepTimer, Telemetry, combine_ranks
from trainables.workloads.base import BuildContext, Workload

logger = logging.getLogger(__name__)


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce(values: list[float], device: torch.device, op: str = "sum") -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if _world()[1] > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()


def _make_loader(
    dataset: Dataset[Any], cfg: TrialConfig, pin: bool, train: bool, rank: int, world: int
) -> tuple[DataLoader[Any], DistributedSampler[Any] | None]:
    sampler: DistributedSampler[Any] | None = None
    if train and world > 1:
        sampler = DistributedSampler(dataset, world, rank, shuffle=True, seed=cfg.seed, drop_last=True)
    elif not train:  # exact shard, no padding: every validation sample counted once
        dataset = Subset(dataset, range(rank, len(dataset), world))  # type: ignore[arg-type]
    workers = cfg.num_dataloader_workers
    loader = DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        shuffle=train and sampler is None,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin,
        drop_last=train,
        persistent_workers=train and workers > 0 and cfg.persistent_workers,
        prefetch_factor=cfg.prefetch_factor if workers > 0 else None,
        timeout=cfg.loader_timeout_s if workers > 0 else 0,  # a hung loader worker fails the trial
        generator=torch.Generator().manual_seed(cfg.seed + rank) if sampler is None else None,
    )
    if train and len(loader) == 0:
        raise WorkloadError(
            f"the training set has {len(dataset)} samples (per rank), fewer than batch_size="  # type: ignore[arg-type]
            f"{cfg.batch_size}: lower batch_size or enlarge the dataset"
        )
    return loader, sampler


def _batches(loader: DataLoader[Any], sampler: DistributedSampler[Any] | None) -> Iterator[Any]:
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _close_loader(loader: DataLoader[Any], batches: Iterator[Any]) -> None:
    """Shut the loader's worker processes down now rather than at garbage collection: after a
    failure, the traceback keeps the iterator (and PyTorch's SIGCHLD watch over its workers) alive."""
    close = getattr(batches, "close", None)
    if close is not None:
        close()
    iterator = getattr(loader, "_iterator", None)  # persistent workers live on the loader
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None  # type: ignore[attr-defined]


def _to(batch: Any, device: torch.device, non_blocking: bool) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = batch
    return x.to(device, non_blocking=non_blocking), y.to(device, non_blocking=non_blocking)


@torch.no_grad()
def _validate(
    model: nn.Module, wl: Workload, cfg: TrialConfig, prec: Precision, device: torch.device, pin: bool
) -> float:
    rank, world = _world()
    loader, _ = _make_loader(wl.val_dataset, cfg, pin, train=False, rank=rank, world=world)
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    for batch in loader:
        x, y = _to(batch, device, pin)
        with prec.autocast():
            loss = wl.loss_fn(model(x), y)
        total += loss.double() * len(x)
        count += len(x)
    model.train()
    summed, n = _all_reduce([total.item(), float(count)], device)
    return summed / n


def _telemetry_metrics(telemetry: Telemetry | None, elapsed: float, since_last: bool, world: int) -> dict[str, Any]:
    """This window's telemetry, combined over ranks (every rank calls this at the same points)."""
    if telemetry is None:
        return {}
    mine = telemetry.rank_summary(elapsed, since_last)
    if world == 1:
        return combine_ranks([mine])
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    return combine_ranks(gathered)


def _flops_metrics(final: dict[str, Any], wl: Workload, cfg: TrialConfig, device: torch.device, world: int) -> dict[str, float]:
    """Achieved TFLOP/s where the workload knows its FLOPs; MFU where the peak is known too."""
    if wl.flops_per_item is None:
        return {}
    achieved = final[contract.throughput_key(wl.unit)] * wl.flops_per_item
    out = {contract.TFLOPS: achieved / 1e12}
    if device.type == "cuda":
        peak = peak_flops(torch.cuda.get_device_name(device), cfg.precision)
        if peak is not None:
            out[contract.MFU_PCT] = 100.0 * achieved / (peak * world)
    return out


def _save_state(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any, measured: int) -> None:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else {}, "measured_steps": measured},
               path / CHECKPOINT_FILE)


def _load_state(path: str, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any, device: torch.device) -> int:
    """Restore a checkpoint this loop wrote; tensors only (`weights_only`): nothing is unpickled."""
    state = torch.load(Path(path) / CHECKPOINT_FILE, map_location=device, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state["scaler"]:
        scaler.load_state_dict(state["scaler"])
    return int(state["measured_steps"])


def train(cfg: TrialConfig, reporter: Reporter, device: torch.device, facts: dict[str, str] | None = None,
          resume_from: str | None = None) -> dict[str, Any]:
    """Train `cfg.num_warmup_steps + cfg.num_steps` steps and return the final report.

    `facts` (strings, e.g. the launcher's node id) join rank 0's device facts in the final report.
    With `cfg.checkpoint_every_steps`, every that many measured steps rank 0 saves model, optimizer
    and scaler state and hands it to the reporter with that report; `resume_from` (a directory
    holding such a checkpoint) continues from it: warm-up runs again (fresh process, cold caches),
    then only the measured steps still missing, and throughput is measured over those alone."""
    loop_t0 = time.perf_counter()
    rank, world = _world()
    torch.set_num_threads(cfg.threads_per_worker)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(cfg.seed)
    prec = resolve_precision(cfg.precision, device)  # before any work: unsupported fails fast
    prec.apply_matmul_flags()

    wl = registry.build(cfg.workload, cfg.workload_params, BuildContext(cfg.data_dir, cfg.seed, rank, world))
    model = wl.model.to(device)
    if device.type == "cuda" and wl.channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    if cfg.compile:
        model = torch.compile(model)  # type: ignore[assignment]
    ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) if world > 1 else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, fused=device.type == "cuda")
    scaler = prec.make_scaler()
    done_before = _load_state(resume_from, model, optimizer, scaler, device) if resume_from else 0
    pin = cfg.pin_memory and device.type == "cuda"
    if cfg.pin_memory and not pin and rank == 0:
        warnings.warn("pin_memory=True has no effect without CUDA; running unpinned", stacklevel=2)
    loader, sampler = _make_loader(wl.train_dataset, cfg, pin, train=True, rank=rank, world=world)
    batches = _batches(loader, sampler)
    timer = StepTimer(device)
    telemetry = Telemetry(device, cfg.telemetry_period_s) if cfg.telemetry_period_s > 0 else None
    unit, per_item = wl.unit, wl.items_per_sample

    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    loss_count = 0
    report_every = cfg.num_steps  # refined after warm-up from the measured step time
    warm_t0 = 0.0

    def window_metrics(final: bool = False) -> dict[str, Any]:
        nonlocal loss_sum, loss_count
        elapsed = timer.elapsed_s()
        if final and telemetry is not None:
            telemetry.stop()
        summed = _all_reduce([timer.steps * cfg.batch_size * per_item, timer.data_wait_s / elapsed,
                              loss_sum.item(), float(loss_count)], device)
        (max_elapsed,) = _all_reduce([elapsed], device, op="max")
        items, wait_share, losses, counts = summed
        train_loss = losses / max(counts, 1.0)
        if not math.isfinite(train_loss):
            raise DivergedError(f"training loss became {train_loss} by measured step {timer.steps}")
        loss_sum, loss_count = torch.zeros_like(loss_sum), 0
        measured = _telemetry_metrics(telemetry, elapsed, since_last=not final, world=world)
        if "energy/total_j" in measured and items > 0:
            measured[contract.energy_key(unit)] = 1000.0 * measured["energy/total_j"] / items
        return measured | {
            contract.throughput_key(unit): items / max_elapsed,
            contract.per_worker_throughput_key(unit): items / max_elapsed / world,
            contract.LOSS_TRAIN: train_loss,
            contract.STEP_TIME_MS: 1000.0 * max_elapsed / max(timer.steps, 1),
            contract.DATA_WAIT_PCT: 100.0 * wait_share / world,
            contract.STEPS: done_before + timer.steps,
            contract.WORLD_SIZE: world,
            contract.FINAL: 0,
        }

    model.train()
    try:
        for step in range(cfg.num_warmup_steps + cfg.num_steps - done_before):
            if step == cfg.num_warmup_steps:
                if step >= 2:  # warm-up long enough to time: report about every report_interval_s
                    (warm_step_s,) = _all_reduce([(timer.now() - warm_t0) / (step - 1)], device, op="max")
                    report_every = max(1, int(cfg.report_interval_s / max(warm_step_s, 1e-9)))
                timer.start()
                if telemetry is not None:
                    telemetry.start()
            elif step == 1:
                warm_t0 = timer.now()  # step 0 (allocations, loader start-up) is not representative
            with timer.data_wait():
                batch = next(batches)
            with telemetry.h2d_copy(timer.measuring) if telemetry is not None else contextlib.nullcontext():
                x, y = _to(batch, device, pin)
            if device.type == "cuda" and wl.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            with prec.autocast():
                loss = wl.loss_fn(ddp_model(x), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if timer.measuring:
                loss_sum += loss.detach().float()
                loss_count += 1
                timer.step_done()
                total = done_before + timer.steps
                every = cfg.checkpoint_every_steps
                if every and total % every == 0 and total < cfg.num_steps:  # same decision on every rank
                    with tempfile.TemporaryDirectory(prefix="ckpt-") as tmp:
                        if rank == 0:
                            _save_state(Path(tmp), model, optimizer, scaler, total)
                        reporter.report(window_metrics(), checkpoint_dir=tmp if rank == 0 else None)
                elif timer.steps % report_every == 0 and total < cfg.num_steps:
                    reporter.report(window_metrics())
    except BaseException:  # stop loader workers now: a kept traceback would keep them registered
        _close_loader(loader, batches)
        raise

    final = window_metrics(final=True)
    _close_loader(loader, batches)  # after the last telemetry sample, which counts loader CPU
    final[contract.LOSS_VAL] = _validate(ddp_model, wl, cfg, prec, device, pin)
    if not math.isfinite(final[contract.LOSS_VAL]):
        raise DivergedError(f"validation loss is {final[contract.LOSS_VAL]}")
    final.update(_flops_metrics(final, wl, cfg, device, world))
    final[contract.FINAL] = 1
    if done_before:
        final[contract.RESTORED_FROM] = done_before
    (final[contract.LOOP_S],) = _all_reduce([time.perf_counter() - loop_t0], device, op="max")
    if rank == 0:
        final.update(device_facts(device))
        if telemetry is not None:
            final.update(telemetry.facts)
        if device.type == "cuda":
            final["device/gpu_count"] = str(world)
        final.update(facts or {})
    reporter.report(final)
    return final
