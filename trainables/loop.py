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

Components, owned for the trial by one `_Run`: what `build.build` made (the model bundle, the
instruments, the precision), `TrialLength` (length.py: warm-up, the measured-step plan, the LR
horizon, the equal-data tail, `min_window_s`/`max_window_s`/`max_warmup_s`), `MeasuredWindow`
(window.py: timer, counters, marks, the reports), `Evaluator` (evaluate.py: periodic evaluation,
target), `Checkpointer` (checkpoint.py), the LR schedule, the reporter and the `where` label; the
data comes from loader.py.

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
from collections.abc import Iterator
from typing import Any

import torch

from trainables import contract
from trainables.batches import checked_count, loss_of, move_to_device, take_items, tensor_bytes
from trainables.build import Built, build, compile_cache_counts, flops_metrics, gpu_layout
from trainables.checkpoint import Checkpointer, Saved
from trainables.contract import TrialConfig
from trainables.devinfo import device_facts
from trainables.evaluate import Evaluator, validate
from trainables.length import TrialLength
from trainables.loader import close_loader, make_loader, stream
from trainables.loop_errors import DivergedError
from trainables.noise_scale import grads_sq
from trainables.reporting import Reporter, priced
from trainables.trace import Tracer
from trainables.window import MeasuredWindow, all_reduce


def _make_schedule(optimizer: torch.optim.Optimizer, cfg: TrialConfig,
                   length: TrialLength) -> torch.optim.lr_scheduler.LambdaLR | None:
    """Linear warm-up over `lr_warmup_steps`, then constant or cosine to 0 at the trial's last step.
    Multiplies each param group's own lr, so a workload's per-group rates keep their ratios.
    The trial's length (warm-up steps, the measured steps' horizon) is read at each step: warm-up
    ending sets it."""
    warm = cfg.lr_warmup_steps
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


class Where:
    """Where a rank is in the loop: the phase, then the step (and micro-batch) as the spine sets it.

    An exception leaving the loop carries `label` as `sweeps_where`."""

    __slots__ = ("label",)

    def __init__(self, *label: Any) -> None:
        self.label: tuple[Any, ...] = label

    def at(self, *label: Any) -> None:
        self.label = label


def train(cfg: TrialConfig, reporter: Reporter, device: torch.device, facts: dict[str, str] | None = None,
          resume_from: str | None = None) -> dict[str, Any]:
    """Train one trial and return the final report.

    It trains `cfg.num_warmup_steps + cfg.num_steps` steps (or what the trial's length rules instead:
    `trainables.length`).

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
    run = _Run(build(cfg, device), priced(reporter, cfg.usd_per_hour), resume_from, where)
    t, length, win, evals = run.t, run.length, run.win, run.evals
    loader, sampler = make_loader(t.m.wl, cfg, t.pin, train=True, rank=t.rank, world=t.world)
    batches = stream(loader, sampler, needed=length.batches_needed)
    t.m.model.train()
    evals.start_clock()  # time to target counts from the first step, evaluations included
    tracer = Tracer(cfg.trace_steps, cfg.trace_dir, t.rank, t.world, device)
    step = 0
    try:
        while step < length.last_step():
            if length.warmup_box_due(step):  # max_warmup_s: every rank ends warm-up at the same step
                where.at("warmup-box", step)
                length.box_warmup(step, all_reduce([win.warm_span()], device, op="max")[0])
            if step == length.warmup_steps:  # the measured window begins
                where.at("trace", step)  # the last warm-up steps' trace, split on every rank: warm-up's time
                run.traced = tracer.finish(all_reduce)
                win.warm_t0 += tracer.spent_s  # writing and splitting the trace is no step's time: out of the calibration
                where.at("boundary", step)
                run.begin_window(step)
            elif step == 1:
                win.calibration_starts()
            tracer.before(step, length.warmup_end(), evals.due)  # no traced step holds an evaluation
            micros, need = length.micro_plan(step)  # a whole step, or the equal-data budget's cut tail
            seen, oom = run.step_or_oom(batches, micros, need, step)
            length.seen += seen
            if cfg.probe:
                where.at("probe-agree", step)
                _all_ranks_fit(oom, cfg, device)
            if t.inst.noise is not None:  # a cut last step is not the batch size the estimate assumes
                t.inst.noise.commit(keep=win.measuring and length.is_whole(step, micros))
            if run.scheduler is not None:
                run.scheduler.step()
            t.m.optimizer.zero_grad(set_to_none=True)
            tracer.after(step)
            step += 1
            evaluated: dict[str, Any] = {}  # this step's evaluation, for the report after it
            if evals.due(step):
                where.at("evaluate", step)
                evaluated = evals.run(step)
            if win.measuring:
                run.measured_step_done(evaluated, step)
            if evals.reached is not None:
                break
        where.at("final")
        # a target met during warm-up leaves no measured window: no throughput, honestly absent
        final: dict[str, Any] = win.report(length.total(win.steps), final=True) if win.measuring else {
            contract.STEPS: 0, contract.WORLD_SIZE: t.world, contract.FINAL: 0}
    except BaseException:  # stop loader workers now: a kept traceback would keep them registered
        tracer.close()
        close_loader(loader, batches)
        if t.inst.telemetry is not None:  # and the sampler thread (a warm worker goes on to the next trial)
            t.inst.telemetry.stop()
        raise
    close_loader(loader, batches)  # after the last telemetry sample, which counts loader CPU
    return run.finish(final, facts, loop_t0)


def _all_ranks_fit(oom: bool, cfg: TrialConfig, device: torch.device) -> None:
    """A memory probe's step: every rank learns whether any rank ran out of memory, and all of them
    raise together (so the group stays healthy and nobody waits for a rank that gave up)."""
    (any_oom,) = all_reduce([1.0 if oom else 0.0], device, op="max")
    if any_oom:
        where = "this rank" if oom else "another rank"
        raise torch.OutOfMemoryError(f"out of memory at batch_size={cfg.batch_size} ({cfg.precision}) on {where} "
                                     "(memory probe)")


class _Run:
    """One trial's components on this rank, owned for its run (module doc): the spine asks them, in
    order; the steps below are theirs."""

    def __init__(self, t: Built, reporter: Reporter, resume_from: str | None, where: Where) -> None:
        cfg, device = t.cfg, t.device
        self.t, self.reporter, self.where = t, reporter, where
        self.ckpt = Checkpointer(cfg.checkpoint_every_steps, resume_from, device, t.rank)
        self.length = TrialLength(cfg, t.world, self.ckpt.done_before)
        self.scheduler = _make_schedule(t.m.optimizer, cfg, self.length)
        self.win = MeasuredWindow(device, t.inst, t.m.wl.unit, t.world,
                                  t.world if t.m.ddp is not None else cfg.grad_accum_steps)
        self.evals = Evaluator(cfg, self.win.timer, self.validate)
        self.saved = Saved(t.m.model, t.m.optimizer, t.m.scaler, self.scheduler, t.m.sharded)  # what a checkpoint holds
        self.traced: dict[str, Any] = {}  # the trace's figures (trainables.trace), once warm-up ended
        self.cache0 = compile_cache_counts() if cfg.compile else None  # before the first compiled forward

    def run_step(self, batches: Iterator[Any], micros: int, need: int, step: int) -> int:
        """One optimizer step of `micros` micro-batches (the last cut to `need` items on this rank, when
        given); returns the items it took."""
        t, m, inst, win, where = self.t, self.t.m, self.t.inst, self.win, self.where
        cfg, accum, seen = t.cfg, t.cfg.grad_accum_steps, 0
        for micro in range(micros):
            where.at("step", step, micro)
            with win.timer.data_wait():
                batch = next(batches)
            n = checked_count(m.count, batch)
            # cut the last micro-batch to what completes the budget; not a compiled model's: a new
            # batch shape would recompile inside the measured window (then it is used whole)
            if need and micro == micros - 1 and n > need and not cfg.compile:
                cut = take_items(batch, n, need)
                if cut is not None:
                    batch, n = cut, checked_count(m.count, cut)
            need = max(0, need - n)
            with inst.telemetry.h2d_copy(win.measuring) if inst.telemetry is not None else contextlib.nullcontext():
                moved = move_to_device(batch, t.device, t.pin, m.channels_last)
            # DDP all-reduces gradients on the last micro-batch only; never in a memory probe,
            # where a rank that runs out of memory must not leave its peers in that all-reduce (FSDP2's
            # forward gathers parameters anyway: its probe reduces as a trial does, or it would hold
            # unsharded gradients a trial never holds)
            sync = micro == micros - 1 and (not cfg.probe or m.sharded)
            with m.gradient_sync(sync):
                with t.prec.autocast():
                    loss = loss_of(m.step_fn(m.forward_model, moved), training=True)
                t.prec.backward(loss / micros if micros > 1 else loss, m.scaler)
            if sync and inst.comm is not None:  # backward returned once the all-reduce had: the wait it did not hide
                inst.comm.backward_done(keep=win.measuring)
            if inst.noise is not None and m.ddp is None and win.measuring and micros == accum and micro in (0, accum - 1):
                # one rank: the first micro-batch's gradient is the small batch, the step the big one
                if micro == 0:
                    inst.noise.add_small(grads_sq(m.params) * accum * accum)
                else:
                    inst.noise.add_big(grads_sq(m.params))
            seen += n
            if win.measuring:
                win.count(n, tensor_bytes(batch) if t.device.type == "cuda" else 0, loss, micros)
        where.at("optimizer", step)
        t.prec.step(m.optimizer, m.scaler, m.model, cfg.max_grad_norm, force=cfg.probe)
        return seen

    def step_or_oom(self, batches: Iterator[Any], micros: int, need: int, step: int) -> tuple[int, bool]:
        """`run_step`: the items it took and whether it ran out of memory, which only a memory probe survives
        (its ranks agree on it next: `_all_ranks_fit`)."""
        try:
            return self.run_step(batches, micros, need, step), False
        except torch.OutOfMemoryError:
            if not self.t.cfg.probe:
                raise
            self.t.m.optimizer.zero_grad(set_to_none=True)
            return 0, True

    def begin_window(self, step: int) -> None:
        """Warm-up ends at `step`: plan the measured steps (equal data: SUM of items; the clock: MAX warm-up
        step time), undo warm-up's updates on a resumed trial, and start the window's clock."""
        t, length, win, scheduler = self.t, self.length, self.win, self.scheduler
        cfg, device = t.cfg, t.device
        seen_warm = all_reduce([float(length.seen)], device)[0] if cfg.num_items else None
        self.ckpt.restore_into(self.saved)  # resumed: continue from the checkpoint
        warm_step_s = all_reduce([(win.timer.now(sync=True) - win.warm_t0) / (step - 1)], device, op="max")[0] \
            if step >= 2 else None  # warm-up long enough to time
        sub_every = length.plan(seen_warm, warm_step_s)
        length.fix_lr_end(scheduler.last_epoch if scheduler is not None else step)
        # report about every report_interval_s
        report_every = max(1, int(cfg.report_interval_s / max(warm_step_s, 1e-9))) if warm_step_s else cfg.num_steps
        win.start(sub_every, report_every, warm_step_s * (step - 1) if warm_step_s is not None else None)

    def measured_step_done(self, evaluated: dict[str, Any], step: int) -> None:
        """A measured step ended: its mark, the clock's say over the length, then a report when one is due
        (with a checkpoint when that is due; none after the last step: the final report follows)."""
        t, length, win, ckpt, where = self.t, self.length, self.win, self.ckpt, self.where
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
        if self.evals.reached is not None or not length.more_after(measured):
            return
        # Handing a report on is the service's time, not training's: left out of the window's clock, as an
        # evaluation is (Ray Train's report waits until its controller took the previous one: up to a poll
        # interval, 0.5 s, which a cold trial reporting every 0.01 s paid at every step), but counted by
        # the time box (`box_s`), which bounds what the trial costs
        if ckpt.due(total):
            metrics = win.report(total)
            with win.timer.paused(report=True):
                ckpt.report(self.reporter, metrics, self.saved, total)
                # rank 0 saved while the others went on: they meet here, paused, and not in the next step's
                # all-reduce, where the save would count (Ray Train's report is a barrier; plain torchrun's is not)
                where.at("checkpoint", step)
                all_reduce([0.0], t.device)
        elif evaluated or win.report_due():  # with report_evals, after each evaluation too: ASHA's curve
            metrics = {**win.report(total), **evaluated}
            with win.timer.paused(report=True):
                self.reporter.report(metrics)

    def validate(self) -> dict[str, float]:
        # the unwrapped model: DDP's forward may broadcast buffers (BatchNorm), and ranks whose
        # validation shards differ in batches would then pair mismatched collectives
        t = self.t
        return validate(t, lambda: make_loader(t.m.wl, t.cfg, t.pin, False, t.rank, t.world)[0])

    def finish(self, final: dict[str, Any], facts: dict[str, str] | None, loop_t0: float) -> dict[str, Any]:
        """Validation, FLOPs, items seen, the loop's times and rank 0's facts: the final report."""
        t, length, win, evals, where = self.t, self.length, self.win, self.evals, self.where
        cfg, device = t.cfg, t.device
        where.at("validate")
        if not cfg.probe:  # a memory probe only asks whether the training step fits
            final.update(evals.final_validation())
            if not math.isfinite(final[contract.LOSS_VAL]):
                raise DivergedError(f"validation loss is {final[contract.LOSS_VAL]}")
        peak, gpu_facts = gpu_layout(device, cfg.precision, t.world)
        flops_item, flops_source = t.m.flops
        if contract.throughput_key(t.m.wl.unit) in final:
            final.update(flops_metrics(final, t.m.wl, peak, flops_item, t.facts.recomputed_flops))
            if flops_item is not None:
                final["perf/flops_source"] = flops_source  # a tag: declared by the workload, or counted
        (seen_all,) = all_reduce([float(length.seen)], device)
        final[contract.seen_key(t.m.wl.unit)] = int(seen_all)
        final.update(evals.figures())
        final.update(self.traced)  # where the traced warm-up steps' time went (or why there is no trace)
        final[contract.FINAL] = 1
        if length.done_before:
            final[contract.RESTORED_FROM] = length.done_before
        if t.facts.predicted is not None:  # beside the measured peak (memory/max_allocated_gib, memory/peak_rss_gib)
            final[contract.MEM_PREDICTED_GIB] = t.facts.predicted.total_gib
            final[contract.MEM_PREDICTED_ACTIVATIONS_GIB] = t.facts.predicted.activations_gib
        final[contract.LOOP_S], final[contract.BUILD_S], prep_s, cached, waited = all_reduce(
            [time.perf_counter() - loop_t0, t.facts.build_s, t.facts.data_prep_s, float(t.facts.data_cached),
             win.timer.report_wait_s],
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
            if self.cache0 is not None:
                now = compile_cache_counts()
                final.update({key: now[i] - self.cache0[i] for i, key in enumerate(
                    (contract.COMPILE_GRAPHS, contract.COMPILE_CACHE_HITS, contract.COMPILE_CACHE_MISSES))})
            final.update(device_facts(device) | t.facts.tags)
            if t.inst.telemetry is not None:
                final.update(t.inst.telemetry.facts)
            final.update(gpu_facts)  # device/gpu_count counts GPUs (by UUID), not ranks
            final.update(facts or {})
        self.reporter.report(final)
        return final
