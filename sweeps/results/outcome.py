"""What a sweep produced: one row per trial, ranked by the objective. No Ray, no MLflow."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from sweeps.spec import PARAMS_PREFIX, SweepSpec
from sweeps.spec.sections import GLOBAL_BATCH_FIXED
from trainables.contract import (
    ELAPSED_S,
    EVALS,
    FINAL,
    STEPS,
    TARGET_BEST,
    THROUGHPUT_PREFIX,
    TO_TARGET_METRICS,
    throughput_key,
)
from trainables.knobs import KNOBS


def at_word(text: str, width: int) -> str:
    """`text`, or its first words up to `width` characters and "…" when longer: never cut mid-word."""
    if len(text) <= width:
        return text
    cut = text[:width - 1]
    head = cut.rsplit(" ", 1)[0] if " " in cut else cut
    return head.rstrip(" ,;:—-") + "…"


REPLICATE_TAG = "sweep.replicate_of"  # on a replicate's MLflow run: the number of the trial it ran again
MEASURED = ("ok", "infeasible")  # ran to its final report: its figures are real (infeasible breaks a constraint)
NOT_FAILED = (*MEASURED, "pruned", "stopped")  # ended early on purpose; nothing went wrong
UNFINISHED = ("running", "interrupted")  # a resumed sweep runs these (again)
OUT_OF_TIME = "the sweep's time budget"  # how the reason of a trial stopped by `budget.time_budget_s` begins
# What a trial's status says when it did not fail (a failure's kinds: sweeps.service.failures.KIND_MEANING).
STATUS_MEANING: dict[str, str] = {
    "ok": "ran to its final report; its figures rank it",
    "infeasible": "ran to its final report but breaks a constraint (or missed the target): measured, not ranked",
    "pruned": "stopped by ASHA (`search.early_stopping`): behind the others at the same point",
    "stopped": "ended early on purpose: the breaker tripped, or the sweep's time budget ran out",
    "interrupted": "the sweep stopped (a signal, a full disk) while it ran: a resumed sweep runs it again",
    "lost": "the sweep driver died before Ray Tune recorded it; another trial ran in its place",
    "running": "still running (a report on a sweep in progress)",
}


@dataclass
class TrialRow:
    trial_id: str
    number: int
    params: dict[str, Any]
    run_id: str | None = None
    status: str = "running"  # running | ok | <failure kind>
    reason: str = ""
    verdict: str = ""  # "name: one-line reason" for finished trials
    metrics: dict[str, Any] = field(default_factory=dict)
    degraded: str = ""  # why its quality is worse than the fp32 reference's at equal data ("" when fine)
    replicate_of: int | None = None  # the trial whose configuration it ran again (a replicate of a close call)


@dataclass(frozen=True)
class Probed:
    """What the memory probe found for one combination of memory settings (`sweeps.service.probe`).

    The largest batch size that fit and the smallest that ran out of memory (None: none fit / every one tried fit)."""

    setting: dict[str, Any]  # the memory knobs (and accelerator type, worker count, model params) it held
    fits: int | None
    fails: int | None

    def logged(self) -> dict[str, Any]:
        """The setting under the names a trial logs it by (`space.params.<name>` as `workload.<name>`)."""
        return {logged_key(k): v for k, v in self.setting.items()}

    def matches(self, params: dict[str, Any]) -> bool:
        """Whether a trial ran with these settings: it logged each of them, with the probe's value."""
        return all(k in params and same(params[k], v) for k, v in self.logged().items())


def logged_key(key: str) -> str:
    """The name a trial logs a knob by: `space.params.<name>` as `workload.<name>`, the rest as they are."""
    return "workload." + key.removeprefix(PARAMS_PREFIX) if key.startswith(PARAMS_PREFIX) else key


PROBED_TAG = "sweep.probe_frontier"  # the parent run's record of every combination the probe measured (JSON)
PROBED_MAX = 8000  # MLflow's longest tag value (mlflow.utils.validation.MAX_TAG_VAL_LENGTH)


def probed_tag(found: list[Probed]) -> dict[str, str]:
    """Return the parent run's tag for the probe's findings, as compact JSON.

    None over MLflow's 8,000 characters a tag value (~80 combinations; the caller says so); the probe's own line per
    combination, `sweep.probe.<setting>`, still says each."""
    text = json.dumps([asdict(p) for p in found], sort_keys=True, separators=(",", ":"), default=str)
    return {PROBED_TAG: text} if found and len(text) <= PROBED_MAX else {}


def probed_from(tags: dict[str, str]) -> list[Probed]:
    """The probe's findings read back from the parent run's tags ([] where there are none)."""
    try:
        return [Probed(dict(p["setting"]), p.get("fits"), p.get("fails")) for p in json.loads(tags.get(PROBED_TAG) or "[]")]
    except (ValueError, TypeError, KeyError):  # a tag written by hand or cut short: the sentences say less
        return []


def end_status(spec: SweepSpec, metrics: dict[str, Any], tripped: str, out_of_time: bool) -> tuple[str, str, list[str]]:
    """How a trial that Tune ended without an error ended: (status, reason, objective metrics it lacks).

    Finished (final report): ok, or infeasible when it breaks a constraint; without one of the
    objective's metrics it cannot be ranked (the caller stops the sweep). Ended early: stopped by
    the breaker or the time budget, or pruned by ASHA."""
    obj = spec.objective
    if metrics.get(FINAL) == 1:
        missing = [m for m in (*obj.metrics, *(c.metric for c in obj.constraints)) if m not in metrics]
        if obj.target is not None and set(missing) & set(TO_TARGET_METRICS):  # its whole budget short of the target
            best = metrics.get(TARGET_BEST)
            return "infeasible", (f"did not reach {obj.target} within the budget (best {obj.target.metric}="
                                  f"{best:.4g} in {metrics.get(EVALS, 0)} evaluations)" if best is not None else
                                  f"did not reach {obj.target} within the budget"), []
        if missing:
            return "config", "", missing
        broken = [f"{c.metric}={metrics.get(c.metric)} breaks {c}" for c in obj.constraints
                  if c.violation(metrics.get(c.metric)) > 0]
        return ("infeasible" if broken else "ok"), "; ".join(broken), []
    if tripped:
        return "stopped", f"stopped early: {tripped}", []
    if out_of_time:
        return "stopped", f"{OUT_OF_TIME} ({spec.budget.time_budget_s:g}s) ran out", []
    if spec.search.early_stopping is not None and obj.target is not None and obj.time_to_target:
        at, value = metrics.get(ELAPSED_S), metrics.get(obj.target.metric)
        return "pruned", (f"stopped by ASHA after {at:.3g}s of training: {obj.target.metric}={value:.4g} was behind "
                          "the others' at that time" if isinstance(at, (int, float)) and isinstance(value, (int, float))
                          else "stopped by ASHA"), []
    if spec.search.early_stopping is not None:
        return "pruned", (f"stopped by ASHA after {metrics.get(STEPS)} measured steps: "
                          f"{obj.primary}={metrics.get(obj.primary, float('nan')):.4g} was behind the others"), []
    return "stopped", "ended without its final report", []


# Not compared between twins: the knobs declared not to change a step's speed (`Knob.speed`), the rate the
# optimizer ran with and the seed, and what follows from a knob compared itself (global batch from batch_size
# and num_workers, the CPUs reserved from the loader workers and the ranks).
NOT_SPEED = frozenset({k for k, (_, _, declared) in KNOBS.items() if not declared.speed}
                      | {"lr_effective", "seed", "global_batch_size", "cpus_reserved"})


def number(v: Any) -> float | None:
    """A logged value as a number (MLflow gives "128" back for 128); None for text and booleans."""
    if isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def speed_key(spec: SweepSpec, rows: Iterable[TrialRow], need: Callable[[Iterable[bool]], bool] = all) -> str | None:
    """Return the throughput a sentence says its ratios in (None when there is none).

    The objective when it is a throughput, else samples/s, else tokens/s: the first of them that `need` (all, or
    any) of `rows` measured above 0."""
    rows = list(rows)
    keys = (spec.objective.primary, throughput_key("samples"), throughput_key("tokens"))
    return next((k for k in keys if k.startswith(THROUGHPUT_PREFIX) and need((number(r.metrics.get(k)) or 0.0) > 0 for r in rows)),
                None)


def same(a: Any, b: Any) -> bool:
    """Equal as logged: numbers as numbers, the rest as lower-case text."""
    x, y = number(a), number(b)
    return x == y if x is not None and y is not None else str(a).strip().lower() == str(b).strip().lower()


def follows_from_batch(*rows: TrialRow) -> set[str]:
    """Name the params that follow from batch_size and num_workers in these trials.

    That is grad_accum_steps where each ran at the spec's fixed global batch (`GLOBAL_BATCH_FIXED`), else none."""
    fixed = all(same(r.params.get(GLOBAL_BATCH_FIXED), True) for r in rows)
    return {"grad_accum_steps"} if rows and fixed else set()


def twins(a: TrialRow, b: TrialRow, knob: str) -> bool:
    """Tell whether two trials differ at most in `knob` among the params that change a step's speed.

    A param only one of them logged counts as a difference."""
    keys = (a.params.keys() | b.params.keys()) - NOT_SPEED - {knob} - follows_from_batch(a, b)
    return all(k in a.params and k in b.params and same(a.params[k], b.params[k]) for k in keys)


def dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """a is at least as good as b everywhere and better somewhere (all objectives maximised)."""
    return all(x >= y for x, y in zip(a, b, strict=True)) and a != b


def pareto_rows(rows: list[TrialRow], metrics: tuple[str, ...], modes: tuple[str, ...]) -> list[TrialRow]:
    have = [r for r in rows if all(isinstance(r.metrics.get(m), (int, float)) for m in metrics)]
    score = {id(r): tuple(float(r.metrics[m]) * (1 if mo == "max" else -1) for m, mo in zip(metrics, modes, strict=True)) for r in have}
    return [r for r in have if not any(dominates(score[id(q)], score[id(r)]) for q in have)]


@dataclass
class SweepOutcome:
    spec: SweepSpec
    parent_run_id: str
    tracking_uri: str
    trials: list[TrialRow]
    elapsed_s: float
    stopped_reason: str = ""  # set when the circuit breaker stopped the sweep early
    interrupted: str = ""  # set when the sweep stopped before its end and can be resumed (why)
    exhausted: str = ""  # set when the search ran out of configurations before num_trials (what it did then)
    sweep_usd: float | None = None  # what the sweep held at the spec's prices (None: unpriced)
    sweep_usd_short: str = ""  # why sweep_usd is only a lower bound ("": it is the whole cost)
    from_store: bool = False  # read back from MLflow (`sweeps report`, a finished sweep run again), not run now
    probed: list[Probed] = field(default_factory=list)  # what the memory probe found, before the search

    def ranked(self) -> list[TrialRow]:
        """Finished, feasible trials, best first by the (first) objective; failed ones never rank."""
        metric, sign = self.spec.objective.primary, (-1 if self.spec.objective.primary_mode == "max" else 1)
        ok = [t for t in self.trials if t.status == "ok" and isinstance(t.metrics.get(metric), (int, float))]
        # a degraded trial (worse quality than the fp32 reference at equal data) is never ranked best
        return sorted(ok, key=lambda t: (bool(t.degraded), sign * float(t.metrics[metric])))

    def pareto(self) -> list[TrialRow]:
        """Finished, feasible trials no other such trial beats on every objective, by the first."""
        obj = self.spec.objective
        return pareto_rows(self.ranked(), obj.metrics, obj.modes)

    @property
    def best(self) -> TrialRow | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None
