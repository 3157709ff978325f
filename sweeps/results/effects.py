"""Each searched knob's measured effect across the whole sweep, not only between exact twins.

A sweep rarely runs two trials that differ in one knob alone (TPE does not walk axes), so the verdicts'
twin rule (`sweeps.results.verdict.revise`) seldom fires. The effects come from one least-squares fit of the
log of the objective on every searched knob that varied among the measured trials:

    log(metric) = b0 + sum over knobs of b[knob, level]    (categorical: one term per level but one)
                       + s[knob] x log2(value)              (a numeric knob with more than 6 levels)

so `exp(b[k, a] - b[k, c])` is the ratio of the objective at level a to level c, all else equal, with a
95% interval from the fit's residual spread (Student's t at n - p degrees of freedom). A trial whose
objective is not positive, or not measured, is left out. With no more trials than terms, or knobs that
always changed together, nothing can be separated: no effects (never a guess).

An effect is *clear* when its interval excludes 1: "precision bf16-mixed vs 32: 0.47x (95% 0.40-0.55x;
6 vs 6 trials)". The verdicts drop a suggestion the sweep measured clearly worse, citing the effect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sweeps.results.outcome import MEASURED, TrialRow
from sweeps.results.outcome import number as _number

MAX_LEVELS = 6  # a numeric knob with more measured levels than this is fitted as a slope per doubling
# Student's t, two-sided 95%, by residual degrees of freedom (interpolated from below; 1.96 beyond 30)
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18,
        15: 2.13, 20: 2.09, 30: 2.04}
_PER_DOUBLING = "x2"


def _t95(dof: int) -> float:
    return 1.96 if dof > 30 else _T95[max(k for k in _T95 if k <= dof)]


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
    """The objective at `value` of `knob` over the objective at `reference`, all else equal (`ratio`),
    with its 95% interval and how many measured trials had each level. For a slope (`value` "x2"),
    the ratio per doubling of the knob."""

    knob: str
    value: Any
    reference: Any
    ratio: float
    low: float
    high: float
    n_value: int
    n_reference: int

    @property
    def clear(self) -> bool:
        return self.high < 1.0 or self.low > 1.0

    def __str__(self) -> str:
        def shown(v: Any) -> str:
            return f"{v:g}" if isinstance(v, float) else str(v)

        what = (f"{self.knob} doubled" if self.value == _PER_DOUBLING else
                f"{self.knob} {shown(self.value)} vs {shown(self.reference)}")
        counts = "" if self.value == _PER_DOUBLING else f"; {self.n_value} vs {self.n_reference} trials"
        return (f"{what}: {self.ratio:.2f}x (95% {self.low:.2f}-{self.high:.2f}x{counts}"
                f"{'' if self.clear else '; not clear'})")


class Effects:
    """The fit (see the module doc) of `metric` over `rows` on `knobs`; `fit` returns None where nothing
    can be separated."""

    def __init__(self, terms: list[tuple[str, Any]], coef: np.ndarray, cov: np.ndarray, t: float,
                 counts: dict[tuple[str, Any], int], references: dict[str, Any]) -> None:
        self._index = {term: i for i, term in enumerate(terms)}
        self._coef, self._cov, self._t = coef, cov, t
        self.counts, self.references = counts, references

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
        return cls(terms, coef[1:], cov[1:, 1:], _t95(dof), counts, references)

    def between(self, knob: str, here: Any, there: Any) -> Effect | None:
        """The objective at `there` over the objective at `here` for `knob`; None where the fit has no such
        levels (a level no measured trial had, a knob that did not vary)."""
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
        half = self._t * math.sqrt(max(var, 0.0))
        return Effect(knob, b, a, math.exp(mean), math.exp(mean - half), math.exp(mean + half),
                      self.counts.get((knob, b), 0), self.counts.get((knob, a), 0))

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
                    out.append(Effect(knob, _PER_DOUBLING, 1.0, effect.ratio, effect.low, effect.high, 0, 0))
            else:
                effect = self.between(knob, self.references[knob], v)
                if effect is not None:
                    out.append(effect)
        return out


def worse(effect: Effect, mode: str) -> bool:
    """Whether the effect is clearly worse for an objective of `mode` ("max": higher is better)."""
    return effect.high < 1.0 if mode == "max" else effect.low > 1.0
