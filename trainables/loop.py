"""THE per-worker training loop: DDP + AMP, shared by every workload.

Runs the same under Ray Train (which sets up the process group) and plain `torchrun`.
Order per optimizer step, as in nanoGPT: for each of `grad_accum_steps` micro-batches, fetch
(timed as data wait) -> count items -> copy to device -> autocast step_fn -> scaled backward
(DDP's gradient all-reduce only on the last micro-batch) -> then unscale/clip -> step/update ->
LR schedule -> zero_grad(set_to_none=True).

Host syncs: none per step on the loop's side (losses accumulate on the device; items are counted
on the host copy of the batch). They happen at the warm-up boundaries (to time a real step), at
each report (every `report_every` steps, agreed by all ranks), at the ~10 sub-window marks of the
measured window (the throughput's spread) and in validation.

Trial length: `num_steps` measured steps, extended so the measured window lasts at least
`min_window_s` (planned from warm-up's step time, checked when the plan runs out: a GPU step takes
milliseconds, and a one-second window is shorter than two telemetry samples). An equal-data budget
(`num_items`) or a target rules instead: the data or the target decides the length, not the clock.
With `num_items` the last optimizer step takes only the items that complete the budget (fewer
micro-batches, the last one cut to the samples needed), so trials of any batch size see the same
data within a sample or two per rank; a batch that cannot be cut (`batches.take_items`), or any
batch of a compiled model (a new shape would recompile inside the window), is used whole. A user's
`count_items` or `step_fn` may add its own (e.g. `.item()`): that is theirs to avoid.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Subset

from trainables import contract, registry
from trainables.batches import (
    checked_count,
    checked_eval,
    default_counter,
    loss_of,
    move_to_device,
    take_items,
    tensor_bytes,
    xy_step,
)
from trainables.contract import CHECKPOINT_FILE, TrialConfig
from trainables.devinfo import device_facts
from trainables.errors import DivergedError, WorkloadError
from trainables.flop_count import flops_per_item
from trainables.flops import cluster_peak
from trainables.noise_scale import NoiseScale, ddp_hook, grads_sq
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


def _batches(loader: DataLoader[Any], sampler: DistributedSampler[Any] | None,
             needed: Callable[[], int]) -> Iterator[Any]:
    """Epoch after epoch of a map-style dataset; an IterableDataset's stream once, which must last."""
    if isinstance(loader.dataset, IterableDataset):
        n = 0
        for batch in loader:
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


@torch.no_grad()
def _validate(
    model: nn.Module, wl: Workload, cfg: TrialConfig, prec: Precision, device: torch.device, pin: bool,
    step: Callable[[nn.Module, Any], Any], count: Callable[[Any], int],
) -> dict[str, float]:
    """`loss/val` and the workload's `eval/<name>` metrics, each the item-weighted mean over the
    whole validation set (every rank's shard), so a token-mean loss stays a token mean."""
    rank, world = _world()
    loader, _ = _make_loader(wl, cfg, pin, train=False, rank=rank, world=world)
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    extra: dict[str, torch.Tensor] = {}
    extra_items: dict[str, int] = {}
    count_sum = 0
    channels_last = device.type == "cuda" and wl.channels_last
    for batch in loader:
        n = checked_count(count, batch)
        moved = move_to_device(batch, device, pin, channels_last)
        with prec.autocast():
            total += loss_of(step(model, moved), training=False).double() * n
            values = checked_eval(wl.eval_fn(model, moved)) if wl.eval_fn is not None else {}
        if wl.eval_fn is not None and count_sum and set(values) != set(extra):
            raise WorkloadError(f"eval_fn returned {sorted(values)} for one batch and {sorted(extra)} for another: "
                                "return the same names for every batch")
        for name, value in values.items():
            v = value.detach().double().reshape(()) if isinstance(value, torch.Tensor) else float(value)
            extra[name] = extra.get(name, torch.zeros((), dtype=torch.float64, device=device)) + v * n
            extra_items[name] = extra_items.get(name, 0) + n  # each name's own weight
        count_sum += n
    model.train()
    names = sorted(extra)
    if world > 1:  # a rank whose shard was empty has no names: agree on them before summing
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, names)
        names = sorted({n for g in gathered for n in g})
    sums = _all_reduce([total.item(), float(count_sum), *[extra[n].item() if n in extra else 0.0 for n in names],
                        *[float(extra_items.get(n, 0)) for n in names]], device)
    if sums[1] == 0:
        raise WorkloadError("the validation set gave no batches on any rank: give a non-empty val_dataset")
    out = {contract.LOSS_VAL: sums[0] / sums[1]}
    k = len(names)
    out.update({f"{contract.EVAL_PREFIX}{n}": v / w for n, v, w in zip(names, sums[2:2 + k], sums[2 + k:], strict=True)
                if w > 0})
    return out


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


def _gpu_layout(device: torch.device, precision: str, world: int) -> tuple[float | None, dict[str, str]]:
    """Every rank's GPU model and UUID (all ranks call this): the trial's summed peak FLOP/s and tags."""
    if device.type != "cuda":
        return None, {}
    mine = (torch.cuda.get_device_name(device), str(getattr(torch.cuda.get_device_properties(device), "uuid", device)))
    devices: list[Any] = [mine]
    if world > 1:
        devices = [None] * world
        dist.all_gather_object(devices, mine)
    return cluster_peak([tuple(d) for d in devices], precision)


def _count_flops(wl: Workload, model: nn.Module, cfg: TrialConfig, device: torch.device,
                 step: Callable[[nn.Module, Any], Any], count: Callable[[Any], int]) -> float | None:
    """Training FLOPs per item of a workload that does not declare them: counted once by
    `torch.utils.flop_counter` on one validation batch, on the bare model before DDP wraps it."""
    loader = DataLoader(wl.val_dataset, batch_size=cfg.batch_size, collate_fn=wl.collate_fn)
    batch = next(iter(loader), None)
    if batch is None:
        return None
    return flops_per_item(model, step, move_to_device(batch, device), count)


def _flops_metrics(final: dict[str, Any], wl: Workload, peak: float | None, per_item: float | None) -> dict[str, float]:
    """Achieved TFLOP/s where the FLOPs per item are known (declared or counted); MFU where every
    rank's peak is known too."""
    if per_item is None:
        return {}
    achieved = final[contract.throughput_key(wl.unit)] * per_item
    out = {contract.TFLOPS: achieved / 1e12}
    if peak is not None:
        out[contract.MFU_PCT] = 100.0 * achieved / peak
    return out


def _save_state(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any, scheduler: Any,
                measured: int) -> None:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else {},
                "scheduler": scheduler.state_dict() if scheduler is not None else {}, "measured_steps": measured},
               path / CHECKPOINT_FILE)


def _read_state(path: str, device: torch.device) -> dict[str, Any]:
    """A checkpoint this loop wrote; tensors only (`weights_only`): nothing is unpickled."""
    return torch.load(Path(path) / CHECKPOINT_FILE, map_location=device, weights_only=True)  # type: ignore[no-any-return]


def _apply_state(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any,
                 scheduler: Any) -> None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state["scaler"]:
        scaler.load_state_dict(state["scaler"])
    if scheduler is not None and state.get("scheduler"):
        scheduler.load_state_dict(state["scheduler"])


def _all_ranks_fit(oom: bool, cfg: TrialConfig, device: torch.device) -> None:
    """A memory probe's step: every rank learns whether any rank ran out of memory, and all of them
    raise together (so the group stays healthy and nobody waits for a rank that gave up)."""
    (any_oom,) = _all_reduce([1.0 if oom else 0.0], device, op="max")
    if any_oom:
        where = "this rank" if oom else "another rank"
        raise torch.OutOfMemoryError(f"out of memory at batch_size={cfg.batch_size} ({cfg.precision}) on {where} "
                                     "(memory probe)")


_SUB_WINDOWS = 10  # marks across the measured window for the throughput's spread
_MAX_EXTENSIONS = 20  # times a plan short of min_window_s may be extended when it runs out (a safety bound)


def _data_plan(budget: int, seen_warm: float, warmup_steps: int) -> tuple[int, float]:
    """Equal data: the measured steps that complete `budget` after warm-up saw `seen_warm` items (all
    ranks), and the items the last of them takes (0: a whole step). Warm-up's items per step is the rate."""
    per_step = seen_warm / max(warmup_steps, 1)
    remaining = budget - seen_warm
    if remaining <= 0 or per_step <= 0:  # warm-up alone used the budget: one measured step, whole
        return 1, 0.0
    full = math.floor(remaining / per_step + 1e-9)
    last = remaining - full * per_step
    return (full + 1, last) if last > 1e-6 * per_step else (max(1, full), 0.0)


def _tail_micros(need: int, per_micro: int, accum: int) -> int:
    """Micro-batches the last step of an equal-data budget runs to take `need` items on this rank
    (the same on every rank: both figures are)."""
    return min(accum, max(1, math.ceil(need / max(per_micro, 1))))


def _spread(marks: list[tuple[float, int, int]], device: torch.device) -> float | None:
    """The throughput's coefficient of variation (%) over sub-windows of equal steps (items summed over
    ranks, each span the slowest rank's); absent with fewer than 3. Marks taken before an extension of
    the plan are denser: they are merged so every sub-window spans about as many steps as the last."""
    if len(marks) < 4:
        return None
    width = marks[-1][2] - marks[-2][2]
    kept = [marks[0]]
    for m in marks[1:]:
        if m[2] - kept[-1][2] >= width or m is marks[-1]:
            kept.append(m)
    if len(kept) < 4:
        return None
    pairs = list(zip(kept, kept[1:], strict=False))
    spans = _all_reduce([b[0] - a[0] for a, b in pairs], device, op="max")
    items = _all_reduce([float(b[1] - a[1]) for a, b in pairs], device)
    rates = [i / s for i, s in zip(items, spans, strict=True) if s > 0]
    if len(rates) < 3 or statistics.fmean(rates) <= 0:
        return None
    return 100.0 * statistics.stdev(rates) / statistics.fmean(rates)


def _make_optimizer(wl: Workload, model: nn.Module, cfg: TrialConfig, device: torch.device) -> torch.optim.Optimizer:
    if wl.optimizer_fn is None:
        return torch.optim.AdamW(model.parameters(), lr=cfg.lr, fused=device.type == "cuda")
    optimizer = wl.optimizer_fn(model, cfg.lr)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise WorkloadError(f"optimizer_fn returned {type(optimizer).__name__}, not a torch.optim.Optimizer: build "
                            "one over model's parameters with the lr it is given")
    return optimizer


def _make_schedule(optimizer: torch.optim.Optimizer, cfg: TrialConfig,
                   plan: list[int] | None = None) -> torch.optim.lr_scheduler.LambdaLR | None:
    """Linear warm-up over `lr_warmup_steps`, then constant or cosine to 0 at the trial's last step.
    Multiplies each param group's own lr, so a workload's per-group rates keep their ratios.
    `plan[0]` is the measured steps, read at each step (the loop sets it when warm-up ends)."""
    warm, plan = cfg.lr_warmup_steps, plan if plan is not None else [cfg.num_steps]
    if warm == 0 and cfg.lr_schedule == "constant":
        return None

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if cfg.lr_schedule == "cosine":
            total = cfg.num_warmup_steps + plan[0]
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def train(cfg: TrialConfig, reporter: Reporter, device: torch.device, facts: dict[str, str] | None = None,
          resume_from: str | None = None) -> dict[str, Any]:
    """Train `cfg.num_warmup_steps + cfg.num_steps` steps and return the final report.

    `facts` (strings, e.g. the launcher's node id) join rank 0's device facts in the final report.
    With `cfg.checkpoint_every_steps`, every that many measured steps rank 0 saves model, optimizer,
    scaler and schedule state and hands it to the reporter with that report; `resume_from` (a
    directory holding such a checkpoint) continues from it: warm-up runs again (fresh process, cold
    caches) and is then undone by restoring the checkpoint, then only the measured steps still
    missing run, and throughput is measured over those alone.

    An exception leaving the loop carries `sweeps_where`: the phase, step and micro-batch it was
    raised at, so a warm group can tell whether all its ranks stopped at the same collective."""
    where: list[Any] = ["setup"]
    try:
        return _train(cfg, reporter, device, facts, resume_from, where)
    except BaseException as exc:
        try:
            exc.sweeps_where = tuple(where)  # type: ignore[attr-defined]
        except AttributeError:  # an exception type without a __dict__: treated as "unknown"
            pass
        raise


def _train(cfg: TrialConfig, reporter: Reporter, device: torch.device, facts: dict[str, str] | None,
           resume_from: str | None, where: list[Any]) -> dict[str, Any]:
    loop_t0 = time.perf_counter()
    rank, world = _world()
    torch.set_num_threads(cfg.threads_per_worker)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(cfg.seed)
    prec = resolve_precision(cfg.precision, device, cfg.tf32_under_autocast)  # before any work: unsupported fails fast
    precision_flags = prec.apply_matmul_flags()
    if cfg.tf32_under_autocast and device.type != "cuda" and rank == 0:
        warnings.warn("tf32_under_autocast has no effect without CUDA (a CPU has no TF32)", stacklevel=2)

    wl = registry.build(cfg.workload, cfg.workload_params, BuildContext(cfg.data_dir, cfg.seed, rank, world))
    model = wl.model.to(device)
    channels_last = device.type == "cuda" and wl.channels_last
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    step_fn = wl.step_fn or xy_step(wl.loss_fn)  # type: ignore[arg-type]  # check() ensured one of them
    count = wl.count_items or default_counter(wl.items_per_sample)
    flops_item, flops_source = wl.flops_per_item, "declared"
    if flops_item is None and rank == 0 and not cfg.probe:  # rank 0 reports; before DDP sees a backward
        flops_item, flops_source = _count_flops(wl, model, cfg, device, step_fn, count), "counted"
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) if world > 1 else None
    # Compile the DDP-wrapped model (PyTorch's guidance): DDP's optimizer splits the graph at its
    # buckets, so the gradient all-reduce still overlaps backward.
    ddp_model: nn.Module = ddp if ddp is not None else model
    if cfg.compile:
        ddp_model = torch.compile(ddp_model)  # type: ignore[assignment]
    # Gradient noise scale: DDP ranks read it in the all-reduce hook; one rank from its micro-batches
    noise: NoiseScale | None = None
    accum = cfg.grad_accum_steps
    if cfg.grad_noise_scale and not cfg.probe and (ddp is not None or accum > 1):
        noise = NoiseScale(device)
        if ddp is not None:
            ddp.register_comm_hook((noise, world), ddp_hook)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _make_optimizer(wl, model, cfg, device)
    plan = [cfg.num_steps]  # measured steps; an item budget or min_window_s replans them when warm-up ends
    horizon = [cfg.num_steps]  # the LR schedule's measured steps: the plan as warm-up ends, never moved after
    scheduler = _make_schedule(optimizer, cfg, horizon)
    scaler = prec.make_scaler()
    # Read now (the steps still to run), applied when warm-up ends: warm-up's updates are undone
    # and the schedule continues where the checkpoint left it.
    state = _read_state(resume_from, device) if resume_from else None
    done_before = int(state["measured_steps"]) if state is not None else 0
    pin = cfg.pin_memory and device.type == "cuda"
    if cfg.pin_memory and not pin and rank == 0:
        warnings.warn("pin_memory=True has no effect without CUDA; running unpinned", stacklevel=2)
    loader, sampler = _make_loader(wl, cfg, pin, train=True, rank=rank, world=world)
    batches = _batches(loader, sampler, needed=lambda: (cfg.num_warmup_steps + plan[0] - done_before) * accum)
    timer = StepTimer(device)
    telemetry = Telemetry(device, cfg.telemetry_period_s) if cfg.telemetry_period_s > 0 else None
    unit = wl.unit

    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    loss_count = 0
    items = 0  # counted in the measured window
    seen = 0  # counted since step 0, warm-up included (this rank)
    copied = 0  # host->device bytes in the measured window (this rank; CUDA only: on a CPU nothing is copied)
    report_every = cfg.num_steps  # refined after warm-up from the measured step time
    evals, eval_s, target_best, reached, last_eval = 0, 0.0, None, None, None  # periodic evaluation
    warm_t0 = 0.0
    mark = (0.0, 0, 0, 0.0, 0)  # (elapsed, steps, items, data wait, bytes copied) at the previous report
    # the clock sets the length only for a fixed step count: a data budget or a target rules otherwise
    by_clock = cfg.min_window_s > 0 and not cfg.num_items and cfg.target_metric is None
    extended = 0  # times the plan was found short of min_window_s when it ran out
    checked = (0.0, 0)  # (window, measured steps) at the last such check
    tail: tuple[int, int] | None = None  # equal data: (last step, items this rank takes in it)
    marks: list[tuple[float, int, int]] = []  # (elapsed, items, steps) at each mark: the throughput's spread
    sub_every = 1
    warm_end = 0.0  # the loop's clock when the measured window began
    seen_per_micro = 1  # items of one micro-batch per rank, as warm-up counted them (equal-data tail)

    def window_metrics(final: bool = False) -> dict[str, Any]:
        """One window per report: an interim report covers the steps since the previous report
        (throughput, step time, data wait, telemetry and energy alike); the final one the whole
        measured window. loss/train is the mean over the steps since the previous report."""
        nonlocal loss_sum, loss_count, mark
        elapsed = timer.elapsed_s()
        if final and telemetry is not None:
            telemetry.stop()
        t0, steps0, items0, wait0, bytes0 = (0.0, 0, 0, 0.0, 0) if final else mark
        mark = (elapsed, timer.steps, items, timer.data_wait_s, copied)
        span, steps = elapsed - t0, timer.steps - steps0
        noise_sums = noise.window_sums() if noise is not None else [0.0, 0.0, 0.0]
        summed = _all_reduce([float(items - items0), (timer.data_wait_s - wait0) / max(span, 1e-12),
                              loss_sum.item(), float(loss_count), *noise_sums, float(copied - bytes0)], device)
        (max_span,) = _all_reduce([span], device, op="max")
        spread = _spread(marks, device) if final else None
        window_items, wait_share, losses, counts, small_sq, big_sq, noise_steps, window_bytes = summed
        train_loss = losses / max(counts, 1.0)
        if not math.isfinite(train_loss):
            raise DivergedError(f"training loss became {train_loss} by measured step {timer.steps}")
        loss_sum, loss_count = torch.zeros_like(loss_sum), 0
        measured = _telemetry_metrics(telemetry, span, since_last=not final, world=world)
        if contract.CPU_WORKER_PCT in measured and contract.CPU_LOADERS_PCT in measured:  # cores busy, all ranks
            measured[contract.CPU_CORES_USED] = world * (measured[contract.CPU_WORKER_PCT]
                                                         + measured[contract.CPU_LOADERS_PCT]) / 100.0
        if "energy/total_j" in measured and window_items > 0:
            measured[contract.energy_key(unit)] = 1000.0 * measured["energy/total_j"] / window_items
        if device.type == "cuda" and window_bytes > 0:  # mean per rank, per second of the window
            measured[contract.H2D_GB_PER_S] = window_bytes / world / max(max_span, 1e-12) / 1e9
        if noise is not None and steps > 0:
            # every rank's big norm is the same; the small ones are averaged over ranks
            b_big = window_items / steps  # items per optimizer step, all ranks
            b_small = b_big / (world if ddp is not None else accum)
            per = max(noise_steps / world, 0.0)
            b_simple = noise.update(small_sq / max(noise_steps, 1.0), big_sq / max(noise_steps, 1.0), per,
                                    b_small, b_big)
            if b_simple is not None:
                measured[contract.GRAD_NOISE_SCALE] = b_simple
        if spread is not None:
            measured[contract.throughput_cv_key(unit)] = spread
        if final:
            measured[contract.WINDOW_S] = max_span
        return measured | {
            contract.throughput_key(unit): window_items / max_span,
            contract.per_worker_throughput_key(unit): window_items / max_span / world,
            contract.LOSS_TRAIN: train_loss,
            contract.STEP_TIME_MS: 1000.0 * max_span / max(steps, 1),
            contract.DATA_WAIT_PCT: 100.0 * wait_share / world,
            contract.STEPS: done_before + timer.steps,
            contract.WORLD_SIZE: world,
            contract.FINAL: 0,
        }

    model.train()
    # time-to-target counts from the first step (evaluations included)
    train_t0 = timer.now(sync=True) if cfg.target_metric is not None else 0.0
    step = 0
    try:
        while step < cfg.num_warmup_steps + plan[0] - done_before:
            if step == cfg.num_warmup_steps:
                if cfg.num_items:  # equal data: the measured steps that complete the budget, same on every rank
                    (seen_warm,) = _all_reduce([float(seen)], device)
                    plan[0], last_items = _data_plan(cfg.num_items, seen_warm, cfg.num_warmup_steps)
                    # a micro-batch's items per rank (warm-up's mean over ranks): every rank runs as many in the tail
                    seen_per_micro = max(1, round(seen_warm / (world * accum * max(cfg.num_warmup_steps, 1))))
                    if last_items:  # the last step takes only what completes the budget (ceil: within a sample per rank)
                        tail = (cfg.num_warmup_steps + plan[0] - done_before - 1, math.ceil(last_items / world))
                if state is not None:  # resumed: undo warm-up's updates, continue from the checkpoint
                    _apply_state(state, model, optimizer, scaler, scheduler)
                    state = None
                if step >= 2:  # warm-up long enough to time: report about every report_interval_s
                    (warm_step_s,) = _all_reduce([(timer.now(sync=True) - warm_t0) / (step - 1)], device, op="max")
                    report_every = max(1, int(cfg.report_interval_s / max(warm_step_s, 1e-9)))
                    if by_clock:  # calibrated: enough steps for min_window_s (checked again when they run out)
                        plan[0] = max(plan[0], done_before + math.ceil(cfg.min_window_s / max(warm_step_s, 1e-9)))
                sub_every = max(1, (plan[0] - done_before) // _SUB_WINDOWS)
                horizon[0] = plan[0]  # a later extension for min_window_s runs on at the schedule's end
                timer.start()
                warm_end = time.perf_counter()
                marks.append((0.0, 0, 0))
                if telemetry is not None:
                    telemetry.start()
            elif step == 1:
                warm_t0 = timer.now(sync=True)  # step 0 (allocations, loader start-up) is not representative
            oom = False
            # the last step of an equal-data budget: the micro-batches, and the items of this rank, it still needs
            micros, need = (accum, 0) if tail is None or step != tail[0] else (
                _tail_micros(tail[1], seen_per_micro, accum), tail[1])
            try:
                for micro in range(micros):
                    where[:] = ["step", step, micro]
                    with timer.data_wait():
                        batch = next(batches)
                    n = checked_count(count, batch)
                    # cut the last micro-batch to what completes the budget; not a compiled model's: a new
                    # batch shape would recompile inside the measured window (then it is used whole)
                    if need and micro == micros - 1 and n > need and not cfg.compile:
                        cut = take_items(batch, n, need)
                        if cut is not None:
                            batch, n = cut, checked_count(count, cut)
                    need = max(0, need - n)
                    seen += n
                    with telemetry.h2d_copy(timer.measuring) if telemetry is not None else contextlib.nullcontext():
                        moved = move_to_device(batch, device, pin, channels_last)
                    # DDP all-reduces gradients on the last micro-batch only; never in a memory probe,
                    # where a rank that runs out of memory must not leave its peers in that all-reduce
                    sync = micro == micros - 1 and not cfg.probe
                    with ddp.no_sync() if ddp is not None and not sync else contextlib.nullcontext():
                        with prec.autocast():
                            loss = loss_of(step_fn(ddp_model, moved), training=True)
                        scaled = loss / micros if micros > 1 else loss
                        (scaler.scale(scaled) if scaler is not None else scaled).backward()
                    if noise is not None and ddp is None and timer.measuring and micros == accum and micro in (0, accum - 1):
                        # one rank: the first micro-batch's gradient is the small batch, the step the big one
                        if micro == 0:
                            noise.add_small(grads_sq(params) * accum * accum)
                        else:
                            noise.add_big(grads_sq(params))
                    if timer.measuring:
                        items += n
                        if device.type == "cuda":
                            copied += tensor_bytes(batch)
                        loss_sum += loss.detach().float() / micros
                where[:] = ["optimizer", step]
                if scaler is not None:
                    if cfg.max_grad_norm > 0 or cfg.probe:
                        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                    if cfg.max_grad_norm > 0:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    if cfg.probe:  # a probe must allocate the optimizer's state even when the scaler would skip
                        optimizer.step()
                    else:
                        scaler.step(optimizer)
                    scaler.update()
                else:
                    if cfg.max_grad_norm > 0:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    optimizer.step()
            except torch.OutOfMemoryError:
                if not cfg.probe:
                    raise
                oom = True
                optimizer.zero_grad(set_to_none=True)
            if cfg.probe:
                where[:] = ["probe-agree", step]
                _all_ranks_fit(oom, cfg, device)
            if noise is not None:  # a cut last step is not the batch size the estimate assumes
                noise.commit(keep=timer.measuring and micros == accum and (tail is None or step != tail[0]))
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            evaluated: dict[str, Any] = {}  # this step's evaluation, for the report after it
            if cfg.eval_every_steps and step % cfg.eval_every_steps == 0:  # same decision on every rank
                where[:] = ["evaluate", step]
                with timer.paused() as t_eval:
                    last_eval = _validate(model, wl, cfg, prec, device, pin, step_fn, count)
                    now = timer.now(sync=True)
                evals, eval_s = evals + 1, eval_s + (now - t_eval)
                if cfg.report_evals:  # the quality curve over the time-to-target clock, for ASHA
                    evaluated = {**last_eval, contract.ELAPSED_S: now - train_t0}
                value = last_eval.get(cfg.target_metric) if cfg.target_metric else None
                if value is not None and math.isfinite(value):
                    better = (cfg.target_max is not None and value < target_best) or (
                        cfg.target_min is not None and value > target_best) if target_best is not None else True
                    target_best = value if better else target_best
                if cfg.target_met(value):  # all ranks hold the same all-reduced value: all stop here
                    reached = (now - train_t0, step)
            if timer.measuring:
                loss_count += 1
                timer.step_done()
                if timer.steps % sub_every == 0:
                    marks.append((timer.elapsed_s(), items, timer.steps))
                total = done_before + timer.steps
                if by_clock and total == plan[0] and extended < _MAX_EXTENSIONS:  # same decision on every rank
                    (window,) = _all_reduce([timer.elapsed_s()], device, op="max")
                    if window < cfg.min_window_s:  # the warm-up's calibration was optimistic (or absent): run on
                        # at the rate since the last check (a stall early in the window would make the mean
                        # step look slow and the extension short)
                        rate = (window - checked[0]) / max(timer.steps - checked[1], 1)
                        plan[0] += max(1, math.ceil((cfg.min_window_s - window) / max(rate, 1e-9) * 1.05))
                        extended, checked = extended + 1, (window, timer.steps)
                        sub_every = max(sub_every, (plan[0] - done_before) // _SUB_WINDOWS)  # ~10 marks still
                every = cfg.checkpoint_every_steps
                where[:] = ["report", step]
                if reached is not None:
                    pass  # the target is met: the final report follows
                elif every and total % every == 0 and total < plan[0]:  # same decision on every rank
                    with tempfile.TemporaryDirectory(prefix="ckpt-") as tmp:
                        if rank == 0:
                            _save_state(Path(tmp), model, optimizer, scaler, scheduler, total)
                        reporter.report(window_metrics(), checkpoint_dir=tmp if rank == 0 else None)
                elif (evaluated or timer.steps % report_every == 0) and total < plan[0]:
                    # with report_evals, after each evaluation too: the curve ASHA compares trials on
                    reporter.report({**window_metrics(), **evaluated})
            if reached is not None:
                break
        where[:] = ["final"]
        # a target met during warm-up leaves no measured window: no throughput, honestly absent
        final: dict[str, Any] = window_metrics(final=True) if timer.measuring else {
            contract.STEPS: 0, contract.WORLD_SIZE: world, contract.FINAL: 0}
    except BaseException:  # stop loader workers now: a kept traceback would keep them registered
        _close_loader(loader, batches)
        if telemetry is not None:  # and the sampler thread (a warm worker goes on to the next trial)
            telemetry.stop()
        raise
    _close_loader(loader, batches)  # after the last telemetry sample, which counts loader CPU
    where[:] = ["validate"]
    if not cfg.probe:  # a memory probe only asks whether the training step fits
        # the unwrapped model: DDP's forward may broadcast buffers (BatchNorm), and ranks whose
        # validation shards differ in batches would then pair mismatched collectives
        final.update(last_eval if reached is not None and last_eval is not None
                     else _validate(model, wl, cfg, prec, device, pin, step_fn, count))
        if not math.isfinite(final[contract.LOSS_VAL]):
            raise DivergedError(f"validation loss is {final[contract.LOSS_VAL]}")
    peak, gpu_facts = _gpu_layout(device, cfg.precision, world)
    if contract.throughput_key(wl.unit) in final:
        final.update(_flops_metrics(final, wl, peak, flops_item))
        if flops_item is not None:
            final["perf/flops_source"] = flops_source  # a tag: declared by the workload, or counted
    (seen_all,) = _all_reduce([float(seen)], device)
    final[contract.seen_key(unit)] = int(seen_all)
    if cfg.eval_every_steps:
        final.update({contract.EVALS: evals, contract.EVAL_TOTAL_S: eval_s})
        if target_best is not None:
            final[contract.TARGET_BEST] = target_best
        if reached is not None:
            final[contract.TIME_TO_TARGET_S], final[contract.STEPS_TO_TARGET] = reached
    final[contract.FINAL] = 1
    if done_before:
        final[contract.RESTORED_FROM] = done_before
    (final[contract.LOOP_S],) = _all_reduce([time.perf_counter() - loop_t0], device, op="max")
    if warm_end:  # before the measured window: build, loader start-up, compile, warm-up steps
        (final[contract.WARMUP_S],) = _all_reduce([warm_end - loop_t0], device, op="max")
    if rank == 0:
        final.update(device_facts(device) | precision_flags)
        if telemetry is not None:
            final.update(telemetry.facts)
        final.update(gpu_facts)  # device/gpu_count counts GPUs (by UUID), not ranks
        final.update(facts or {})
    reporter.report(final)
    return final
