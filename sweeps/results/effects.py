"""Each searched knob's measured effect across the whole sweep, not only between exact twins.

A sweep rarely runs two trials that differ in one knob alone (TPE does not walk axes), so the verdicts'
twin rule (`sweeps.results.verdict.revise`) seldom fires. The effects come from one least-squares fit of the
log of the objective on every searched knob that varied among the measured trials:

    log(metric) = b0 + sum over knobs of b[knob, level]    (categorical: one term per level but one)
                       + s[knob] x log2(value)              (a numeric knob with more than 6 levels)

so `exp(b[k, a] - b[k, c])` is the ratio of the objective at level a to level c, all else equal, with a
95% interval from the fit's residual spread (Student's t at n - p degrees of freedom, its exact quantile).
A trial whose objective is not positive, or not measured, is left out. With no more trials than terms, or
knobs that always changed together, nothing can be separated: no effects (never a guess).

The interval shown is each comparison's own 95%: "precision bf16-mixed vs 32: 0.47x (95% 0.40-0.55x;
6 vs 6 trials)". An effect is *clear* when it stays clear of 1 at 95% *jointly* over every comparison the
fit can be asked (Bonferroni, `Effects.family`); a comparison whose own interval excludes 1 but whose
joint one does not is said "not clear over m comparisons". The verdicts drop a suggestion the sweep
measured clearly worse, citing the effect: with 10 knobs that do nothing, each own interval lies below 1
2.5% of the time, so some knob would look clearly worse in about 1 - 0.975^10 = 22% of such sweeps;
jointly, in at most 2.5%.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sweeps.results.outcome import MEASURED, TrialRow
from sweeps.results.outcome import number as _number

MAX_LEVELS = 6  # a numeric knob with more measured levels than this is fitted as a slope per doubling
ALPHA = 0.05  # the intervals' 95%: each comparison's own, and every comparison's jointly for "clear"
_PER_DOUBLING = "x2"


def _t_central(theta: float, dof: int) -> float:
    """P(|T| <= sqrt(dof) tan(theta)) for Student's t with an integer `dof`: the finite series of
    Abramowitz & Stegun 26.7.3 (odd dof) and 26.7.4 (even dof), exact up to rounding."""
    c2, total = math.cos(theta) ** 2, 0.0
    if dof % 2:
        term = math.cos(theta)  # cos + 2/3 cos^3 + (2 4)/(3 5) cos^5 + ... up to cos^(dof-2)
        for j in range(1, (dof - 1) // 2 + 1):
            total += term
            term *= c2 * (2 * j) / (2 * j + 1)
        return 2 / math.pi * (theta + math.sin(theta) * total)
    term = 1.0  # 1 + 1/2 cos^2 + (1 3)/(2 4) cos^4 + ... up to cos^(dof-2)
    for j in range(1, dof // 2 + 1):
        total += term
        term *= c2 * (2 * j - 1) / (2 * j)
    return math.sin(theta) * total


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile: the t with P(T <= t) = `p` at `dof` (>= 1, integer) degrees of freedom.

    Exact (no table, no normal approximation): the central probability's finite series is bisected on
    the angle atan(t / sqrt(dof)), a bounded, monotone interval, to the float's last bit."""
    if not 0.0 < p < 1.0 or dof < 1:
        raise ValueError(f"t_quantile needs 0 < p < 1 and dof >= 1, got p={p}, dof={dof}")
    if p < 0.5:
        return -t_quantile(1.0 - p, dof)
    want, low, high = 2.0 * p - 1.0, 0.0, math.pi / 2
    for _ in range(200):
        mid = (low + high) / 2
        if mid in (low, high):
            break
        low, high = (mid, high) if _t_central(mid, dof) < want else (low, mid)
    return math.sqrt(dof) * math.tan((low + high) / 2)


def _level(value: Any) -> Any:
    """A logged value as one level: numbers as numbers (`128` = `"128"`), everything else as text."""
    n = _number(value)
    return n if n is not None and str(value).strip().lower() not in ("true", "false") else str(value)


def _reference(knob: str, levels: list[Any]) -> Any:
    """The level the others are compared with: fp32, off, or the smallest number."""
    for usual in ("32", "False"):
        if usual in levels:
            return usual
    numbers = [v for v in levels if isinstance(v, float)]
    return min(numbers) if numbers else levels[0]


@dataclass(frozen=True)
class Effect:
    """One knob's measured effect: the objective at `value` of `knob` over the objective at `reference`.

    `ratio` is that quotient, all else equal, with its own 95% interval (`low`-`high`), the interval that holds
    at 95% jointly with every other comparison of the fit (`joint_low`-`joint_high`, over `family` comparisons)
    and how many measured trials had each level. For a slope (`value` "x2"), the ratio per doubling of the knob."""

    knob: str
    value: Any
    reference: Any
    ratio: float
    low: float
    high: float
    n_value: int
    n_reference: int
    joint_low: float
    joint_high: float
    family: int

    @property
    def clear(self) -> bool:
        """Clear of 1 jointly: what the verdicts act on (one comparison's own 95% is not enough, see `worse`)."""
        return self.joint_high < 1.0 or self.joint_low > 1.0

    def __str__(self) -> str:
        def shown(v: Any) -> str:
            return f"{v:g}" if isinstance(v, float) else str(v)

        what = (f"{self.knob} doubled" if self.value == _PER_DOUBLING else
                f"{self.knob} {shown(self.value)} vs {shown(self.reference)}")
        counts = "" if self.value == _PER_DOUBLING else f"; {self.n_value} vs {self.n_reference} trials"
        own_clear = self.high < 1.0 or self.low > 1.0
        unclear = "" if self.clear else f"; not clear over {self.family} comparisons" if own_clear else "; not clear"
        return f"{what}: {self.ratio:.2f}x (95% {self.low:.2f}-{self.high:.2f}x{counts}{unclear})"


class Effects:
    """The fit (see the module doc) of `metric` over `rows` on `knobs`.

    `fit` returns None where nothing can be separated."""

    def __init__(self, terms: list[tuple[str, Any]], coef: np.ndarray, cov: np.ndarray, dof: int,
                 counts: dict[tuple[str, Any], int], references: dict[str, Any]) -> None:
        self._index = {term: i for i, term in enumerate(terms)}
        self._coef, self._cov = coef, cov
        self.counts, self.references = counts, references
        # The family "clear" is judged over: every comparison `between` answers, i.e. every pair of levels of a
        # knob fitted per level (the table compares each level with the reference, the verdicts a trial's level
        # with a neighbour or a named one), and each slope once (any two values of it test the same slope).
        # Bonferroni, not Holm: Holm's threshold for one comparison depends on the others' p-values, so it
        # gives no interval to cite and a verdict's "clearly worse" would change with the rest of the table;
        # Bonferroni's alpha / m holds per comparison, jointly at 95% whatever their correlation, and errs
        # towards keeping a suggestion (a wrong veto hides a move the user never sees again).
        per_level = {knob for knob, v in terms if v != _PER_DOUBLING}
        levels = [sum(knob == k for k, _ in counts) for knob in per_level]
        self.family = sum(v == _PER_DOUBLING for _, v in terms) + sum(n * (n - 1) // 2 for n in levels)
        self._t = t_quantile(1 - ALPHA / 2, dof)
        self._t_joint = t_quantile(1 - ALPHA / (2 * self.family), dof)

    @classmethod
    def fit(cls, rows: list[TrialRow], knobs: list[str], metric: str) -> Effects | None:
        measured = [r for r in rows if r.status in MEASURED and (_number(r.metrics.get(metric)) or 0) > 0]
        varied, terms, references, counts = [], [], {}, {}
        for knob in knobs:
            levels = list(dict.fromkeys(_level(r.params.get(knob)) for r in measured))
            if len(levels) < 2:
                continue
            varied.append(knob)
            numeric = all(isinstance(v, float) and v > 0 for v in levels)
            for v in levels:
                counts[(knob, v)] = sum(_level(r.params.get(knob)) == v for r in measured)
            if numeric and len(levels) > MAX_LEVELS:
                terms.append((knob, _PER_DOUBLING))
                continue
            references[knob] = _reference(knob, levels)
            terms += [(knob, v) for v in levels if v != references[knob]]
        if not terms or len(measured) <= len(terms) + 1:
            return None
        x = np.ones((len(measured), len(terms) + 1))
        for i, r in enumerate(measured):
            for j, (knob, v) in enumerate(terms):
                level = _level(r.params.get(knob))
                x[i, j + 1] = math.log2(level) if v == _PER_DOUBLING else float(level == v)
        y = np.log([float(_number(r.metrics[metric]) or 0) for r in measured])
        if np.linalg.matrix_rank(x) < x.shape[1]:  # knobs that always changed together
            return None
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        dof = len(measured) - x.shape[1]
        sigma2 = float(np.sum((y - x @ coef) ** 2)) / dof
        cov = sigma2 * np.linalg.inv(x.T @ x)
        return cls(terms, coef[1:], cov[1:, 1:], dof, counts, references)

    def between(self, knob: str, here: Any, there: Any) -> Effect | None:
        """Return the objective at `there` over the objective at `here` for `knob`.

        None where the fit has no such levels (a level no measured trial had, a knob that did not vary)."""
        a, b = _level(here), _level(there)
        if (knob, _PER_DOUBLING) in self._index:
            if not (isinstance(a, float) and isinstance(b, float) and a > 0 and b > 0):
                return None
            i, steps = self._index[(knob, _PER_DOUBLING)], math.log2(b / a)
            mean, var = self._coef[i] * steps, self._cov[i, i] * steps * steps
        else:
            ref = self.references.get(knob)
            ia, ib = self._index.get((knob, a)), self._index.get((knob, b))
            if ref is None or (ia is None and a != ref) or (ib is None and b != ref):
                return None
            mean = (self._coef[ib] if ib is not None else 0.0) - (self._coef[ia] if ia is not None else 0.0)
            var = ((self._cov[ib, ib] if ib is not None else 0.0) + (self._cov[ia, ia] if ia is not None else 0.0)
                   - (2 * self._cov[ia, ib] if ia is not None and ib is not None else 0.0))
        se = math.sqrt(max(var, 0.0))
        half, joint = self._t * se, self._t_joint * se
        return Effect(knob, b, a, math.exp(mean), math.exp(mean - half), math.exp(mean + half),
                      self.counts.get((knob, b), 0), self.counts.get((knob, a), 0),
                      math.exp(mean - joint), math.exp(mean + joint), self.family)

    def neighbour(self, knob: str, here: Any, up: bool) -> Any:
        """The measured level next to `here` in one direction (a slope: double or half); None at the end."""
        a = _level(here)
        if not isinstance(a, float):
            return None
        if (knob, _PER_DOUBLING) in self._index:
            return a * 2 if up else a / 2
        levels = sorted(v for (k, v) in self.counts if k == knob and isinstance(v, float))
        beyond = [v for v in levels if (v > a if up else v < a)]
        return (min(beyond) if up else max(beyond)) if beyond else None

    def table(self) -> list[Effect]:
        """Every level against its knob's reference (a slope: per doubling), in the fit's order."""
        out = []
        for knob, v in self._index:
            if v == _PER_DOUBLING:
                effect = self.between(knob, 1.0, 2.0)
                if effect is not None:
                    out.append(dataclasses.replace(effect, value=_PER_DOUBLING, reference=1.0, n_value=0,
                                                   n_reference=0))
            else:
                effect = self.between(knob, self.references[knob], v)
                if effect is not None:
                    out.append(effect)
        return out


def worse(effect: Effect, mode: str) -> bool:
    """Tell whether the effect is clearly worse for an objective of `mode` ("max": higher is better).

    Clearly worse: its joint interval (see the module doc) on the wrong side of 1, so that with many knobs and
    nothing real, at least 95% of sweeps veto no suggestion."""
    return effect.joint_high < 1.0 if mode == "max" else effect.joint_low > 1.0
