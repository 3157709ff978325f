"""Terminal tables of a sweep's trials."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from sweeps.outcome import MEASURED, SweepOutcome, TrialRow
from sweeps.spec import KNOBS, CategoricalParam, FixedParam, IntParam, Param, Scalar
from trainables.contract import DATA_WAIT_PCT, LOSS_VAL, STEP_TIME_MS

_COLUMNS = ("batch_size", "precision", "lr", "num_dataloader_workers", "pin_memory")
_HEAD = {"batch_size": "batch", "precision": "precision", "lr": "lr", "num_dataloader_workers": "loaders", "pin_memory": "pin"}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def trials_table(outcome: SweepOutcome) -> str:
    obj = outcome.spec.objective
    metric = obj.primary
    extra = list(dict.fromkeys(m for m in (*obj.metrics[1:], *(c.metric for c in obj.constraints),
                                           LOSS_VAL, STEP_TIME_MS, DATA_WAIT_PCT) if m != metric))
    head = ["rank", "trial", "status", *[_HEAD[c] for c in _COLUMNS], metric, *extra]
    ranked = outcome.ranked()
    rest = [t for t in outcome.trials if t not in ranked]

    def row(rank: str, t: TrialRow) -> list[str]:
        status = t.status if t.status == "ok" else f"{t.status}"
        return [rank, f"{t.number}:{t.trial_id}", status, *[_fmt(t.params.get(c)) for c in _COLUMNS],
                _fmt(t.metrics.get(metric) if t.status in MEASURED else None),
                *[_fmt(t.metrics.get(m) if t.status in MEASURED else None) for m in extra]]

    rows = [row(str(i + 1), t) for i, t in enumerate(ranked)] + [row("-", t) for t in rest]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows]]
    if ranked:
        lines.append("\nBottleneck verdicts:")
        lines += [f"  trial {t.number}: {t.verdict}" for t in ranked]
    for t in rest:
        if t.reason:
            lines.append(f"  trial {t.number} {t.status}: {t.reason}")
    return "\n".join(lines)


def pareto_table(outcome: SweepOutcome) -> str:
    """The trade-off a multi-objective sweep found: one line per Pareto-optimal trial."""
    obj = outcome.spec.objective
    front = outcome.pareto()
    if not front:
        return "no finished trial meets the constraints; no Pareto front"
    lines = [f"Pareto front ({len(front)} of {len(outcome.ranked())} feasible trials; " + ", ".join(
        f"{mo} {me}" for me, mo in zip(obj.metrics, obj.modes, strict=True)) + "):"]
    for t in front:
        shown = ", ".join(f"{m}={_fmt(t.metrics[m])}" for m in obj.metrics)
        knobs = ", ".join(f"{c}={_fmt(t.params.get(c))}" for c in _COLUMNS)
        lines.append(f"  trial {t.number}: {shown} | {knobs}")
    return "\n".join(lines)


def pareto_records(outcome: SweepOutcome) -> list[dict[str, Any]]:
    """The Pareto front (the best trial for one objective) as flat records for CSV/JSON."""
    obj = outcome.spec.objective
    rows = outcome.pareto() if obj.multi else ([outcome.best] if outcome.best else [])
    return [{"trial": t.number, "trial_id": t.trial_id, "run_id": t.run_id,
             **{m: t.metrics.get(m) for m in obj.metrics}, **{c: t.params.get(c) for c in _COLUMNS}} for t in rows]


def best_fragment(outcome: SweepOutcome) -> str:
    """The best configuration as a ready-to-paste `space:` section: every loop knob the trial logged and
    the trainable's own `params` the spec's space held, typed as the spec wants them (`precision: '32'`,
    not the number 32), so `sweeps validate` accepts it and the pasted spec runs what that trial ran."""
    best = outcome.best
    if best is None:
        return "no trial finished; nothing to recommend"
    space: dict[str, Any] = {k: _knob_value(k, best.params[k]) for k in KNOBS if k in best.params}
    own = {name: _param_value(p, best.params[f"workload.{name}"]) for name, p in outcome.spec.space.params.items()
           if f"workload.{name}" in best.params}  # trial_params logs space.params as workload.<name>
    if own:
        space["params"] = own
    return yaml.safe_dump({"space": space}, sort_keys=False, default_flow_style=False).rstrip()


_BOOLS = {"True": True, "False": False}
_FROM_TEXT: dict[type, Callable[[str], Scalar]] = {bool: _BOOLS.__getitem__, int: int, float: float, str: str}


def _knob_value(knob: str, value: Any) -> Scalar:
    """A knob's value in the type `sweeps.spec.KNOBS` gives it, read from its text as MLflow keeps it
    (`str(v)`); guessing the type back instead reads precision "32" as the number 32."""
    return _FROM_TEXT[KNOBS[knob][1]](str(value))


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
        rows.append(TrialRow(tags.get("sweep.trial_id", child.info.run_id), number, params, child.info.run_id,
                             tags.get("sweep.status", "running"), tags.get("sweep.failure_reason", ""), verdict,
                             dict(child.data.metrics)))
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
    with open(client.download_artifacts(run_id, "spec.yaml")) as f:
        spec = parse_spec(f.read(), f"spec.yaml of run {run_id}")
    rows = rows_from_runs(child_runs(client, parent.info.experiment_id, run_id))
    elapsed = ((parent.info.end_time or parent.info.start_time) - parent.info.start_time) / 1000
    tags = parent.data.tags
    return SweepOutcome(spec, run_id, client.tracking_uri, rows, elapsed, tags.get("sweep.stopped", ""),
                        tags.get("sweep.interrupted", ""))


def to_json(outcome: SweepOutcome) -> dict[str, Any]:
    best = outcome.best
    return {
        "sweep": outcome.spec.name,
        "parent_run_id": outcome.parent_run_id,
        "stopped_early": outcome.stopped_reason or None,
        "interrupted": outcome.interrupted or None,
        "objective": {"metric": outcome.spec.objective.metric, "mode": outcome.spec.objective.mode,
                      "constraints": [str(c) for c in outcome.spec.objective.constraints]},
        "pareto": pareto_records(outcome),
        "best": None if best is None else {"trial": best.trial_id, "run_id": best.run_id, "params": best.params,
                                             "metrics": best.metrics, "verdict": best.verdict},
        "trials": [{"trial": t.trial_id, "number": t.number, "run_id": t.run_id, "status": t.status, "reason": t.reason,
                    "verdict": t.verdict, "params": t.params, "metrics": t.metrics} for t in outcome.trials],
    }


def next_steps(outcome: SweepOutcome) -> str:
    """What to try next, from the best trial's verdict (the rules live in sweeps.verdict)."""
    best = outcome.best
    if best is None or not best.verdict:
        return "no finished trial to learn from; fix the failures listed above first"
    return f"best trial {best.number} is {best.verdict}"
