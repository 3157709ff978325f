"""Decide what the search hands out next, beyond what the sampler proposes.

No configuration twice, and the worker count held for runs of trials.

- **No repeats.** A configuration already handed out (running or measured) is never handed out
  again, unless as a named replicate. `config_key` says when two are the same; `finite_points` lists a
  space whose every knob has a finite set of values (categorical, int, stepped float), so that the search
  can tell when it has run them all (exhausted) and, when the sampler keeps proposing what ran, hand out
  one that has not.
- **Runs per worker count.** Every change of `num_workers` between trials restarts a warm worker
  group (Ray Train's start-up: ~6-12 s on a 2-core CPU). `SizeRuns` holds the count for runs of
  `run_length` trials: first one run for each count (smallest first: the pool's first group has it),
  then runs of whatever count the sampler picks. The trade-off is explicit: the sampler chooses the
  count only between runs, and a sweep of N trials over k counts starts at most about N / run_length
  groups (`search.trials_per_size`; default N / (k + 1), so at most k + 1 groups).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Any

from sweeps.search.trials import first_workers, worker_counts
from sweeps.spec import SweepSpec

MAX_POINTS = 100_000  # a finite space larger than this is treated as unbounded (never enumerated)
SIZE = "num_workers"


def _norm(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return round(float(value), 12)


def config_key(config: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The identity of a configuration: its knobs and values, numbers compared as numbers."""
    return tuple(sorted((k, _norm(v)) for k, v in config.items()))


def finite_points(spec: SweepSpec) -> list[dict[str, Any]] | None:
    """List every configuration of the searched knobs, when each has a finite set of values.

    At most `MAX_POINTS` of them; None otherwise (a continuous or log range: the space never runs out)."""
    try:
        values = spec.space.grid_values()
    except ValueError:
        return None
    if math.prod(len(v) for v in values.values()) > MAX_POINTS:
        return None
    keys = list(values)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(values[k] for k in keys))]


def unvisited(points: list[dict[str, Any]], seen: set[tuple[tuple[str, Any], ...]], seed: int,
              size: int | None = None) -> list[dict[str, Any]]:
    """The points not in `seen` (of `size` workers, when given), in an order fixed by `seed`."""
    left = [p for p in points if config_key(p) not in seen and (size is None or int(p.get(SIZE, -1)) == size)]
    random.Random(seed).shuffle(left)
    return left


@dataclass
class SizeRuns:
    """The worker count of the trials to come, held for runs of `run_length` (see the module doc)."""

    sizes: list[int]
    run_length: int
    current: int | None = None
    left: int = 0  # trials still to hand out in the current run
    unvisited: list[int] = field(default_factory=list)
    exhausted: set[int] = field(default_factory=set)  # counts whose every configuration has run

    @classmethod
    def of(cls, spec: SweepSpec) -> SizeRuns | None:
        """None when the count is not searched, or the search is grid (whose order holds it already)."""
        if spec.space.num_workers is None or spec.search.algorithm == "grid" or len(worker_counts(spec)) < 2:
            return None
        sizes = worker_counts(spec)
        first = first_workers(spec)
        run = spec.search.trials_per_size or max(1, math.ceil(spec.budget.num_trials / (len(sizes) + 1)))
        return cls(sizes, run, unvisited=[first, *[s for s in sizes if s != first]])

    def pinned(self) -> int | None:
        """The count the next trial must have, or None where the sampler chooses (a new run begins)."""
        if self.left > 0 and self.current not in self.exhausted:
            return self.current
        return next((s for s in self.unvisited if s not in self.exhausted), None)

    def handed(self, size: int) -> None:
        """A trial of `size` workers was handed out."""
        if size == self.current and self.left > 0:
            self.left -= 1
            return
        self.current, self.left = size, self.run_length - 1
        if size in self.unvisited:
            self.unvisited.remove(size)

    def upcoming(self, n: int) -> list[int | None]:
        """Return the planned count of each of the next `n` trials.

        The current run's, then a run of each count not yet visited, then None (the sampler's choice, one run at
        a time)."""
        plan: list[int | None] = [self.current] * min(n, self.left if self.current not in self.exhausted else 0)
        for s in self.unvisited:
            if s not in self.exhausted:
                plan += [s] * self.run_length
        return (plan + [None] * n)[:n]

    def expected_restarts(self, n: int) -> float:
        """Return the group restarts the next `n` trials are expected to cost.

        Each change of count in the plan, and at each later run's start the chance that the sampler picks another
        count than the run before ((k - 1) / k with k counts left; slots of concurrent trials aside). An
        expectation, not a forecast: a sweep pays a whole number (12 trials over [1, 2]: 1 or 2 for the 1.5
        planned), and which one follows the count that measures faster, unknown before the sweep measured it
        (`tests/search/test_searcher.py::test_the_restarts_the_plan_expects_are_what_the_runs_pay_on_average`)."""
        plan, k = self.upcoming(n), max(1, len([s for s in self.sizes if s not in self.exhausted]))
        known = [s for s in plan if s is not None]
        free = len(plan) - len(known)
        runs = math.ceil(free / self.run_length) if free else 0
        return size_changes(self.current, known) + runs * (k - 1) / k


def size_changes(current: int | None, sizes: list[int]) -> int:
    """How many times a warm group must change its worker count to run `sizes` in order after `current`."""
    changes, last = 0, current
    for size in sizes:
        changes += last is not None and size != last
        last = size
    return changes


def planned_trials(spec: SweepSpec) -> int:
    """Return the most trials the sweep will run.

    That is num_trials, or fewer where a finite space that stops when it runs out (`search.when_exhausted:
    stop`) has fewer configurations (grid's size is num_trials already)."""
    n = spec.budget.num_trials
    if spec.search.algorithm == "grid" or spec.search.when_exhausted != "stop" or not spec.space.searched():
        return n  # (nothing searched: num_trials runs of the one configuration, asked for)
    points = finite_points(spec)
    return min(n, len(points)) if points is not None else n
