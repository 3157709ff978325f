"""How long a trial runs: its warm-up, then the measured steps planned when warm-up ends.

One object owns the length so the loop asks it instead of carrying counters: the plan (measured
steps, a resumed trial's included), the LR schedule's horizon, the equal-data tail and the clock's
say over the length. Its checks (`*_due`) are pure and read only the config, step counters and
values every rank already agreed on, so every rank takes the same decision; the loop makes the
collective call in between (the agreed value goes into the action).

Which rule sets the length:
- an equal-data budget (`num_items`): the measured steps that complete the budget, the last one cut;
- a target (`target_metric`): `num_steps` at most, ended early when an evaluation meets it;
- otherwise the clock may, around `num_steps`: `min_window_s` extends the window until it lasts that
  long, `max_window_s` plans it from warm-up's step time to end inside that long (run on toward it
  only while a whole step still fits; ended at the first sub-window mark past it when the steps got
  slower; never before the throughput's spread has 3 sub-windows), and `max_warmup_s` ends warm-up
  before a step that would take its timed steps (from step 1) past that long (never before step 2:
  one step is timed at least). With a throughput objective every trial then costs about the same
  seconds, whatever its step time.
"""

from __future__ import annotations

import math

from trainables.contract import TrialConfig

SUB_WINDOWS = 10  # marks across the measured window for the throughput's spread
MIN_SUB_WINDOWS = 3  # the spread (a coefficient of variation) needs at least this many
MAX_EXTENSIONS = 20  # times a plan short of min_window_s may be extended when it runs out (a safety bound)


def data_plan(budget: int, seen_warm: float, warmup_steps: int) -> tuple[int, float]:
    """Plan equal data: the measured steps that complete `budget`, and the items the last of them takes.

    Warm-up saw `seen_warm` items (all ranks); the last step takes the returned items (0: a whole step).
    Warm-up's items per step is the rate."""
    per_step = seen_warm / max(warmup_steps, 1)
    remaining = budget - seen_warm
    if remaining <= 0 or per_step <= 0:  # warm-up alone used the budget: one measured step, whole
        return 1, 0.0
    full = math.floor(remaining / per_step + 1e-9)
    last = remaining - full * per_step
    return (full + 1, last) if last > 1e-6 * per_step else (max(1, full), 0.0)


def tail_micros(need: int, per_micro: int, accum: int) -> int:
    """Return the micro-batches the last step of an equal-data budget runs to take `need` items on this rank.

    The same on every rank: both figures are."""
    return min(accum, max(1, math.ceil(need / max(per_micro, 1))))


class TrialLength:
    """Warm-up steps, the measured-step plan and the LR horizon of one trial (see the module doc)."""

    def __init__(self, cfg: TrialConfig, world: int, done_before: int = 0) -> None:
        self.cfg, self.world, self.done_before = cfg, world, done_before
        self.warmup_steps = cfg.num_warmup_steps  # a warm-up box may end it sooner
        self.planned = cfg.num_steps  # measured steps in all (a resumed trial's done_before included)
        self.horizon = cfg.num_steps  # the LR schedule's measured steps: the plan as warm-up ends, never moved after
        self.lr_end: int | None = None  # the LR schedule's last step, fixed when warm-up ends
        free = not cfg.num_items and cfg.target_metric is None  # the clock may set the length
        self.min_s = cfg.min_window_s if free else 0.0
        self.max_s = cfg.max_window_s if free else 0.0
        self.warm_max_s = cfg.max_warmup_s if free else 0.0
        self.box_end: int | None = None  # where max_warmup_s is expected to end warm-up (`box_warmup`)
        self.seen = 0  # items this rank trained on since step 0, warm-up included (what equal data equalises)
        self.tail: tuple[int, int] | None = None  # equal data: (last step, items this rank takes in it)
        self.per_micro = 1  # items of one micro-batch per rank, as warm-up counted them (equal-data tail)
        self.extended = 0  # times the plan was found short of min_window_s when it ran out
        self._checked = (0.0, 0)  # (window, measured steps) at the last such check

    # --- warm-up
    def last_step(self) -> int:
        """The loop runs steps 0 .. last_step() - 1 (warm-up, then the measured steps still to run)."""
        return self.warmup_steps + self.planned - self.done_before

    def batches_needed(self) -> int:
        return self.last_step() * self.cfg.grad_accum_steps

    def warmup_box_due(self, step: int) -> bool:
        """Before step `step` of warm-up: is the warm-up's length to be checked against max_warmup_s?"""
        return self.warm_max_s > 0 and 2 <= step < self.warmup_steps

    def box_warmup(self, step: int, warm_s: float) -> None:
        """End warm-up now if one more step would pass its time box.

        `warm_s`: the timed warm-up steps' seconds so far (steps 1 .. step - 1, max over ranks). Warm-up
        ends now if one more step at their mean would pass the box: it never outlasts the box by a step."""
        if warm_s * step / (step - 1) > self.warm_max_s:
            self.warmup_steps = step
        elif warm_s > 0:  # where the box will end warm-up if every step lasts their mean (the trace's cue)
            self.box_end = min(self.warmup_steps, math.floor(self.warm_max_s * (step - 1) / warm_s) + 1)

    def warmup_end(self) -> int:
        """The step warm-up is expected to end at: its planned length, or sooner where max_warmup_s will end it."""
        return min(self.warmup_steps, self.box_end or self.warmup_steps)

    # --- the plan, when warm-up ends
    def plan(self, seen_warm: float | None, warm_step_s: float | None) -> int:
        """Plan the measured steps from warm-up's items and step time, and return the sub-window cadence.

        Warm-up's items are counted over all ranks (with an equal-data budget); its step time is the max over ranks
        (None when warm-up was too short to time)."""
        cfg = self.cfg
        if cfg.num_items and seen_warm is not None:  # equal data: the steps that complete the budget
            self.planned, last_items = data_plan(cfg.num_items, seen_warm, self.warmup_steps)
            # a micro-batch's items per rank (warm-up's mean over ranks): every rank runs as many in the tail
            accum = cfg.grad_accum_steps
            self.per_micro = max(1, round(seen_warm / (self.world * accum * max(self.warmup_steps, 1))))
            if last_items:  # the last step takes only what completes the budget (ceil: within a sample per rank)
                self.tail = (self.last_step() - 1, math.ceil(last_items / self.world))
        if warm_step_s is not None:  # calibrated: the steps the clock asks for (checked again as they run)
            step_s = max(warm_step_s, 1e-9)
            if self.min_s:
                self.planned = max(self.planned, self.done_before + math.ceil(self.min_s / step_s))
            if self.max_s:
                fit = max(MIN_SUB_WINDOWS, max(math.ceil(self.min_s / step_s), math.floor(self.max_s / step_s)))
                self.planned = min(self.planned, self.done_before + fit)
        self.horizon = self.planned  # a later extension for min_window_s runs on at the schedule's end
        if self.max_s and warm_step_s is None:  # not calibrated: a mark (and a check of the box) every step
            return 1
        return self.sub_every()

    def sub_every(self) -> int:
        """Steps between sub-window marks: ~SUB_WINDOWS of them over the measured steps planned."""
        return max(1, (self.planned - self.done_before) // SUB_WINDOWS)

    def fix_lr_end(self, schedule_step: int) -> None:
        """Fix the schedule's last step once warm-up ended with the schedule at `schedule_step`.

        A resumed trial's `schedule_step` is the checkpoint's. Its last step is the planned measured steps after
        that, whatever this attempt's warm-up length."""
        self.lr_end = schedule_step + self.planned - self.done_before

    def micro_plan(self, step: int) -> tuple[int, int]:
        """This step's micro-batches and the items this rank still needs in it (0: whole batches)."""
        accum = self.cfg.grad_accum_steps
        if self.tail is None or step != self.tail[0]:
            return accum, 0
        return tail_micros(self.tail[1], self.per_micro, accum), self.tail[1]

    def is_whole(self, step: int, micros: int) -> bool:
        """A step of the full batch (not the equal-data tail's): what the noise scale assumes."""
        return micros == self.cfg.grad_accum_steps and (self.tail is None or step != self.tail[0])

    # --- the clock, while the window runs (measured: measured steps of this attempt)
    def total(self, measured: int) -> int:
        return self.done_before + measured

    def more_after(self, measured: int) -> bool:
        return self.total(measured) < self.planned

    def extend_due(self, measured: int) -> bool:
        """Tell whether the plan ran out with the window still to be checked against min_window_s or the box.

        The box: a window planned from warm-up's step time that ran faster than warm-up runs on toward max_window_s,
        within num_steps."""
        aims = self.min_s > 0 or (self.max_s > 0 and self.planned < self.cfg.num_steps)
        return aims and self.total(measured) == self.planned and self.extended < MAX_EXTENSIONS

    def extend(self, window_s: float, measured: int) -> bool:
        """Extend the plan where the window (`window_s`, agreed over ranks) is short; return whether it did.

        Short of min_window_s (or well short of the box): run on at the rate since the last check (a stall early in
        the window would make the mean step look slow and the extension short); toward the box, never past num_steps
        nor past the box."""
        short_of_min = window_s < self.min_s
        short_of_box = self.max_s > 0 and window_s < 0.9 * self.max_s and self.planned < self.cfg.num_steps
        if not (short_of_min or short_of_box):
            return False
        rate = max((window_s - self._checked[0]) / max(measured - self._checked[1], 1), 1e-9)
        total = self.total(measured)
        if short_of_min:
            self.planned += max(1, math.ceil((self.min_s - window_s) / rate * 1.05))
        else:
            fits = math.floor((self.max_s - window_s) / rate)  # steps that end inside the box
            if fits < 1:  # a slow step: one more would pass the box
                return False
            self.planned = min(self.cfg.num_steps, total + fits)
        if self.max_s and self.max_s > 1.05 * self.min_s:  # the ceiling still holds (min_window_s <= max_window_s)
            self.planned = max(total + 1, min(self.planned, total + math.ceil((self.max_s - window_s) / rate)))
        self.extended, self._checked = self.extended + 1, (window_s, measured)
        return True

    def cap_due(self, measured: int, sub_windows: int, marked: bool) -> bool:
        """Tell whether, at a sub-window mark, the window is to be checked against max_window_s.

        Never before the throughput's spread has its sub-windows, nor at the plan's last step (it ends anyway)."""
        return self.max_s > 0 and marked and sub_windows >= MIN_SUB_WINDOWS and self.more_after(measured)

    def cap(self, window_s: float, measured: int) -> None:
        """`window_s` agreed over ranks: at or past max_window_s, this step is the window's last."""
        if window_s >= self.max_s:
            self.planned = self.total(measured)
