"""What the sweep prints as it goes: one line per trial event, and what it cost beyond training.

Every trial event is one plain line (what `ray job logs` and a redirected log want). On an
interactive terminal the sweep's echo (`Terminal`) also keeps a single live status line under
them -- done/total, running, failed, best so far, elapsed, ETA -- rewritten in place with `\\r`;
when stdout is not a terminal nothing but the event lines is written.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from sweeps.results.contention import contended, measured_contention
from sweeps.results.money import planned_usd
from sweeps.results.outcome import MEASURED, NOT_FAILED, UNFINISHED, TrialRow, at_word
from sweeps.search.plan import SIZE, SizeRuns, planned_trials, size_changes
from sweeps.search.trials import first_workers, trial_clock, worker_counts
from sweeps.spec import CategoricalParam, FixedParam, SweepSpec
from trainables.contract import DATA_PREP_S, LOOP_S, TRIAL_IN_GROUP, WARMUP_S, WARMUP_STEPS_S, WINDOW_S, cv_key_of

REASON_WIDTH = 240  # a failure's reason in a progress line, shortened at a word (whole in MLflow and the final table)


@dataclass(frozen=True)
class Status:
    """Where the sweep stands at one moment (`at`: time.monotonic() then)."""

    done: int
    total: int
    running: int
    failed: int
    best: str  # "throughput/samples_per_s=510.9 (trial 4)", or "" before any trial finished
    elapsed_s: float
    eta_s: float  # nan before the first trial ends; the low end of a range
    at: float
    skipped: int = 0  # grid points that will never run (out of memory bounds): done + skipped reaches total
    eta_hi_s: float | None = None  # the high end of a range (inf: open), None for one figure (`eta_range`)

    @property
    def over(self) -> bool:
        return self.done + self.skipped >= self.total

    def text(self, now: float | None = None) -> str:
        """The status, with elapsed and ETA moved on to `now`."""
        waited = max(0.0, (now if now is not None else self.at) - self.at)
        eta = self._eta(waited)
        best = f" | best {self.best}" if self.best else ""
        skipped = f" ({self.skipped} skipped: out of memory bounds)" if self.skipped else ""
        return (f"done {self.done}/{self.total}{skipped}, running {self.running}, failed {self.failed}{best} | "
                f"elapsed {self.elapsed_s + waited:.0f}s, ETA {eta}")

    def _eta(self, waited: float) -> str:
        """"70s", a range "40-95s", or an open one: "40s or more", "up to 95s"."""
        if not math.isfinite(self.eta_s):
            return "?"
        low, high = max(0.0, self.eta_s - waited), self.eta_hi_s
        if high is None:
            return f"{low:.0f}s"
        if math.isinf(high):
            return f"{low:.0f}s or more"
        high = max(0.0, high - waited)
        if round(high) <= round(low):
            return f"{low:.0f}s"
        return f"up to {high:.0f}s" if round(low) == 0 else f"{low:.0f}-{high:.0f}s"


class ProgressLine(str):
    """A trial event's line that also carries the sweep's status (for the live line of a terminal)."""

    status: Status

    def __new__(cls, text: str, status: Status) -> ProgressLine:
        line = super().__new__(cls, text)
        line.status = status
        return line


def planned_restarts(spec: SweepSpec) -> float:
    """Return the warm-group restarts the whole sweep is expected to need to change its worker count.

    The runs of `sweeps.search.plan.SizeRuns`, or the grid's order (the count varies slowest); 0 when it is not
    searched."""
    runs = SizeRuns.of(spec) if spec.scaling.reuse_workers else None
    if runs is not None:
        return runs.expected_restarts(planned_trials(spec))
    if spec.search.algorithm == "grid" and spec.space.num_workers is not None and spec.scaling.reuse_workers:
        return float(size_changes(first_workers(spec), [int(p[SIZE]) for p in spec.space.grid_points()]))
    return 0.0


def groups_planned(spec: SweepSpec, group_start_s: float | None) -> str:
    """The planned cost's words on warm groups: how many starts, at what this cluster's first one took."""
    if not spec.scaling.reuse_workers:
        return ""
    restarts = planned_restarts(spec)
    groups = spec.budget.max_concurrent_trials + restarts
    why = f" ({restarts:.3g} restart(s) to change the worker count, planned)" if restarts else ""
    if group_start_s is None:
        return f"; {groups:.3g} warm worker group start(s){why}, each measured when it starts"
    return (f"; {groups:.3g} warm worker group start(s){why} x {group_start_s:.1f} s (the first one here) "
            f"= {groups * group_start_s:.0f} s")


def planned_cost(spec: SweepSpec, group_start_s: float | None = None) -> str:
    """Say what the sweep will cost, before it starts.

    Trials x the time-boxed trial, by concurrency (from `min_window_s`'s floor to the boxes' ceiling where a
    floor is set, as on a GPU), and the warm groups' starts (`group_start_s`: what the first one took on this
    cluster)."""
    b, n, at_once = spec.budget, planned_trials(spec), spec.budget.max_concurrent_trials
    floor, window, warmup = trial_clock(spec)
    rounds = math.ceil(n / at_once)
    groups = groups_planned(spec, group_start_s)
    if n < b.num_trials:  # the space has fewer configurations, and none runs twice
        groups = f" (the space has {n} configurations; none runs twice){groups}"
    if not window:
        return (f"planned: {n} trial(s), {at_once} at a time; their length is not time-boxed (it follows "
                f"{'the data budget' if b.num_items else 'the target' if spec.objective.target else 'num_steps'}), "
                f"so the ETA follows the trials as they finish{groups}")
    boxed = window + warmup
    if floor:  # the least window (`trials.window_floor`): a trial run to its end measures between the floor and the box
        span = f"{floor:g}-{window:g}" if floor < window else f"{window:g}"
        total = f"{floor:g}-{boxed:g} s = {rounds * floor:g}-{rounds * boxed:g}" if floor < boxed else f"{boxed:g} s = {rounds * boxed:g}"
        each = (f"<= {warmup:g} s of warm-up + {span} s measured (budget.max_warmup_s / min_window_s / "
                f"max_window_s): {rounds} x {total} s")
    else:
        each = (f"<= {warmup:g} s of warm-up + <= {window:g} s measured (budget.max_warmup_s / max_window_s): "
                f"{rounds} x {boxed:g} s = {rounds * boxed:.0f} s")
    money = planned_usd(spec, n, boxed, worker_counts(spec))
    return (f"planned: {n} trial(s), {at_once} at a time, each time-boxed to {each} of training, plus each trial's "
            f"start-up and validation (measured by the first trial: the ETA uses what each finished trial cost)"
            f"{groups}{money}")


@dataclass(frozen=True)
class TrialCost:
    """What one ended trial cost.

    `cost_s`, its own wall time, start to end (not the cluster's or a warm
    group's start-up); of that, what the time boxes may bound: its measured window (`time/window_s`) and
    warm-up's timed steps (`time/warmup_steps_s`; its build, compilation and step 0 are no box's), and
    what no later trial pays again: the data files it made for the node (`time/data_prep_s`). `fresh`: True
    when it was its warm group's first trial, so it also paid the process's first use of the device and
    libraries; False when an earlier trial had warmed its group; None when unknown (a cold trial, whose every
    process is new; a trial that ended without a final report, which carries the fact). `contended`: whether
    other work shared its node or GPUs while it was measured (`sweeps.results.contention`); None when not
    measured."""

    precision: str
    cost_s: float
    window_s: float = 0.0
    warmup_steps_s: float = 0.0
    data_prep_s: float = 0.0
    fresh: bool | None = None
    contended: bool | None = None

    def again_s(self, data_shared: bool) -> float:
        """Return what a trial like it would cost next.

        Less the data it made, where the trials to come read the same data (`data_shared`), which they then find
        made (on its node; another node makes its own)."""
        return max(0.0, self.cost_s - self.data_prep_s) if data_shared else self.cost_s

    @classmethod
    def of(cls, precision: str, cost_s: float, metrics: dict[str, Any]) -> TrialCost:
        """From a trial's final metrics (0 for a figure it did not report)."""
        def seconds(key: str) -> float:
            return float(v) if isinstance(v := metrics.get(key), (int, float)) else 0.0
        place = metrics.get(TRIAL_IN_GROUP)
        return cls(precision, cost_s, seconds(WINDOW_S), seconds(WARMUP_STEPS_S), seconds(DATA_PREP_S),
                   fresh=None if place is None else str(place) == "1", contended=conditions(metrics))

    def boxed_s(self, warmup_boxed: bool) -> float:
        """Return the seconds the boxes bound.

        The window, and warm-up's timed steps where `max_warmup_s` is on (an unboxed warm-up is the trial's own
        cost)."""
        return self.window_s + (self.warmup_steps_s if warmup_boxed else 0.0)


def conditions(metrics: dict[str, Any]) -> bool | None:
    """Whether other work shared the trial's node or GPUs while it was measured; None when not measured."""
    return True if contended(metrics) else False if measured_contention(metrics) else None


@dataclass(frozen=True)
class Costs:
    """What the ETA knows beyond the rows.

    The trials this driver saw end (`ended`), each running trial's precision and seconds run so far
    (`running`), and the precisions the sweep measured emulated on this machine before its first trial
    (`emulated`: a CPU's bf16/fp16 without native kernels, `sweeps.results.sol`), and the precision of each grid
    point that will never run (`skipped`: out of memory bounds, `search.grid_skips`)."""

    ended: list[TrialCost]
    running: list[tuple[str, float]] = field(default_factory=list)
    emulated: frozenset[str] = frozenset()
    skipped: list[str] = field(default_factory=list)
    # warm groups: what one took to start on this cluster, and how many restarts the trials to come are expected
    # to need (a change of worker count: `sweeps.search.plan.SizeRuns.expected_restarts`, grid's order)
    group_start_s: float = 0.0
    restarts: float = 0.0
    space_left: int | None = None  # configurations the search has yet to hand out (a finite space that stops)
    # whether other work shares the running trials' nodes now, from their latest reports (None: not known)
    now_contended: bool | None = None


def upcoming(spec: SweepSpec, rows: list[TrialRow], skipped: list[str] | None = None) -> list[str | None]:
    """Return the precision of each trial not yet started.

    Grid search's points still to run, in order, less those that never will (`skipped`, their precisions);
    None where a sampler has yet to pick it."""
    n = max(0, spec.budget.num_trials - len(rows) - len(skipped or []))
    precision = spec.space.held("precision")
    if isinstance(precision, FixedParam):
        return [str(precision.value)] * n
    if spec.search.algorithm != "grid":
        return [None] * n
    left = [str(p.get("precision")) for p in spec.space.grid_points()]
    taken = [str(r.params.get("precision")) for r in rows] + list(skipped or [])
    for p in taken:  # each started or skipped trial took one point of its precision
        if p in left:
            left.remove(p)
    return (left + [None] * n)[:n]


def _choices(p: object) -> list[object]:
    return list(p.choices) if isinstance(p, CategoricalParam) else [getattr(p, "value", None)]


def _warmed(ended: list[TrialCost]) -> list[TrialCost]:
    """The trials that ran in a process an earlier trial had warmed, where any did: a warm group's first
    trial also paid the process's first use of the device (on an H200, GPT-2 small's first trial spent
    27.5 s before its window, the ones after it 1.8-3.8 s), which the trials after it on that group do not."""
    if not any(c.fresh is False for c in ended):
        return ended
    return [c for c in ended if c.fresh is not True]


def price_s(spec: SweepSpec, precision: str | None, costs: Costs) -> float:
    """What a trial of `precision` is expected to cost (nan before any trial ended).

    The mean of the ended trials of that precision, the knob that sets a step's cost class (bf16 vs
    fp32 on Tensor Cores; emulated kernels on a CPU) — of those that ran on a warmed process where any
    did (`_warmed`) — each less the data it made for the node, which
    later trials find made unless the space searches a trainable param (`TrialCost.again_s`). With none
    ended yet, the mean of all ended trials,
    unless the sweep measured that precision emulated here: such steps are several times fp32's, so its
    trials run until their time boxes end them, and cost what the ended trials cost beyond what their
    boxes bound (`TrialCost.boxed_s`: the rest is start-up, build, step 0, validation, reports) plus
    both boxes (when that is more). A precision a sampler has yet to pick (None): the mean over the
    space's choices."""
    ended = costs.ended
    if not ended:
        return math.nan
    # a searched trainable param may be one that shapes the data (image_size, num_train_tokens): then
    # the trials to come may each make their own
    shared = all(isinstance(p, FixedParam) for p in spec.space.params.values())
    if precision is None:
        choices = [str(c) for c in _choices(spec.space.held("precision"))]
        return statistics.fmean(price_s(spec, c, costs) for c in choices)
    same = [c.again_s(shared) for c in _warmed([c for c in ended if c.precision == precision])]
    if same:
        return statistics.fmean(same)
    mean = statistics.fmean(c.again_s(shared) for c in _warmed(ended))
    _, window, warmup = trial_clock(spec)
    if precision in costs.emulated and window:
        beyond = statistics.fmean(max(0.0, c.again_s(shared) - c.boxed_s(warmup > 0)) for c in _warmed(ended))
        return max(mean, beyond + warmup + window)
    return mean


def remaining_s(spec: SweepSpec, rows: list[TrialRow], costs: Costs) -> float:
    """Return the seconds the sweep still needs; nan before any trial ended.

    Each trial not yet started costs its `price_s` (as many as the space has left), each running one what is
    left of its price, each expected restart of a warm group what a group's start cost here,
    `max_concurrent_trials` at a time, and never less than the running trial with the most left."""
    if not costs.ended:
        return math.nan
    left = [max(0.0, price_s(spec, p, costs) - t) for p, t in costs.running]
    to_come = upcoming(spec, rows, costs.skipped)
    if costs.space_left is not None:  # the search stops when the space runs out
        to_come = to_come[:costs.space_left]
    waiting = sum(price_s(spec, p, costs) for p in to_come) + costs.restarts * costs.group_start_s
    # no sooner than the running trial with the most left: slots do not share one trial's time
    return max(max(left, default=0.0), (waiting + sum(left)) / spec.budget.max_concurrent_trials)


def eta_range(spec: SweepSpec, rows: list[TrialRow], costs: Costs) -> tuple[float, float | None]:
    """Return the ETA (`remaining_s`) priced by trials measured under the conditions the sweep runs in.

    (seconds, None) while every ended trial was measured alike. Once contention changed during the sweep (some
    ended trials were measured while other work shared their node, others alone: `TrialCost.contended`), the
    range between what is left at the lone trials' prices and at the shared ones'. Where the running trials
    report other conditions than every ended trial had (`Costs.now_contended`), an open end: (seconds, inf) when
    the node is shared now and was not, (0, seconds) the other way round."""
    eta = remaining_s(spec, rows, costs)
    alone = [c for c in costs.ended if c.contended is False]
    shared = [c for c in costs.ended if c.contended]
    if alone and shared:
        at = sorted(remaining_s(spec, rows, dataclasses.replace(costs, ended=e)) for e in (alone, shared))
        return at[0], at[1]
    if alone and costs.now_contended:
        return eta, math.inf
    if shared and costs.now_contended is False:
        return 0.0, eta
    return eta, None


def sweep_status(spec: SweepSpec, rows: list[TrialRow], elapsed: float, costs: Costs | None = None) -> Status:
    """Return where the sweep stands now: trials done, running and failed, the best so far and the ETA.

    `costs`: what the ended and running trials cost (`remaining_s`). Without any (a resumed sweep's
    earlier trials), the mean time per ended trial stands in."""
    done = [r for r in rows if r.status not in UNFINISHED]
    failed = [r for r in done if r.status not in NOT_FAILED]
    metric, mode = spec.objective.primary, spec.objective.primary_mode
    total = spec.budget.num_trials
    ranked = [r for r in done if r.status == "ok" and metric in r.metrics]
    best = ""
    if ranked:
        b = (max if mode == "max" else min)(ranked, key=lambda r: r.metrics[metric])
        best = f"{metric}={b.metrics[metric]:.4g} (trial {b.number})"
    skipped = len(costs.skipped) if costs is not None else 0
    high = None
    if costs is not None and costs.ended:
        eta, high = eta_range(spec, rows, costs)
    else:
        eta = elapsed / len(done) * max(0, total - len(done) - skipped) if done else math.nan
    return Status(len(done), total, len(rows) - len(done), len(failed), best, elapsed, eta, time.monotonic(), skipped,
                  high)


def progress_line(spec: SweepSpec, row: TrialRow, rows: list[TrialRow], elapsed: float,
                  costs: Costs | None = None) -> ProgressLine:
    """One line per trial event: what it gave, how the sweep stands, best so far, ETA."""
    status = sweep_status(spec, rows, elapsed, costs)
    metric = spec.objective.primary
    if row.status in MEASURED:
        key = cv_key_of(metric)
        cv = row.metrics.get(key) if key else None
        spread = f" (cv {cv:.1f}% over its window)" if isinstance(cv, (int, float)) else ""
        what = f"{metric}={row.metrics.get(metric, float('nan')):.4g}{spread} [{row.verdict.split(':')[0]}]"
        what += f" INFEASIBLE: {row.reason}" if row.status == "infeasible" else ""
    else:
        failed = row.status not in NOT_FAILED
        reason = at_word(row.reason, REASON_WIDTH)  # whole in MLflow and under the final table
        what = f"FAILED ({row.status}: {reason})" if failed else f"{row.status.upper()} ({reason})"
    return ProgressLine(f"[trial {row.number}/{status.total}] {what} | {status.text()}", status)


class Terminal:
    """The sweep's echo to stdout.

    Event lines are printed as they come; on an interactive terminal a live status line is kept under them,
    redrawn after each line and removed by `close()`. The stream is looked up at each call (tests and
    `contextlib.redirect_stdout` replace `sys.stdout`)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._status: Status | None = None
        self._drawn = False

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stdout

    def live(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"

    def __call__(self, line: str) -> None:
        if isinstance(line, ProgressLine):
            self._status = line.status
        out, live = self.stream, self.live()
        out.write(("\r\x1b[K" if live and self._drawn else "") + f"{line}\n")
        self._drawn = False
        if live and self._status is not None and not self._status.over:
            # The cursor goes back to column 0: a line someone else prints (Ray's worker logs)
            # overwrites the status instead of being glued to its end; the next event redraws it.
            out.write(f"\x1b[7m{self._status.text(time.monotonic())}\x1b[0m\r")
            self._drawn = True
        out.flush()

    def close(self) -> None:
        """Remove the live line (before the sweep's final output) and forget the status."""
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        self._drawn, self._status = False, None


TERMINAL = Terminal()


def _total(rows: list[TrialRow], key: str) -> float:
    return sum(float(r.metrics[key]) for r in rows if isinstance(r.metrics.get(key), (int, float)))


def groups_said(starts: list[tuple[Any, float, str]], trials: int) -> str:
    """Say which warm groups a sweep started and what they cost.

    E.g. "warm worker groups: 3 started for 12 trial(s) (2 restarts to change the worker count, 9.1 s each;
    the first 12.2 s)"."""
    text = f"warm worker groups: {len(starts)} started for {trials} trial(s)"
    parts = []
    for why, what in (("resize", "to change the worker count (or type)"), ("replace", "to replace a failed group")):
        took = [s for _, s, w in starts if w == why]
        if took:
            parts.append(f"{len(took)} restart{'s' if len(took) != 1 else ''} {what}, {statistics.fmean(took):.1f} s each")
    first = [s for _, s, w in starts if w == "first"]
    if first:
        parts.append(f"the first {statistics.fmean(first):.1f} s")
    return text + (f" ({'; '.join(parts)})" if parts else "")


def overhead_line(rows: list[TrialRow], wall_s: float, groups: list[tuple[Any, float, str]] | None,
                  probe_s: float = 0.0, waited_s: float = 0.0) -> str:
    """Say where the sweep's wall time went, per trial that ran.

    The memory probe, the trials' own loops (warm-up with any compilation, the measured windows, validation and
    the rest), waiting for resources other work held (`waited_s`: `sweeps.service.waits`), and what is left, the
    service's own cost (scheduling, worker start-up, tracking). A trial that failed before its final report has
    no loop time: its time falls in the service's share, and the line says so. `groups`: each warm group
    started (shape, seconds to start less its wait, why), None without warm groups."""
    mode = groups_said(groups, len(rows)) if groups is not None else "one Ray Train run per trial"
    ended = [r for r in rows if isinstance(r.metrics.get(LOOP_S), (int, float))]
    if not ended:
        waits = f" (it waited {waited_s:.1f} s for resources other work held)" if waited_s >= 0.05 else ""
        return f"{mode}; no trial ran its loop to the end, so no overhead figure{waits}"
    loops, warm, window = _total(ended, LOOP_S), _total(ended, WARMUP_S), _total(ended, WINDOW_S)
    service = wall_s - probe_s - loops - waited_s
    probe = f"memory probe {probe_s:.1f} s + " if probe_s else ""
    waits = f" + waiting {waited_s:.1f} s for resources other work held" if waited_s >= 0.05 else ""
    made = _total(ended, DATA_PREP_S)  # data files written once for the node, inside warm-up's build
    of_it = f", of it {made:.1f} s making data" if made >= 0.05 else ""
    inside = (f" (warm-up incl. compile {warm:.1f} s{of_it}, measured {window:.1f} s, validation and the rest "
              f"{loops - warm - window:.1f} s)" if warm and window else "")
    if service < 0:  # trials ran side by side: their loops add up to more than the wall time
        waits = f", waiting {waited_s:.1f} s for resources other work held" if waits else ""
        return (f"{mode}; sweep wall {wall_s:.1f} s, {probe}trial loops {loops:.1f} s in all{inside}{waits}: the "
                f"trials {'and waits ' if waits else ''}overlapped, so the service's own cost cannot be told apart")
    unknown = len(rows) - len(ended)
    note = (f"; {unknown} trial(s) without a final report count in the service's share" if unknown else "")
    return (f"{mode}; sweep wall {wall_s:.1f} s = {probe}trial loops {loops:.1f} s{inside}{waits} + the service's "
            f"own {service:.1f} s, {service / len(rows):.1f} s per trial{note}")
