"""Figures across ended trials: the convergence guardrail, predicted time to target and scaling efficiency.

All need several trials, so the sweep computes them at its end (and `sweeps report` reads them back
from MLflow). No Ray, no torch.

**Guardrail.** With an equal-data budget (`budget.num_samples`/`num_tokens`) and no target, every
trial's `loss/val` is measured on the same validation set after the same amount of data. The
reference is the fp32 trial (`32`, else `tf32`) with the smallest global batch; a trial whose
`loss/val` is more than `quality.tolerance` (relative) worse is *degraded*: shown with its gap,
never ranked best. `loss/val` rather than the training loss: it is one full pass over fixed data,
while a training-loss window spans fewer steps at a larger batch. With a target, reaching it is the
quality check, and trials stop at different amounts of data, so the guardrail stays off.

**Prediction** (McCandlish et al. 2018): steps to a given loss follow S = S_min (1 + B_noise / B)
for a batch of B items, with B_noise the gradient noise scale. Each trial that reached the target
gives S_min = S / (1 + B_noise / B) from its own steps, batch and measured noise scale. A trial's
prediction uses the median S_min of the *other* trials that reached it (leave-one-out, so a
trial's own time never feeds its prediction), and
    predict/time_to_target_s = S_pred x step_time + (S_pred / eval_every_steps) x time per evaluation.
Assumptions: S_min does not depend on precision or loader settings (same model and data); the
noise scale measured late in a trial holds for the whole run (it grows as the loss falls, so early
steps are predicted too expensive); the learning rate is tuned for each batch (lr_scaling); warm-up
costs (compilation, loader start) are not modelled.

**Scaling efficiency.** For a measured trial on N ranks and a measured *twin* on fewer ranks M (equal
in every other param that changes a step's speed, `sweeps.results.outcome.twins`: the same per-rank batch,
so the global batch grows with the ranks), `perf/scaling_efficiency_pct` = throughput(N) /
(throughput(M) x N / M) x 100, the global throughput summed over ranks. The twin with the fewest
ranks is the reference (the smallest count measured), so every count of one configuration is
compared with the same one; a trial without such a twin has no efficiency (absent, never 100).
100% is linear scaling; what is lost is usually the gradient all-reduce that backward did not hide
(`time/allreduce_wait_pct`), a slower rank, or shared cores (two ranks on a 2-core machine share
the loader's and the system's time).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from sweeps.results.money import predicted_usd
from sweeps.results.outcome import MEASURED, SweepOutcome, TrialRow, number, twins
from trainables.contract import (
    EVAL_TOTAL_S,
    EVALS,
    GRAD_NOISE_SCALE,
    LOSS_VAL,
    PREDICT_ERROR_PCT,
    PREDICT_TIME_TO_TARGET_S,
    PREDICT_USD_TO_TARGET,
    QUALITY_GAP_PCT,
    SCALING_EFFICIENCY_PCT,
    STEP_TIME_MS,
    STEPS,
    STEPS_TO_TARGET,
    THROUGHPUT_UNITS,
    TIME_TO_TARGET_S,
    seen_key,
    throughput_key,
)

REFERENCE_PRECISIONS = ("32", "tf32")
DEGRADED_TAG = "sweep.degraded"


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def items_per_step(row: TrialRow) -> float | None:
    """Items (all ranks) per optimizer step, from what the trial counted."""
    seen = next((_num(row.metrics.get(seen_key(u))) for u in ("samples", "tokens") if seen_key(u) in row.metrics), None)
    steps = _num(row.metrics.get(STEPS))
    warm = _num(row.params.get("num_warmup_steps")) or 0.0
    if seen is None or steps is None or steps + warm <= 0:
        return None
    return seen / (steps + warm)


def reference(outcome: SweepOutcome) -> TrialRow | None:
    """The fp32 trial with the smallest global batch (lowest trial number on ties)."""
    refs = [t for t in outcome.trials if t.status == "ok" and t.params.get("precision") in REFERENCE_PRECISIONS
            and _num(t.metrics.get(LOSS_VAL)) is not None]
    return min(refs, key=lambda t: (REFERENCE_PRECISIONS.index(t.params["precision"]),
                                    int(t.params.get("global_batch_size", 0)), t.number), default=None)


def guardrail(outcome: SweepOutcome) -> str:
    """Mark degraded trials; returns what was compared with, or why nothing was."""
    spec = outcome.spec
    if not spec.budget.num_items:
        return "off: budget.num_steps gives trials unequal data (use num_samples/num_tokens)"
    if spec.objective.target is not None:
        return "off: the target is the quality check"
    ref = reference(outcome)
    if ref is None:
        return "off: no finished fp32 (32/tf32) trial to compare with"
    ref_loss = float(ref.metrics[LOSS_VAL])
    for t in outcome.trials:
        loss = _num(t.metrics.get(LOSS_VAL))
        if t.status != "ok" or loss is None:
            continue
        gap = 100.0 * (loss - ref_loss) / max(abs(ref_loss), 1e-12)
        t.metrics[QUALITY_GAP_PCT] = gap
        if t is not ref and gap > 100.0 * spec.quality.tolerance:
            t.degraded = (f"{LOSS_VAL} {loss:.4g} is {gap:.1f}% worse than the fp32 reference (trial {ref.number}: "
                          f"{ref_loss:.4g}) at equal data{_data_gap(t, ref)}; tolerance {100 * spec.quality.tolerance:g}%")
    return f"reference trial {ref.number} (precision {ref.params['precision']}, global batch " \
           f"{ref.params.get('global_batch_size')}), tolerance {100 * spec.quality.tolerance:g}%"


def _data_gap(t: TrialRow, ref: TrialRow) -> str:
    """The items the two trials saw, where they differ: the loop cuts the last step to the budget, but a
    batch it cannot cut (see trainables.batches.take_items) is used whole, so the difference is shown."""
    for unit in ("samples", "tokens"):
        a, b = _num(t.metrics.get(seen_key(unit))), _num(ref.metrics.get(seen_key(unit)))
        if a is not None and b is not None and a != b:
            return f" (saw {a:,.0f} {unit}, the reference {b:,.0f})"
    return ""


def _s_min(row: TrialRow) -> float | None:
    steps, noise, batch = (_num(row.metrics.get(STEPS_TO_TARGET)), _num(row.metrics.get(GRAD_NOISE_SCALE)),
                           items_per_step(row))
    if steps is None or noise is None or not batch:
        return None
    return steps / (1.0 + noise / batch)


def predict(outcome: SweepOutcome) -> int:
    """Add predict/time_to_target_s to every trial it can be estimated for; returns how many."""
    target = outcome.spec.objective.target
    every = outcome.spec.budget.eval_every_steps
    if target is None or not every:
        return 0
    fits = {id(t): s for t in outcome.trials if t.status in ("ok", "infeasible") and (s := _s_min(t)) is not None}
    done = 0
    for t in outcome.trials:
        others = [s for k, s in fits.items() if k != id(t)]
        noise, batch = _num(t.metrics.get(GRAD_NOISE_SCALE)), items_per_step(t)
        step_s = _num(t.metrics.get(STEP_TIME_MS))
        if not others or noise is None or not batch or step_s is None:
            continue
        s_pred = statistics.median(others) * (1.0 + noise / batch)
        evals, eval_s = _num(t.metrics.get(EVALS)), _num(t.metrics.get(EVAL_TOTAL_S))
        per_eval = eval_s / evals if evals and eval_s is not None else 0.0
        t.metrics[PREDICT_TIME_TO_TARGET_S] = s_pred * step_s / 1000.0 + (s_pred / every) * per_eval
        t.metrics.update(predicted_usd(t.metrics))  # at the trial's own price, where it has one
        error = prediction_error(t)
        if error is not None:
            t.metrics[PREDICT_ERROR_PCT] = 100.0 * error
        done += 1
    return done


def prediction_error(row: TrialRow) -> float | None:
    """predicted / measured - 1, where both exist."""
    measured, predicted = _num(row.metrics.get(TIME_TO_TARGET_S)), _num(row.metrics.get(PREDICT_TIME_TO_TARGET_S))
    return predicted / measured - 1.0 if measured and predicted is not None else None


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Rank correlation (average ranks for ties); None for fewer than 2 pairs or a constant side."""
    if len(xs) != len(ys) or len(xs) < 2:
        return None

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    if sx == 0 or sy == 0:
        return None
    return sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True)) / (sx * sy)


def workers(row: TrialRow) -> int | None:
    """The ranks a trial ran on, as it logged them."""
    n = number(row.params.get("num_workers"))
    return int(n) if n is not None and n >= 1 else None


def throughput(row: TrialRow) -> tuple[str, float] | None:
    """(key, value) of the trial's global throughput, in the unit it counts; None if it has none."""
    for key in (throughput_key(u) for u in THROUGHPUT_UNITS):
        v = _num(row.metrics.get(key))
        if v is not None and v > 0:
            return key, v
    return None


def scaling_twin(row: TrialRow, rows: list[TrialRow]) -> TrialRow | None:
    """Return the measured twin with the fewest ranks below `row`'s (the lowest trial number on ties).

    None when `row` was not measured or none ran fewer ranks."""
    n, mine = workers(row), throughput(row)
    if row.status not in MEASURED or n is None or mine is None:
        return None
    found = [e for e in rows if e is not row and e.status in MEASURED and (m := workers(e)) is not None and m < n
             and (theirs := throughput(e)) is not None and theirs[0] == mine[0] and twins(row, e, "num_workers")]
    return min(found, key=lambda e: (workers(e), e.number), default=None)


def efficiency(row: TrialRow, twin: TrialRow) -> float:
    """throughput(N) / (throughput(M) x N / M) x 100 (module doc); both trials have a throughput."""
    (_, mine), (_, theirs) = throughput(row), throughput(twin)  # type: ignore[misc]
    n, m = workers(row), workers(twin)
    return 100.0 * mine / (theirs * n / m)  # type: ignore[operator]


def scaling(outcome: SweepOutcome) -> int:
    """Add perf/scaling_efficiency_pct to every trial that has a twin on fewer ranks; returns how many."""
    done = 0
    for t in outcome.trials:
        twin = scaling_twin(t, outcome.trials)
        if twin is not None:
            t.metrics[SCALING_EFFICIENCY_PCT] = efficiency(t, twin)
            done += 1
    return done


def annotate(outcome: SweepOutcome) -> tuple[str, dict[str, tuple[dict[str, float], dict[str, str]]]]:
    """Run the guardrail, the prediction and the scaling efficiency on a finished sweep's rows (in place).

    Returns the guardrail's note and, per MLflow run id, the metrics and tags to log on that child run."""
    note = guardrail(outcome)
    predict(outcome)
    scaling(outcome)
    updates: dict[str, tuple[dict[str, float], dict[str, str]]] = {}
    for t in outcome.trials:
        metrics = {k: float(t.metrics[k]) for k in (QUALITY_GAP_PCT, PREDICT_TIME_TO_TARGET_S, PREDICT_ERROR_PCT,
                                                    SCALING_EFFICIENCY_PCT, PREDICT_USD_TO_TARGET) if k in t.metrics}
        tags = {DEGRADED_TAG: t.degraded[:5000]} if t.degraded else {}
        if t.run_id and (metrics or tags):
            updates[t.run_id] = (metrics, tags)
    return note, updates


def log_updates(client: Any, updates: dict[str, tuple[dict[str, float], dict[str, str]]]) -> None:
    """Log `annotate`'s metrics and tags on the child runs (finished runs accept both)."""
    import time

    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    for run_id, (metrics, tags) in updates.items():
        client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()],
                         tags=[RunTag(k, v) for k, v in tags.items()])
