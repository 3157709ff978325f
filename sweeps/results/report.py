"""Terminal tables of a sweep's trials, its answer in words, and `sweeps report` (read back from MLflow).

**Within noise.** On a throughput objective the loop reports how much the throughput varied inside
each trial's measured window (`throughput/<unit>_per_s_cv_pct`: stdev / mean over ~10 sub-windows).
The best and the runner-up are *within noise* when the gap between them (relative to the lower of
the two) is below the larger of their two cvs: a rerun could then swap them, and the answer says
so. Not twice the combined standard error (2 x sqrt(cv1^2 + cv2^2) / sqrt(k)): it needs the number
of sub-windows k, which the metric does not carry, and it assumes independent sub-windows, while
neighbouring ones share clocks, heat and the loader's state. It also answers another question (how
precise one window's mean is) than the one asked here (would a rerun of each configuration keep
the order), and runs of one configuration usually differ by more than that. A sub-window's spread is a
plain, conservative bar: it errs towards "not settled", the cheaper mistake. Without the cv of
either trial nothing is said. The rule is `sweeps.results.verdict.noise_tie`, which the verdicts use too: a
trial slower than another only within that bar is no evidence against what it ran.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from sweeps.results.contention import contended_rows, contention_sentence
from sweeps.results.memory_trade import memory_sentence
from sweeps.results.money import money_key, money_sentence
from sweeps.results.outcome import (
    MEASURED,
    REPLICATE_TAG,
    SweepOutcome,
    TrialRow,
    at_word,
    follows_from_batch,
    logged_key,
    probed_from,
    speed_key,
)
from sweeps.results.payback import payback_sentence
from sweeps.results.quality import DEGRADED_TAG, efficiency, scaling_twin, workers
from sweeps.results.verdict import noise_tie, revise_verdicts, sweep_effects
from sweeps.spec import PARAMS_PREFIX, CategoricalParam, FixedParam, IntParam, Param, Scalar
from trainables.contract import (
    ALLREDUCE_WAIT_PCT,
    DATA_WAIT_PCT,
    GRAD_NOISE_SCALE,
    LOSS_VAL,
    METRIC_KEY,
    PREDICT_ERROR_PCT,
    PREDICT_TIME_TO_TARGET_S,
    QUALITY_GAP_PCT,
    SCALING_EFFICIENCY_PCT,
    SOL_PCT,
    STEP_TIME_MS,
    SWEEP_USD,
    THROUGHPUT_UNITS,
    TIME_TO_TARGET_S,
    TRIAL_USD,
    throughput_cv_key,
)
from trainables.knobs import KNOBS


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


# Quality figures another part of the loop reports; shown where a trial has them.
QUALITY_METRICS = (SCALING_EFFICIENCY_PCT, ALLREDUCE_WAIT_PCT, SOL_PCT, GRAD_NOISE_SCALE, TIME_TO_TARGET_S,
                   PREDICT_TIME_TO_TARGET_S, PREDICT_ERROR_PCT, QUALITY_GAP_PCT)
QUALITY_PARAMS = ("lr_effective",)
FIRST_FAILURE_WIDTH = 400  # the first failure's reason in the last line of a sweep where no trial finished
NOISE_METRICS = tuple(throughput_cv_key(u) for u in THROUGHPUT_UNITS)  # next to the objective, where a trial has it


def degraded(t: TrialRow) -> str:
    """Why a finished trial's result is degraded (the reason, with the gap); empty when it is fine."""
    return str(getattr(t, "degraded", "") or "")


def status_text(t: TrialRow) -> str:
    return f"{t.status} (degraded)" if t.status == "ok" and degraded(t) else t.status


def space_keys(outcome: SweepOutcome) -> list[str]:
    """Return every knob the spec's `space` sets, fixed or searched, in its order.

    The loop's knobs come first, then the trainable's own `params.<name>`."""
    space = outcome.spec.space
    return [k for k in KNOBS if getattr(space, k) is not None] + [PARAMS_PREFIX + k for k in space.params]


def logged_value(t: TrialRow, key: str) -> Any:
    """A knob's value as the trial logged it (`space.params.<name>` is logged as `workload.<name>`)."""
    return t.params.get(logged_key(key))


def knob_split(outcome: SweepOutcome) -> tuple[list[str], dict[str, Any]]:
    """Split the knobs into those that varied over the sweep's trials and those every trial ran alike.

    The knobs that took more than one value are the tables' columns, in the spec's `space` order; the others
    come as {knob: its one value}, said once as "Same in every trial". `lr_effective` joins them where
    lr_scaling made it differ from the searched lr. A trial that did not log a knob differs there from one that
    did (its cell shows "-"); a knob no trial logged is in neither."""
    keys = space_keys(outcome)
    trials = outcome.trials
    keys += [p for p in QUALITY_PARAMS if any(p in t.params and t.params[p] != t.params.get("lr") for t in trials)]
    if outcome.spec.space.num_workers is not None:  # ranks searched: the global batch they make with the batch size
        keys.append("global_batch_size")
    varied: list[str] = []
    same: dict[str, Any] = {}
    for key in keys:
        values = {repr(v): v for v in (logged_value(t, key) for t in trials)}
        if len(values) > 1:
            varied.append(key)
        elif values and (value := next(iter(values.values()))) is not None:
            same[key] = value
    return varied, same


def same_in_every_trial(outcome: SweepOutcome) -> str:
    """The sentence under (terminal) or above (summary.html) the trials table; empty when every knob varied."""
    same = knob_split(outcome)[1]
    return "Same in every trial: " + ", ".join(f"{k} {_fmt(v)}" for k, v in same.items()) + "." if same else ""


def table_rows(outcome: SweepOutcome) -> tuple[list[str], list[tuple[TrialRow, list[Any]]]]:
    """Build the trials table shared by the terminal and summary.html: its header and each trial's raw cells.

    Trials come ranked first, best first, then the rest. One column per knob that varied (`knob_split`);
    quality columns appear only when some trial has them; a figure a trial does not have is None (shown as "-")."""
    obj = outcome.spec.objective
    metric = obj.primary
    noise = [m for m in NOISE_METRICS if any(m in t.metrics for t in outcome.trials)]
    extra = list(dict.fromkeys(m for m in (*noise, *obj.metrics[1:], *(c.metric for c in obj.constraints),
                                           LOSS_VAL, STEP_TIME_MS, DATA_WAIT_PCT) if m != metric))
    extra += [m for m in QUALITY_METRICS if m not in extra and m != metric and any(m in t.metrics for t in outcome.trials)]
    money = money_key(outcome)  # what a trial costs, beside what it measured, where the spec has prices
    extra += [m for m in (money, TRIAL_USD) if m and m not in extra and m != metric and any(m in t.metrics for t in outcome.trials)]
    knobs = knob_split(outcome)[0]
    head = ["rank", "trial", "status", *knobs, metric, *extra]
    ranked = outcome.ranked()
    rest = [t for t in outcome.trials if t not in ranked]

    def row(rank: int | None, t: TrialRow) -> list[Any]:
        measured = t.status in MEASURED
        return [rank, t.number, status_text(t), *[logged_value(t, k) for k in knobs],
                *[t.metrics.get(m) if measured else None for m in (metric, *extra)]]

    return head, [(t, row(i + 1, t)) for i, t in enumerate(ranked)] + [(t, row(None, t)) for t in rest]


def trials_table(outcome: SweepOutcome) -> str:
    """Render the terminal's trials table (`sweeps run`, `sweeps report`).

    The knobs that varied are its columns, what every trial shared is one line under it, then the verdicts and
    why trials failed."""
    head, rows = table_rows(outcome)
    cells = [[_fmt(v) if i else ("-" if v is None else str(v)) for i, v in enumerate(r)] for _, r in rows]
    for (t, _), c in zip(rows, cells, strict=True):
        c[1] = f"{t.number}:{t.trial_id}"
    widths = [max(len(r[i]) for r in [head, *cells]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *cells]]
    same = same_in_every_trial(outcome)
    if same:  # after a blank line: whatever reads the table's rows stops before it
        lines += ["", same]
    ranked = outcome.ranked()
    if ranked:
        lines.append("\nBottleneck verdicts:")
        lines += [f"  trial {t.number}: {t.verdict}" for t in ranked]
    lines += [f"  trial {t.number} degraded: {degraded(t)}" for t in outcome.trials if t.status in MEASURED and degraded(t)]
    said = effects_said(outcome)
    if said:
        lines.append(f"\nMeasured effects across the sweep ({said[0]}):")
        lines += [f"  {line}" for line in said[1:]]
    for t in outcome.trials:
        if t not in ranked and t.reason:
            lines.append(f"  trial {t.number} {t.status}: {t.reason}")
    return "\n".join(lines)


def effects_said(outcome: SweepOutcome) -> list[str]:
    """Say each searched knob's measured effect on the objective (`sweeps.results.effects`).

    First how it was found, then one line per level; empty where the trials cannot separate the knobs."""
    fx = sweep_effects(outcome)
    if fx is None:
        return []
    measured = sum(t.status in MEASURED for t in outcome.trials)
    shared = len(contended_rows(outcome.trials))
    under = f", {shared} of them measured under contention" if shared else ""
    return [f"a fit of log {outcome.spec.objective.primary} over the {measured} measured trials{under}, 95% intervals",
            *(str(e) for e in fx.table())]


def pareto_table(outcome: SweepOutcome) -> str:
    """The trade-off a multi-objective sweep found: one line per Pareto-optimal trial."""
    obj = outcome.spec.objective
    front = outcome.pareto()
    if not front:
        return "no finished trial meets the constraints; no Pareto front"
    lines = [f"Pareto front ({len(front)} of {len(outcome.ranked())} feasible trials; " + ", ".join(
        f"{mo} {me}" for me, mo in zip(obj.metrics, obj.modes, strict=True)) + "):"]
    varied = knob_split(outcome)[0]
    for t in front:
        shown = ", ".join(f"{m}={_fmt(t.metrics[m])}" for m in obj.metrics)
        knobs = ", ".join(f"{k}={_fmt(logged_value(t, k))}" for k in varied)
        lines.append(f"  trial {t.number}: {shown}" + (f" | {knobs}" if knobs else ""))
    return "\n".join(lines)


def pareto_records(outcome: SweepOutcome) -> list[dict[str, Any]]:
    """Return the Pareto front (the best trial for one objective) as flat records for CSV/JSON.

    Each record has every knob of the spec's space (the same columns for every sweep of a spec, varied or not)."""
    obj = outcome.spec.objective
    rows = outcome.pareto() if obj.multi else ([outcome.best] if outcome.best else [])
    return [{"trial": t.number, "trial_id": t.trial_id, "run_id": t.run_id,
             **{m: t.metrics.get(m) for m in obj.metrics}, **{k: logged_value(t, k) for k in space_keys(outcome)}}
            for t in rows]


def best_fragment(outcome: SweepOutcome) -> str:
    """Write the best configuration as a ready-to-paste `space:` section.

    Every loop knob the trial logged and the trainable's own `params` the spec's space held, typed as the spec
    wants them (`precision: '32'`, not the number 32), so `sweeps validate` accepts it and the pasted spec runs
    what that trial ran (its accumulation, under a fixed global batch, follows from the budget again)."""
    best = outcome.best
    if best is None:
        return "no trial finished; nothing to recommend"
    # the worker count where the space held it (else it is scaling.num_workers, which the fragment leaves alone)
    follows = follows_from_batch(best)  # grad_accum_steps where budget.global_batch_size set it
    space: dict[str, Any] = {k: _knob_value(k, best.params[k]) for k in KNOBS if k in best.params and k not in follows
                             and (k != "num_workers" or outcome.spec.space.num_workers is not None)}
    own = {name: _param_value(p, best.params[f"workload.{name}"]) for name, p in outcome.spec.space.params.items()
           if f"workload.{name}" in best.params}  # trial_params logs space.params as workload.<name>
    if own:
        space["params"] = own
    return yaml.safe_dump({"space": space}, sort_keys=False, default_flow_style=False).rstrip()


_BOOLS = {"True": True, "False": False}
_FROM_TEXT: dict[type, Callable[[str], Scalar]] = {bool: _BOOLS.__getitem__, int: int, float: float, str: str}


def _knob_value(knob: str, value: Any) -> Scalar:
    """A knob's value in the type its declaration gives it (`trainables.knobs`), read from its text as MLflow keeps it
    (`str(v)`); guessing the type back instead reads precision "32" as the number 32."""
    return _FROM_TEXT[KNOBS[knob][0]](str(value))


def _param_value(p: Param, value: Any) -> Scalar:
    """A trainable param's logged value in the type its `space.params` entry declares."""
    text = str(value)
    if isinstance(p, FixedParam):
        return p.value
    if isinstance(p, CategoricalParam):
        return next((c for c in p.choices if str(c) == text), _typed(text))
    return int(text) if isinstance(p, IntParam) else float(text)


def _typed(value: str) -> Any:
    if value in ("True", "False"):
        return value == "True"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def rows_from_runs(children: list[Any]) -> list[TrialRow]:
    """Trial rows from a sweep's child runs (the persisted trial -> run mapping is their tag)."""
    rows = []
    for child in children:
        tags = child.data.tags
        verdict = f"{tags['sweep.verdict']}: {tags.get('sweep.verdict_reason', '')}" if "sweep.verdict" in tags else ""
        name = child.info.run_name or ""
        number = int(name.split("-")[1]) if name.startswith("trial-") else 0
        params = {k: _knob_value(k, v) if k in KNOBS else _typed(v) for k, v in child.data.params.items()}
        # the loop's text facts (device/cpu_isa) were logged as tags: back beside the numbers, as the sweep had them
        metrics = {**{k: v for k, v in tags.items() if METRIC_KEY.match(k)}, **child.data.metrics}
        row = TrialRow(tags.get("sweep.trial_id", child.info.run_id), number, params, child.info.run_id,
                       tags.get("sweep.status", "running"), tags.get("sweep.failure_reason", ""), verdict, metrics)
        row.degraded = tags.get(DEGRADED_TAG, "")  # the reason sweeps.results.quality tagged it with
        row.replicate_of = int(tags[REPLICATE_TAG]) if tags.get(REPLICATE_TAG, "").isdigit() else None
        rows.append(row)
    return sorted(rows, key=lambda r: r.number)


def load_outcome(client: Any, name_or_run_id: str) -> SweepOutcome:
    """Rebuild a sweep's outcome from MLflow: the latest parent run named so, or that run id."""
    from mlflow.exceptions import MlflowException

    from sweeps.spec import parse_spec
    from sweeps.tracking import child_runs

    parent = None
    try:
        parent = client.get_run(name_or_run_id)
    except MlflowException:
        exp_ids = [e.experiment_id for e in client.search_experiments()]
        found = client.search_runs(exp_ids, f"tags.`sweep.name` = '{name_or_run_id}'", order_by=["attributes.start_time DESC"], max_results=1)
        parent = found[0] if found else None
    if parent is None or "mlflow.parentRunId" in parent.data.tags:
        raise ValueError(f"no sweep named {name_or_run_id!r} (and no parent run with that id) in {client.tracking_uri}; "
                         "check --tracking-uri or the sweep name")
    run_id = parent.info.run_id
    with tempfile.TemporaryDirectory(prefix="sweep-spec-") as tmp:  # MLflow's own temp folder would stay
        text = Path(client.download_artifacts(run_id, "spec.yaml", tmp)).read_text()
        prices = None  # what its price file said when the sweep started: read back, not the file again
        if any(f.path == "prices.json" for f in client.list_artifacts(run_id)):
            prices = json.loads(Path(client.download_artifacts(run_id, "prices.json", tmp)).read_text())
        spec = parse_spec(text, f"spec.yaml of run {run_id}", prices=prices)
    rows = rows_from_runs(child_runs(client, parent.info.experiment_id, run_id))
    elapsed = ((parent.info.end_time or parent.info.start_time) - parent.info.start_time) / 1000
    tags = parent.data.tags
    outcome = SweepOutcome(spec, run_id, client.tracking_uri, rows, elapsed, tags.get("sweep.stopped", ""),
                           tags.get("sweep.interrupted", ""), tags.get("sweep.exhausted", ""),
                           parent.data.metrics.get(SWEEP_USD), tags.get("sweep.cost_at_least", ""), from_store=True,
                           probed=probed_from(tags))
    revise_verdicts(outcome)  # as the sweep does at its end; a no-op where it logged its revision
    return outcome


def to_json(outcome: SweepOutcome) -> dict[str, Any]:
    best = outcome.best
    return {
        "sweep": outcome.spec.name,
        "parent_run_id": outcome.parent_run_id,
        "stopped_early": outcome.stopped_reason or None,
        "interrupted": outcome.interrupted or None,
        "exhausted": outcome.exhausted or None,
        "objective": {"metric": outcome.spec.objective.metric, "mode": outcome.spec.objective.mode,
                      "constraints": [str(c) for c in outcome.spec.objective.constraints]},
        "answer": answer(outcome),
        "pareto": pareto_records(outcome),
        "best": None if best is None else {"trial": best.trial_id, "run_id": best.run_id, "params": best.params,
                                             "metrics": best.metrics, "verdict": best.verdict},
        "trials": [{"trial": t.trial_id, "number": t.number, "run_id": t.run_id, "status": t.status, "reason": t.reason,
                    "verdict": t.verdict, "degraded": degraded(t) or None, "params": t.params, "metrics": t.metrics}
                   for t in outcome.trials],
    }


def next_steps(outcome: SweepOutcome, noise: bool = True) -> str:
    """Say what to try next, from the best trial's verdict, and whether the runner-up is as good.

    The rules live in sweeps.results.verdict. `noise`: say so here, where the answer is not shown beside it."""
    best = outcome.best
    if best is None or not best.verdict:
        failed = next((t for t in sorted(outcome.trials, key=lambda t: t.number) if t.reason), None)
        if failed is None:
            return "no finished trial to learn from; fix the failures listed above first"
        # the log's last line, which `ray job status` shows alone: the first failure's reason itself (issue 50)
        return (f"no finished trial to learn from; fix the first failure first, trial {failed.number} "
                f"{failed.status}: {at_word(failed.reason, FIRST_FAILURE_WIDTH)}")
    tie = within_noise(outcome) if noise else ""
    return f"best trial {best.number} is {best.verdict}" + (f". {tie[0].upper()}{tie[1:]}" if tie else "")


def within_noise(outcome: SweepOutcome) -> str:
    """Say that the best and the runner-up are within noise, or return "" when they are not.

    The rule, `noise_tie`, is argued in this module's docstring. Empty when they are apart, the objective is not
    a throughput, a cv is missing, or either is degraded (then the other is the answer)."""
    ranked = outcome.ranked()
    if len(ranked) < 2 or degraded(ranked[0]) or degraded(ranked[1]):
        return ""
    (a, b), tie = ranked[:2], noise_tie(ranked[0], ranked[1], outcome.spec.objective.primary)
    if tie is None:
        return ""
    gap, cv_a, cv_b = tie
    return (f"trial {a.number} and trial {b.number} are within noise: {gap:.1f}% apart, inside their sub-window "
            f"spread (cv {cv_a:.1f}% / {cv_b:.1f}%), so neither is measurably faster")


COMPARE_AT_MOST = 30  # more runs than this make MLflow's compare view unreadable (and its URL long)


def compared_run_ids(outcome: SweepOutcome, at_most: int = COMPARE_AT_MOST) -> list[str]:
    """The trials worth comparing in MLflow: the measured ones, best first, at most `at_most`."""
    ranked = outcome.ranked()
    measured = ranked + [t for t in outcome.trials if t.status in MEASURED and t not in ranked]
    return [t.run_id for t in measured if t.run_id][:at_most]


def baseline(outcome: SweepOutcome) -> TrialRow | None:
    """Return the classic reference point, or None when no such trial finished.

    That is the finished fp32 trial with the smallest batch (then the fewest loader workers, no compile): what
    a user runs before any tuning."""
    fp32 = [t for t in outcome.ranked() if str(t.params.get("precision")) == "32"]
    return min(fp32, key=lambda t: (float(t.params.get("batch_size") or 0), float(t.params.get("num_dataloader_workers") or 0),
                                    str(t.params.get("compile")) == "True", t.number), default=None)


def configuration(outcome: SweepOutcome, t: TrialRow) -> str:
    """A trial's searched knobs in words: `precision bf16-mixed, batch_size 128, ...`."""
    logged = {k: logged_value(t, k) for k in outcome.spec.space.searched()}
    return ", ".join(f"{k} {v}" for k, v in logged.items() if v is not None) or "the spec's fixed configuration"


def speedups(outcome: SweepOutcome) -> list[tuple[str, TrialRow, float]]:
    """(what, trial, best's throughput / that trial's) against the slowest finished trial and the baseline."""
    key, best = speed_key(outcome.spec, outcome.ranked(), any), outcome.best
    if key is None or best is None or key not in best.metrics:
        return []
    have = [t for t in outcome.ranked() if isinstance(t.metrics.get(key), (int, float)) and t.metrics[key] > 0]
    out: list[tuple[str, TrialRow, float]] = []
    if have:
        slowest = min(have, key=lambda t: t.metrics[key])
        out.append(("the slowest", slowest, best.metrics[key] / slowest.metrics[key]))
    base = baseline(outcome)
    if base is not None and base in have:
        out.append((f"the fp32 / batch-{base.params.get('batch_size')} baseline", base, best.metrics[key] / base.metrics[key]))
    return out


def answer(outcome: SweepOutcome) -> str:
    """The sweep's answer in one markdown paragraph (the parent run's description in MLflow)."""
    spec, best = outcome.spec, outcome.best
    done = f"{len(outcome.ranked())}/{len(outcome.trials)} trials finished"
    if best is None:
        return (f"**No answer**: {done}, none feasible with its objective metric ({spec.objective.describe()}). "
                "See the failed trials' `sweep.failure_reason` tags.")
    metric = spec.objective.primary
    key = speed_key(spec, outcome.ranked(), any)
    text = (f"**Best: trial {best.number}** ({configuration(outcome, best)}) with {metric} = "
            f"{_fmt(best.metrics[metric])}")
    ups = speedups(outcome)
    if len(ups) == 2 and ups[0][1] is ups[1][1]:  # the baseline is the slowest trial: say it once
        ups = [(f"{ups[0][0]}, which is {ups[1][0]}", ups[0][1], ups[0][2])]
    if ups and key is not None:
        text += "; " + " and ".join(
            f"**{x:.2f}×** {what} (trial {t.number}, {_fmt(t.metrics[key])})" for what, t, x in ups)
        text += f" in {key}" if key != metric else ""
    text += f". {done}"
    ranks = ranks_sentence(outcome, best)
    if ranks:
        text += f"; {ranks}"
    if spec.objective.multi:
        text += f"; the Pareto front has {len(outcome.pareto())} trial(s) (`report/pareto.csv`)"
    text += "."
    tie = within_noise(outcome)
    if tie:
        text += f" {tie[0].upper()}{tie[1:]}."
    if best.verdict:
        text += f" Verdict: *{best.verdict}*."
    said = effects_said(outcome)
    if said:
        text += f" Measured effects across the sweep ({said[0]}): " + "; ".join(said[1:]) + "."
    money = money_sentence(outcome, lambda t: configuration(outcome, t))
    if money:
        text += f" {money}"
    memory = memory_sentence(outcome, lambda t: configuration(outcome, t))
    if memory:
        text += f" {memory}."
    text += f" {compiled}." if (compiled := payback_sentence(outcome)) else ""
    shared = contention_sentence(outcome)
    if shared:
        text += f" Caution, {shared[0].lower()}{shared[1:]}."
    if degraded(best):
        text += f" Caution, its result is degraded: {degraded(best)}."
    if outcome.stopped_reason:
        text += f" The sweep stopped early: {outcome.stopped_reason}."
    if outcome.interrupted:
        text += f" Not finished: {outcome.interrupted}."
    if outcome.exhausted:
        text += f" The search ran out of configurations: {outcome.exhausted}."
    return text + " The full report: the `report/summary.html` artifact."


def ranks_sentence(outcome: SweepOutcome, t: TrialRow) -> str:
    """Say how many ranks the trial runs on and how well they scale, where the sweep searched the worker count.

    Its efficiency against its twin on the fewest ranks measured, else that it is the fewest measured."""
    n = workers(t)
    if outcome.spec.space.num_workers is None or n is None:
        return ""
    twin = scaling_twin(t, outcome.trials)
    if twin is not None:
        return (f"it runs on **{n} ranks** at {efficiency(t, twin):.0f}% scaling efficiency against "
                f"{workers(twin)} (trial {twin.number})")
    fewest = min((m for r in outcome.trials if r.status in MEASURED and (m := workers(r)) is not None), default=n)
    rank_s = f"{n} rank{'s' if n != 1 else ''}"
    return (f"it runs on **{rank_s}**, the fewest measured" if n <= fewest else
            f"it runs on **{rank_s}**; no twin on fewer ranks was measured, so its scaling efficiency is not known")


def sweep_note(outcome: SweepOutcome) -> str:
    """The parent run's description (markdown): the answer, then the spec's own description."""
    text = answer(outcome)
    return f"{text}\n\n---\n\n{outcome.spec.description}" if outcome.spec.description else text
