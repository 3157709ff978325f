"""Bottleneck verdicts: one trial's from its own figures, then the sweep's evidence against its moves.

One trial's verdict comes from the rules table (`sweeps.results.verdict_rules`); then, across the sweep, the
next steps that another trial already measured worse are replaced by that evidence.

**Scaling.** A trial with a twin on fewer ranks (`sweeps.results.quality.scaling_twin`) says its scaling
efficiency against it, right after its facts: "scaling efficiency 62% of linear against 1 rank
(trial 3: 900/s vs 1,120/s at 2 ranks)".

**Across the sweep** (`revise`, once all trials have ended). One trial's figures cannot tell
whether its move pays off; the sweep may have measured it. A move is dropped when a *twin* of the
trial ran it and did worse: a trial that differs in the move's knob in the move's direction (a
larger `batch_size` for ↑, `compile` on, the named precision) and equals this one in every other
logged param, numbers compared as numbers (`128` = `"128"`), a param only one of them logged
counting as a difference. Params that do not change a step's speed are not compared (the knobs
declared so in `trainables.knobs`, `lr_effective`, `seed`), nor those that follow
from a compared knob (`global_batch_size`, `cpus_reserved`). Worse means: measured (`ok` or
`infeasible`) and worse on the objective's primary metric in its mode, out of memory (`oom`), or
degraded (its quality worse than the fp32 reference's, `sweeps.results.quality`) where this trial is not.
A twin that measured *better* keeps the move (this trial is then simply not the best), and so does
a tie or a twin without the metric. The dropped move becomes a citation of the nearest such twin,
with both figures and, on a speed objective, the twin's own verdict where it says why ("batch_size
512 (trial 8) was input-bound: 8,057/s vs 10,030/s; add loader workers first": an input-bound
twin turns the advice to its input fix first). Moves nobody measured stay as they were.

A move may carry a *claim* that a twin running it faster would prove: `precision 32` for a bf16/fp16 CPU
trial that looks emulated claims "bf16 is emulated on this CPU". The claim is said, right after the
trial's facts, when every measured twin that ran the move beat this trial's throughput beyond both
trials' noise (`noise_tie`), citing the slowest of them: "bf16 is emulated on this CPU: 60/s vs 451/s for
precision 32 (trial 2)". A twin inside the noise, slower, or none at all: no claim (the move stays).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sweeps.results.contention import contended
from sweeps.results.effects import Effects, worse
from sweeps.results.outcome import MEASURED, SweepOutcome, TrialRow
from sweeps.results.outcome import number as _number
from sweeps.results.outcome import same as _same
from sweeps.results.outcome import twins as _twins
from sweeps.results.quality import efficiency, scaling_twin, throughput, workers
from sweeps.results.verdict_rules import DOWN, ON, UP, Move, first_rule, text, trace_view
from sweeps.spec import PARAMS_PREFIX
from trainables.contract import (
    PERF_PREFIX,
    PREDICT_TIME_TO_TARGET_S,
    THROUGHPUT_PREFIX,
    THROUGHPUT_UNITS,
    TIME_PREFIX,
    cv_key_of,
    throughput_key,
)


@dataclass(frozen=True)
class Verdict:
    """What bounds a trial (`name`), the figures that say so, and the moves to try.

    Once the sweep has been read, it also holds the moves the sweep measured worse, each as the evidence
    (`measured`)."""

    name: str
    facts: str
    moves: tuple[Move, ...] = ()
    measured: tuple[str, ...] = ()
    confirmed: tuple[str, ...] = ()  # the moves' claims a faster twin proved, with its figures
    scaling: str = ""  # the scaling efficiency against the twin on the fewest ranks, once the sweep is read

    @property
    def reason(self) -> str:
        return (self.facts + "".join(f"; {c}" for c in self.confirmed) + (f"; {self.scaling}" if self.scaling else "")
                + _try(self.moves)
                + "".join(f"; {m}" for m in self.measured))

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


def _try(moves: tuple[Move, ...]) -> str:
    return f"; try {' or '.join(m.text for m in moves)}" if moves else ""


def verdict(metrics: dict[str, Any], params: dict[str, Any]) -> Verdict:
    """Say what bounds a finished trial, and what to try that it does not already use.

    The first rule of `sweeps.results.verdict_rules.RULES` that holds, read from the trace where a counter
    disagrees with it, and the trace's split cited (`sweeps.results.verdict_rules.trace_view`)."""
    followed, traced = trace_view(metrics)
    rule, figures = first_rule(followed, params)
    facts, moves = rule.advice(figures)
    shared = contended(metrics)
    if shared:  # the figures the rule read are the trial's share of a busy node, not what the node gives it alone
        traced += f"; measured under contention: {shared}"
    return Verdict(rule.kind, facts + traced, moves)


_EVIDENCE = (*MEASURED, "oom")
_SAYS_WHY = ("input-bound", "compute-bound")  # a twin's verdict that explains why it was slower
# objectives a bottleneck explains
_SPEED_METRICS = (THROUGHPUT_PREFIX, TIME_PREFIX, PERF_PREFIX, PREDICT_TIME_TO_TARGET_S)
MAX_TAG_LEN = 5000


def noise_tie(a: TrialRow, b: TrialRow, metric: str) -> tuple[float, float, float] | None:
    """Tell whether two trials' `metric` are a tie within their noise: (gap %, cv of a, cv of b), or None.

    A tie when they differ by less than the larger of their sub-window spreads (the gap relative to the lower
    value): a tie, not a finding. None when they are apart, or a figure is missing (never a guessed spread)."""
    key = cv_key_of(metric)
    va, vb = _number(a.metrics.get(metric)), _number(b.metrics.get(metric))
    cv_a, cv_b = (_number(a.metrics.get(key)), _number(b.metrics.get(key))) if key else (None, None)
    if va is None or vb is None or cv_a is None or cv_b is None or min(abs(va), abs(vb)) <= 0:
        return None
    gap = abs(va - vb) / min(abs(va), abs(vb)) * 100
    return (gap, cv_a, cv_b) if gap < max(cv_a, cv_b) else None


def _toward(move: Move, here: Any, there: Any) -> bool:
    """Whether a trial with `there` for the move's knob ran the move from `here`."""
    if move.toward in (UP, DOWN):
        a, b = _number(here), _number(there)
        return a is not None and b is not None and (b > a if move.toward == UP else b < a)
    if move.toward == ON:
        return text(there) in ("true", "1") and text(here) not in ("true", "1")
    return _same(there, move.toward) and not _same(here, move.toward)


def _score(t: TrialRow, metric: str, mode: str) -> float | None:
    """The trial's objective value, signed so that higher is better; None when it was not measured."""
    v = _number(t.metrics.get(metric)) if t.status in MEASURED else None
    return None if v is None or v != v else (v if mode == "max" else -v)


def _evidence(t: TrialRow, move: Move, rows: list[TrialRow], metric: str, mode: str) -> TrialRow | None:
    """The nearest twin that ran `move` and did worse than `t`; None when none did, or when one did better."""
    here, mine = t.params.get(move.knob), _score(t, metric, mode)
    worse = []
    for e in rows:
        if (e is t or e.status not in _EVIDENCE or not _toward(move, here, e.params.get(move.knob))
                or not _twins(t, e, move.knob)):
            continue
        theirs = _score(e, metric, mode)
        if e.degraded and not t.degraded:  # faster or not, its result is worse than the fp32 reference's
            worse.append(e)
            continue
        if e.status != "oom" and (mine is None or theirs is None or theirs == mine or noise_tie(t, e, metric)):
            continue  # nothing to compare, or a difference inside both trials' noise: neither for the move nor against it
        if theirs is not None and mine is not None and theirs > mine:
            return None
        worse.append(e)

    def nearest(e: TrialRow) -> tuple[float, bool, float]:
        step = abs((_number(e.params.get(move.knob)) or 0.0) - (_number(here) or 0.0)) \
            if move.toward in (UP, DOWN) else 0.0
        return step, e.status == "oom" or bool(e.degraded), -(_score(e, metric, mode) or 0.0)

    return min(worse, key=nearest, default=None)


def _figure(metric: str, v: float) -> str:
    n = f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return f"{n}/s" if metric.startswith(THROUGHPUT_PREFIX) else n


def _setting(knob: str, value: Any) -> str:
    if text(value) in ("true", "false"):
        return f"{knob} {'on' if text(value) == 'true' else 'off'}"
    n = _number(value)
    return f"{knob} {int(n) if n is not None and n.is_integer() else value}"


def _cite(t: TrialRow, move: Move, e: TrialRow, metric: str, verdicts: dict[str, Verdict]) -> str:
    """The evidence that replaces a move: which twin ran it, how it did, and what to fix first."""
    ran = f"{_setting(move.knob, e.params.get(move.knob))} (trial {e.number})"
    if e.status == "oom":
        return f"{ran} ran out of memory"
    if e.degraded and not t.degraded:
        return f"{ran} was degraded: {e.degraded}"
    speed = metric.startswith(_SPEED_METRICS)
    theirs = verdicts[e.trial_id] if e.trial_id in verdicts else None
    why = f"was {theirs.name}" if speed and theirs and theirs.name in _SAYS_WHY else (
        "measured slower" if speed else "measured worse")
    a, b = _figure(metric, float(e.metrics[metric])), _figure(metric, float(t.metrics[metric]))
    text = f"{ran} {why}: {a} vs {b}" if metric.startswith(THROUGHPUT_PREFIX) else f"{ran} {why}: {metric} {a} vs {b}"
    if speed and theirs and theirs.name == "input-bound":  # its input fix comes before the move
        fix = theirs.moves[0] if theirs.moves else None
        text += ("; add loader workers first" if fix and fix.knob == "num_dataloader_workers"
                 else f"; {fix.text} first" if fix else "; fix its input first")
    return text


def _confirm(t: TrialRow, move: Move, rows: list[TrialRow]) -> str | None:
    """The move's claim with its proof: every measured twin that ran the move had a higher throughput than
    `t`, beyond both trials' noise; the slowest of them is cited. None without such a twin, or when one
    ran it no faster (or only within noise)."""
    key = next((throughput_key(u) for u in THROUGHPUT_UNITS if _number(t.metrics.get(throughput_key(u))) is not None), None)
    if key is None:
        return None
    mine, here = float(t.metrics[key]), t.params.get(move.knob)
    ran = [e for e in rows if e is not t and e.status in MEASURED and _number(e.metrics.get(key)) is not None
           and _toward(move, here, e.params.get(move.knob)) and _twins(t, e, move.knob)]
    if not ran or any(float(e.metrics[key]) <= mine or noise_tie(t, e, key) for e in ran):
        return None
    e = min(ran, key=lambda r: float(r.metrics[key]))
    theirs = f"{_figure(key, float(e.metrics[key]))} for {_setting(move.knob, e.params.get(move.knob))} (trial {e.number})"
    return f"{move.claim}: {_figure(key, mine)} vs {theirs}"


def revise(rows: list[TrialRow], metric: str, mode: str, effects: Effects | None = None) -> dict[str, Verdict]:
    """Revise each measured trial's verdict (by trial_id) against the rest of the sweep.

    The moves a twin measured worse are replaced by that evidence, then those the sweep's measured `effects`
    (`sweeps.results.effects`) say are clearly worse are replaced by the effect, and the claims of the moves a
    twin measured faster are said; `metric` and `mode` ("max"/"min") are the objective's primary ones."""
    first = {t.trial_id: verdict(t.metrics, t.params) for t in rows if t.status in MEASURED}
    by_id = {t.trial_id: t for t in rows}
    refuted: dict[str, list[tuple[Move, TrialRow]]] = {}
    by_effect: dict[str, list[tuple[Move, str]]] = {}
    for t in rows:
        if t.trial_id in first:
            found = [(m, _evidence(t, m, rows, metric, mode)) for m in first[t.trial_id].moves if m.knob]
            refuted[t.trial_id] = [(m, e) for m, e in found if e is not None]
            twins = {m for m, _ in refuted[t.trial_id]}
            said = [(m, _effect_against(t, m, effects, mode)) for m in first[t.trial_id].moves if m.knob and m not in twins]
            by_effect[t.trial_id] = [(m, why) for m, why in said if why]
    dropped = {tid: {m for m, _ in refuted[tid]} | {m for m, _ in by_effect[tid]} for tid in first}
    kept = {tid: dataclasses.replace(v, moves=tuple(m for m in v.moves if m not in dropped[tid]),
                                     confirmed=tuple(c for m in v.moves if m.claim and (c := _confirm(by_id[tid], m, rows))))
            for tid, v in first.items()}
    return {tid: dataclasses.replace(v, measured=tuple(_cite(by_id[tid], m, e, metric, kept) for m, e in refuted[tid])
                                     + tuple(why for _, why in by_effect[tid]), scaling=scaling_note(by_id[tid], rows))
            for tid, v in kept.items()}


def _effect_against(t: TrialRow, move: Move, effects: Effects | None, mode: str) -> str:
    """The sweep's measured effect of `move` from `t`, where it is clearly worse: the move's citation
    instead ("precision bf16-mixed measured 0.47x of 32 across the sweep ..."); "" otherwise."""
    if effects is None:
        return ""
    here = t.params.get(move.knob)
    there: Any = move.toward
    if move.toward == ON:
        there = "True"
    elif move.toward in (UP, DOWN):
        there = effects.neighbour(move.knob, here, up=move.toward == UP)
    effect = effects.between(move.knob, here, there) if there is not None else None
    if effect is None or not worse(effect, mode):
        return ""
    return (f"{_setting(move.knob, there)} measured {effect.ratio:.2f}x of {_setting(move.knob, here)} across the "
            f"sweep (95% {effect.low:.2f}-{effect.high:.2f}x, fitted over {effect.n_value} + {effect.n_reference} "
            "trials at the two settings)")


def scaling_note(t: TrialRow, rows: list[TrialRow]) -> str:
    """The trial's scaling efficiency against its twin on the fewest ranks, with both figures; empty without one."""
    twin = scaling_twin(t, rows)
    if twin is None:
        return ""
    (key, mine), (_, theirs) = throughput(t), throughput(twin)  # type: ignore[misc]
    n, m = workers(t), workers(twin)
    return (f"scaling efficiency {efficiency(t, twin):.0f}% of linear against {m} rank{'s' if m != 1 else ''} "
            f"(trial {twin.number}: {_figure(key, theirs)} vs {_figure(key, mine)} at {n})")


def sweep_effects(outcome: SweepOutcome) -> Effects | None:
    """Measure the searched knobs' effects on the objective across the sweep's measured trials.

    See `sweeps.results.effects`. The knobs go by the names the trials logged them under (`params.<name>` as
    `workload.<name>`)."""
    knobs = [f"workload.{k.removeprefix(PARAMS_PREFIX)}" if k.startswith(PARAMS_PREFIX) else k
             for k in outcome.spec.space.searched()]
    return Effects.fit(outcome.trials, knobs, outcome.spec.objective.primary)


def revise_verdicts(outcome: SweepOutcome) -> dict[str, dict[str, str]]:
    """Revise every finished trial's verdict against the whole sweep, in place (`row.verdict`).

    Returns the tags to log again on the child runs whose verdict changed (run_id -> tags).

    Only a verdict that is still this module's verdict for its trial's figures is revised: its
    text is the one-trial verdict, or a revision of it (a resumed sweep revises again with its new
    trials). A verdict logged by other rules (an older version) is left as it was logged."""
    obj = outcome.spec.objective
    revised = revise(outcome.trials, obj.primary, obj.primary_mode, sweep_effects(outcome))
    updates: dict[str, dict[str, str]] = {}
    for row in outcome.trials:
        v = revised.get(row.trial_id)
        if v is None or not row.verdict:
            continue
        head = f"{v.name}: {v.facts}"
        if (row.verdict == head or row.verdict.startswith(head + "; ")) and row.verdict != str(v):
            row.verdict = str(v)
            if row.run_id:
                updates[row.run_id] = {"sweep.verdict_reason": v.reason[:MAX_TAG_LEN]}
    return updates
