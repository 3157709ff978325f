"""THE per-worker training loop: DDP + AMP, shared by every workload.

Runs the same under Ray Train (which sets up the process group) and plain `torchrun`.
Order per optimizer step, as in nanoGPT: for each of `grad_accum_steps` micro-batches, fetch
(timed as data wait) -> count items -> copy to device -> autocast step_fn -> scaled backward
(DDP's gradient all-reduce only on the last micro-batch) -> then unscale/clip -> step/update ->
LR schedule -> zero_grad(set_to_none=True).

`_train` is the spine: build, then steps until the trial's length says stop, then the final
report. Each concern owns its state in a small component and answers "is it due?" with a pure
check; the spine makes every collective call itself, in one fixed order, each under its own
`where` label (the warm pool compares them across ranks):

  warmup-box (max_warmup_s: MAX warm-up seconds, before each warm-up step from step 2) ->
  boundary (equal data: SUM items; MAX warm-up step time) -> per step: DDP backward ->
  probe-agree (MAX oom) -> evaluate -> extend (MAX window) / window-cap (MAX window) ->
  report (SUM, MAX, telemetry gather; a barrier under Ray) -> checkpoint (a barrier after rank 0's save:
  no rank's clock counts it, under torchrun too) -> final -> validate -> facts.

The DDP comm hook (noise_scale.py) adds no collective of its own: it wraps DDP's gradient
all-reduce, reading the noise scale's norms and the time backward waited for it (`CommTimer`),
which the report's SUM carries.

Components: `TrialLength` (length.py: warm-up, the measured-step plan, the LR horizon, the
equal-data tail, `min_window_s`/`max_window_s`/`max_warmup_s`), `MeasuredWindow` (window.py:
timer, counters, marks, the reports), `Evaluator` (evaluate.py: periodic evaluation, target),
`Checkpointer` (checkpoint.py), `Precision` (precision.py: autocast, backward, unscale/clip/step).

Host syncs: none per step on the loop's side (losses accumulate on the device; items are counted
on the host copy of the batch). They happen in warm-up (to time a real step), at each report
(every `report_every` steps, agreed by all ranks), at the ~10 sub-window marks of the measured
window (the throughput's spread, and the `max_window_s` check) and in validation.

Equal data: with `num_items` the last optimizer step takes only the items that complete the
budget (fewer micro-batches, the last one cut to the samples needed), so trials of any batch size
see the same data within a sample or two per rank; a batch that cannot be cut
(`batches.take_items`), or any batch of a compiled model (a new shape would recompile inside the
window), is used whole. A user's `count_items` or `step_fn` may add its own syncs (e.g. `.item()`):
that is theirs to avoid.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Subset

from trainables import contract, registry
from trainables.batches import (
    checked_count,
    default_counter,
    loss_of,
    move_to_device,
    take_items,
    tensor_bytes,
    xy_step,
)
from trainables.checkpoint import Checkpointer
from trainables.contract import TrialConfig
from trainables.devinfo import device_facts
from trainables.errors import DivergedError, WorkloadError
from trainables.evaluate import Evaluator, validate
from trainables.flop_count import flops_per_item
from trainables.flops import cluster_peak
from trainables.length import TrialLength
from trainables.noise_scale import CommTimer, HookState, NoiseScale, ddp_hook, grads_sq
from trainables.precision import Precision, resolve_precision
from trainables.reporting import Reporter
from trainables.telemetry import Telemetry
from trainables.window import MeasuredWindow, all_reduce, spread, world
from trainables.workloads.base import BuildContext, Workload, prepared

_spread = spread  # the name tests import from here


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
        for batch in _handed_over(loader):
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
        yield from _handed_over(loader)
        epoch += 1


def _handed_over(loader: DataLoader[Any]) -> Iterator[Any]:
    """The loader's batches. A worker that dies while it hands a batch over through shared memory can
    surface as the hand-over's connection reset rather than as torch's "DataLoader worker (pid(s) ...)
    exited unexpectedly" (seen on a loaded 2-core machine): said the same way, so it reads, and is
    classified, as the loader failure it is."""
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


def _gpu_layout(device: torch.device, precision: str, world: int) -> tuple[float | None, dict[str, str]]:
    """Every rank's GPU model and UUID (all ranks call this): the trial's summed peak FLOP/s and tags."""
    if device.type != "cuda":
        return None, {}
    mine = (torch.cuda.get_device_name(device), str(getattr(torch.cuda.get_device_properties(device), "uuid", device)))
    devices: list[Any] = [mine]
    if world > 1:
        devices = [None] * world
        torch.distributed.all_gather_object(devices, mine)
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


def _make_optimizer(wl: Workload, model: nn.Module, cfg: TrialConfig, device: torch.device) -> torch.optim.Optimizer:
    if wl.optimizer_fn is None:
        return torch.optim.AdamW(model.parameters(), lr=cfg.lr, fused=device.type == "cuda")
    optimizer = wl.optimizer_fn(model, cfg.lr)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise WorkloadError(f"optimizer_fn returned {type(optimizer).__name__}, not a torch.optim.Optimizer: build "
                            "one over model's parameters with the lr it is given")
    return optimizer


def _make_schedule(optimizer: torch.optim.Optimizer, cfg: TrialConfig,
                   length: TrialLength | None = None) -> torch.optim.lr_scheduler.LambdaLR | None:
    """Linear warm-up over `lr_warmup_steps`, then constant or cosine to 0 at the trial's last step.
    Multiplies each param group's own lr, so a workload's per-group rates keep their ratios.
    The trial's length (warm-up steps, the measured steps' horizon) is read at each step: warm-up
    ending sets it."""
    warm, length = cfg.lr_warmup_steps, length if length is not None else TrialLength(cfg, 1)
    if warm == 0 and cfg.lr_schedule == "constant":
        return None

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if cfg.lr_schedule == "cosine":
            total = length.lr_end if length.lr_end is not None else length.warmup_steps + length.horizon
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)




@dataclass
class _Trial:
    """What one trial is built from. `model` is the bare module (clipping, state_dict, validation,
    FLOP counting), `ddp` the DDP wrapper (no_sync, the comm hook), `forward_model` what the training
    forward calls (the compiled DDP model when compiling)."""

    cfg: TrialConfig
    device: torch.device
    rank: int
    world: int
    wl: Workload
    prec: Precision
    model: nn.Module
    ddp: DistributedDataParallel | None
    forward_model: nn.Module
    step_fn: Callable[[nn.Module, Any], Any]
    count: Callable[[Any], int]
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    pin: bool
    channels_last: bool
    noise: NoiseScale | None
    comm: CommTimer | None
    params: list[nn.Parameter]
    flops: tuple[float | None, str]
    tags: dict[str, str]
    telemetry: Telemetry | None
    build_s: float = 0.0  # this rank's `_build`: workload and its data, model to device, FLOPs, DDP, optimizer
    data_prep_s: float = 0.0  # of which making data files once per node (`ensure_cached`): no later trial repeats it
    data_cached: int = 0  # `ensure_cached` calls in the build: 0 where the workload keeps its data some other way


def _build(cfg: TrialConfig, device: torch.device) -> _Trial:
    t0, (prep0, calls0) = time.perf_counter(), prepared()
    rank, world_size = world()
    if cfg.num_workers and cfg.num_workers != world_size:  # the service routes each trial to a group of its size
        raise RuntimeError(f"this trial is for {cfg.num_workers} rank(s) but runs on {world_size}")
    torch.set_num_threads(cfg.threads_per_worker)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(cfg.seed)
    prec = resolve_precision(cfg.precision, device, cfg.tf32_under_autocast)  # before any work: unsupported fails fast
    tags = prec.apply_matmul_flags()
    if cfg.tf32_under_autocast and device.type != "cuda" and rank == 0:
        warnings.warn("tf32_under_autocast has no effect without CUDA (a CPU has no TF32)", stacklevel=3)
    wl = registry.build(cfg.workload, cfg.workload_params, BuildContext(cfg.data_dir, cfg.seed, rank, world_size))
    model = wl.model.to(device)
    channels_last = device.type == "cuda" and wl.channels_last
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    step_fn = wl.step_fn or xy_step(wl.loss_fn)  # type: ignore[arg-type]  # check() ensured one of them
    count = wl.count_items or default_counter(wl.items_per_sample)
    flops: tuple[float | None, str] = (wl.flops_per_item, "declared")
    if flops[0] is None and rank == 0 and not cfg.probe:  # rank 0 reports; before DDP sees a backward
        flops = (_count_flops(wl, model, cfg, device, step_fn, count), "counted")
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if world_size > 1 else None
    # Compile the DDP-wrapped model (PyTorch's guidance): DDP's optimizer splits the graph at its
    # buckets, so the gradient all-reduce still overlaps backward.
    forward_model: nn.Module = ddp if ddp is not None else model
    if cfg.compile:
        forward_model = torch.compile(forward_model)  # type: ignore[assignment]
    # Gradient noise scale: DDP ranks read it in the all-reduce hook; one rank from its micro-batches.
    # The same hook times the all-reduce wait backward did not hide (DDP takes one hook).
    noise: NoiseScale | None = None
    if cfg.grad_noise_scale and not cfg.probe and (ddp is not None or cfg.grad_accum_steps > 1):
        noise = NoiseScale(device)
    comm = CommTimer(device) if ddp is not None and not cfg.probe else None
    if ddp is not None and (noise is not None or comm is not None):
        ddp.register_comm_hook(HookState(world_size, noise, comm), ddp_hook)
    pin = cfg.pin_memory and device.type == "cuda"
    if cfg.pin_memory and not pin and rank == 0:
        warnings.warn("pin_memory=True has no effect without CUDA; running unpinned", stacklevel=3)
    telemetry = Telemetry(device, cfg.telemetry_period_s) if cfg.telemetry_period_s > 0 else None
    optimizer = _make_optimizer(wl, model, cfg, device)
    prep_s, calls = prepared()
    return _Trial(cfg, device, rank, world_size, wl, prec, model, ddp, forward_model, step_fn, count, optimizer,
                  prec.make_scaler(), pin, channels_last, noise, comm, [p for p in model.parameters() if p.requires_grad],
                  flops, tags, telemetry, build_s=time.perf_counter() - t0, data_prep_s=prep_s - prep0,
                  data_cached=calls - calls0)


class Where:
    """Where a rank is in the loop: the phase, then the step (and micro-batch) as the spine sets it.
    An exception leaving the loop carries `label` as `sweeps_where`."""

    __slots__ = ("label",)

    def __init__(self, *label: Any) -> None:
        self.label: tuple[Any, ...] = label

    def at(self, *label: Any) -> None:
        self.label = label


def _run_step(t: _Trial, batches: Iterator[Any], win: MeasuredWindow, micros: int, need: int, where: Where,
              step: int) -> int:
    """One optimizer step of `micros` micro-batches (the last cut to `need` items on this rank, when
    given); returns the items it took."""
    cfg, accum, seen = t.cfg, t.cfg.grad_accum_steps, 0
    for micro in range(micros):
        where.at("step", step, micro)
        with win.timer.data_wait():
            batch = next(batches)
        n = checked_count(t.count, batch)
        # cut the last micro-batch to what completes the budget; not a compiled model's: a new
        # batch shape would recompile inside the measured window (then it is used whole)
        if need and micro == micros - 1 and n > need and not cfg.compile:
            cut = take_items(batch, n, need)
            if cut is not None:
                batch, n = cut, checked_count(t.count, cut)
        need = max(0, need - n)
        with t.telemetry.h2d_copy(win.measuring) if t.telemetry is not None else contextlib.nullcontext():
            moved = move_to_device(batch, t.device, t.pin, t.channels_last)
        # DDP all-reduces gradients on the last micro-batch only; never in a memory probe,
        # where a rank that runs out of memory must not leave its peers in that all-reduce
        sync = micro == micros - 1 and not cfg.probe
        with t.ddp.no_sync() if t.ddp is not None and not sync else contextlib.nullcontext():
            with t.prec.autocast():
                loss = loss_of(t.step_fn(t.forward_model, moved), training=True)
            t.prec.backward(loss / micros if micros > 1 else loss, t.scaler)
        if sync and t.comm is not None:  # backward returned once the all-reduce had: the wait it did not hide
            t.comm.backward_done(keep=win.measuring)
        if t.noise is not None and t.ddp is None and win.measuring and micros == accum and micro in (0, accum - 1):
            # one rank: the first micro-batch's gradient is the small batch, the step the big one
            if micro == 0:
                t.noise.add_small(grads_sq(t.params) * accum * accum)
            else:
                t.noise.add_big(grads_sq(t.params))
        seen += n
        if win.measuring:
            win.count(n, tensor_bytes(batch) if t.device.type == "cuda" else 0, loss, micros)
    where.at("optimizer", step)
    t.prec.step(t.optimizer, t.scaler, t.model, cfg.max_grad_norm, force=cfg.probe)
    return seen


def _step_or_oom(t: _Trial, batches: Iterator[Any], win: MeasuredWindow, micros: int, need: int, where: Where,
                 step: int) -> tuple[int, bool]:
    """`_run_step`: the items it took and whether it ran out of memory, which only a memory probe
    survives (its ranks agree on it next: `_all_ranks_fit`)."""
    try:
        return _run_step(t, batches, win, micros, need, where, step), False
    except torch.OutOfMemoryError:
        if not t.cfg.probe:
            raise
        t.optimizer.zero_grad(set_to_none=True)
        return 0, True


def _all_ranks_fit(oom: bool, cfg: TrialConfig, device: torch.device) -> None:
    """A memory probe's step: every rank learns whether any rank ran out of memory, and all of them
    raise together (so the group stays healthy and nobody waits for a rank that gave up)."""
    (any_oom,) = all_reduce([1.0 if oom else 0.0], device, op="max")
    if any_oom:
        where = "this rank" if oom else "another rank"
        raise torch.OutOfMemoryError(f"out of memory at batch_size={cfg.batch_size} ({cfg.precision}) on {where} "
                                     "(memory probe)")


def train(cfg: TrialConfig, reporter: Reporter, device: torch.device, facts: dict[str, str] | None = None,
          resume_from: str | None = None) -> dict[str, Any]:
    """Train `cfg.num_warmup_steps + cfg.num_steps` steps (or what the trial's length rules instead:
    `trainables.length`) and return the final report.

    `facts` (strings, e.g. the launcher's node id) join rank 0's device facts in the final report.
    With `cfg.checkpoint_every_steps`, every that many measured steps rank 0 saves model, optimizer,
    scaler and schedule state and hands it to the reporter with that report; `resume_from` (a
    directory holding such a checkpoint) continues from it: warm-up runs again (fresh process, cold
    caches) and is then undone by restoring the checkpoint, then only the measured steps still
    missing run, and throughput is measured over those alone.

    An exception leaving the loop carries `sweeps_where`: the phase, step and micro-batch it was
    raised at, so a warm group can tell whether all its ranks stopped at the same collective."""
    where = Where("setup")
    try:
        return _train(cfg, reporter, device, facts, resume_from, where)
    except BaseException as exc:
        try:
            exc.sweeps_where = where.label  # type: ignore[attr-defined]
        except AttributeError:  # an exception type without a __dict__: treated as "unknown"
            pass
        raise


def _train(cfg: TrialConfig, reporter: Reporter, device: torch.device, facts: dict[str, str] | None,
           resume_from: str | None, where: Where) -> dict[str, Any]:
    """The spine: every collective below runs on every rank in this order (module doc)."""
    loop_t0 = time.perf_counter()
    t = _build(cfg, device)
    ckpt = Checkpointer(cfg.checkpoint_every_steps, resume_from, device, t.rank)
    length = TrialLength(cfg, t.world, ckpt.done_before)
    scheduler = _make_schedule(t.optimizer, cfg, length)
    win = MeasuredWindow(device, t.telemetry, t.wl.unit, t.world, t.noise,
                         t.world if t.ddp is not None else cfg.grad_accum_steps, t.comm)
    evals = Evaluator(cfg, win.timer, lambda: _validate(t))
    loader, sampler = _make_loader(t.wl, cfg, t.pin, train=True, rank=t.rank, world=t.world)
    batches = _batches(loader, sampler, needed=length.batches_needed)
    t.model.train()
    evals.start_clock()  # time to target counts from the first step, evaluations included
    step = 0
    try:
        while step < length.last_step():
            if length.warmup_box_due(step):  # max_warmup_s: every rank ends warm-up at the same step
                where.at("warmup-box", step)
                length.box_warmup(step, all_reduce([win.warm_span()], device, op="max")[0])
            if step == length.warmup_steps:  # the measured window begins
                where.at("boundary", step)
                _begin_window(t, length, win, ckpt, scheduler, step)
            elif step == 1:
                win.calibration_starts()
            micros, need = length.micro_plan(step)  # a whole step, or the equal-data budget's cut tail
            seen, oom = _step_or_oom(t, batches, win, micros, need, where, step)
            length.seen += seen
            if cfg.probe:
                where.at("probe-agree", step)
                _all_ranks_fit(oom, cfg, device)
            if t.noise is not None:  # a cut last step is not the batch size the estimate assumes
                t.noise.commit(keep=win.measuring and length.is_whole(step, micros))
            if scheduler is not None:
                scheduler.step()
            t.optimizer.zero_grad(set_to_none=True)
            step += 1
            evaluated: dict[str, Any] = {}  # this step's evaluation, for the report after it
            if evals.due(step):
                where.at("evaluate", step)
                evaluated = evals.run(step)
            if win.measuring:
                _measured_step_done(t, length, win, ckpt, scheduler, reporter, evals, evaluated, where, step)
            if evals.reached is not None:
                break
        where.at("final")
        # a target met during warm-up leaves no measured window: no throughput, honestly absent
        final: dict[str, Any] = win.report(length.total(win.steps), final=True) if win.measuring else {
            contract.STEPS: 0, contract.WORLD_SIZE: t.world, contract.FINAL: 0}
    except BaseException:  # stop loader workers now: a kept traceback would keep them registered
        _close_loader(loader, batches)
        if t.telemetry is not None:  # and the sampler thread (a warm worker goes on to the next trial)
            t.telemetry.stop()
        raise
    _close_loader(loader, batches)  # after the last telemetry sample, which counts loader CPU
    return _finish(final, t, length, win, evals, reporter, facts, where, loop_t0)


def _begin_window(t: _Trial, length: TrialLength, win: MeasuredWindow, ckpt: Checkpointer, scheduler: Any,
                  step: int) -> None:
    """Warm-up ends at `step`: plan the measured steps (equal data: SUM of items; the clock: MAX warm-up
    step time), undo warm-up's updates on a resumed trial, and start the window's clock."""
    cfg, device = t.cfg, t.device
    seen_warm = all_reduce([float(length.seen)], device)[0] if cfg.num_items else None
    ckpt.restore_into(t.model, t.optimizer, t.scaler, scheduler)  # resumed: continue from the checkpoint
    warm_step_s = all_reduce([(win.timer.now(sync=True) - win.warm_t0) / (step - 1)], device, op="max")[0] \
        if step >= 2 else None  # warm-up long enough to time
    sub_every = length.plan(seen_warm, warm_step_s)
    length.fix_lr_end(scheduler.last_epoch if scheduler is not None else step)
    # report about every report_interval_s
    report_every = max(1, int(cfg.report_interval_s / max(warm_step_s, 1e-9))) if warm_step_s else cfg.num_steps
    win.start(sub_every, report_every, warm_step_s * (step - 1) if warm_step_s is not None else None)


def _measured_step_done(t: _Trial, length: TrialLength, win: MeasuredWindow, ckpt: Checkpointer, scheduler: Any,
                        reporter: Reporter, evals: Evaluator, evaluated: dict[str, Any], where: Where,
                        step: int) -> None:
    """A measured step ended: its mark, the clock's say over the length, then a report when one is due
    (with a checkpoint when that is due; none after the last step: the final report follows)."""
    marked = win.step_done()
    measured = win.steps
    if length.extend_due(measured):  # the plan ran out: has the window lasted min_window_s?
        where.at("extend", step)
        if length.extend(all_reduce([win.timer.elapsed_s()], t.device, op="max")[0], measured):
            win.replan(length.sub_every())
    elif length.cap_due(measured, win.sub_windows(), marked):  # has it lasted max_window_s?
        where.at("window-cap", step)
        length.cap(all_reduce([win.timer.box_s()], t.device, op="max")[0], measured)
    where.at("report", step)
    total = length.total(measured)
    if evals.reached is not None or not length.more_after(measured):
        return
    # Handing a report on is the service's time, not training's: left out of the window's clock, as an
    # evaluation is (Ray Train's report waits until its controller took the previous one: up to a poll
    # interval, 0.5 s, which a cold trial reporting every 0.01 s paid at every step), but counted by
    # the time box (`box_s`), which bounds what the trial costs
    if ckpt.due(total):
        metrics = win.report(total)
        with win.timer.paused(report=True):
            ckpt.report(reporter, metrics, t.model, t.optimizer, t.scaler, scheduler, total)
            # rank 0 saved while the others went on: they meet here, paused, and not in the next step's
            # all-reduce, where the save would count (Ray Train's report is a barrier; plain torchrun's is not)
            where.at("checkpoint", step)
            all_reduce([0.0], t.device)
    elif evaluated or win.report_due():  # with report_evals, after each evaluation too: ASHA's curve
        metrics = {**win.report(total), **evaluated}
        with win.timer.paused(report=True):
            reporter.report(metrics)


def _validate(t: _Trial) -> dict[str, float]:
    # the unwrapped model: DDP's forward may broadcast buffers (BatchNorm), and ranks whose
    # validation shards differ in batches would then pair mismatched collectives
    return validate(t.model, t.wl, lambda: _make_loader(t.wl, t.cfg, t.pin, False, t.rank, t.world)[0], t.prec,
                    t.device, t.pin, t.step_fn, t.count)


def _finish(final: dict[str, Any], t: _Trial, length: TrialLength, win: MeasuredWindow, evals: Evaluator,
            reporter: Reporter, facts: dict[str, str] | None, where: Where, loop_t0: float) -> dict[str, Any]:
    """Validation, FLOPs, items seen, the loop's times and rank 0's facts: the final report."""
    cfg, device = t.cfg, t.device
    where.at("validate")
    if not cfg.probe:  # a memory probe only asks whether the training step fits
        final.update(evals.final_validation())
        if not math.isfinite(final[contract.LOSS_VAL]):
            raise DivergedError(f"validation loss is {final[contract.LOSS_VAL]}")
    peak, gpu_facts = _gpu_layout(device, cfg.precision, t.world)
    flops_item, flops_source = t.flops
    if contract.throughput_key(t.wl.unit) in final:
        final.update(_flops_metrics(final, t.wl, peak, flops_item))
        if flops_item is not None:
            final["perf/flops_source"] = flops_source  # a tag: declared by the workload, or counted
    (seen_all,) = all_reduce([float(length.seen)], device)
    final[contract.seen_key(t.wl.unit)] = int(seen_all)
    final.update(evals.figures())
    final[contract.FINAL] = 1
    if length.done_before:
        final[contract.RESTORED_FROM] = length.done_before
    final[contract.LOOP_S], final[contract.BUILD_S], prep_s, cached, waited = all_reduce(
        [time.perf_counter() - loop_t0, t.build_s, t.data_prep_s, float(t.data_cached), win.timer.report_wait_s],
        device, op="max")
    if cached:  # measured only where the workload's data goes through ensure_cached: else absent, never 0
        final[contract.DATA_PREP_S] = prep_s
    if contract.WINDOW_S in final:  # the window's hand-offs; no window (a target met in warm-up): absent
        final[contract.REPORT_WAIT_S] = waited
    if win.warm_end:  # before the measured window: build, loader start-up, compile, warm-up steps
        (final[contract.WARMUP_S],) = all_reduce([win.warm_end - loop_t0], device, op="max")
    if win.warm_steps_s is not None:  # agreed when the window began
        final[contract.WARMUP_STEPS_S] = win.warm_steps_s
    if t.rank == 0:
        final.update(device_facts(device) | t.tags)
        if t.telemetry is not None:
            final.update(t.telemetry.facts)
        final.update(gpu_facts)  # device/gpu_count counts GPUs (by UUID), not ranks
        final.update(facts or {})
    reporter.report(final)
    return final
