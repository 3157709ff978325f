"""Terminal tables of a sweep's trials."""

from __future__ import annotations

import json
from typing import Any

from sweeps.runner import SweepOutcome, TrialRow
from trainables.contract import DATA_WAIT_PCT, LOSS_VAL, STEP_TIME_MS

_COLUMNS = ("batch_size", "precision", "lr", "num_dataloader_workers", "pin_memory")
_HEAD = {"batch_size": "batch", "precision": "precision", "lr": "lr", "num_dataloader_workers": "loaders", "pin_memory": "pin"}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def trials_table(outcome: SweepOutcome) -> str:
    metric = outcome.spec.objective.metric
    extra = [m for m in (LOSS_VAL, STEP_TIME_MS, DATA_WAIT_PCT) if m != metric]
    head = ["rank", "trial", "status", *[_HEAD[c] for c in _COLUMNS], metric, *extra]
    ranked = outcome.ranked()
    rest = [t for t in outcome.trials if t not in ranked]

    def row(rank: str, t: TrialRow) -> list[str]:
        status = t.status if t.status == "ok" else f"{t.status}"
        return [rank, f"{t.number}:{t.trial_id}", status, *[_fmt(t.params.get(c)) for c in _COLUMNS],
                _fmt(t.metrics.get(metric) if t.status == "ok" else None),
                *[_fmt(t.metrics.get(m) if t.status == "ok" else None) for m in extra]]

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


def best_fragment(outcome: SweepOutcome) -> str:
    """The best configuration as a ready-to-paste `space:` fragment."""
    best = outcome.best
    if best is None:
        return "no trial finished; nothing to recommend"
    lines = ["space:"] + [f"  {c}: {json.dumps(best.params[c])}" for c in _COLUMNS]
    return "\n".join(lines)
