"""What the sweep prints as it goes: one line per trial event, and what it cost beyond training."""

from __future__ import annotations

import math

from sweeps.outcome import MEASURED, NOT_FAILED, UNFINISHED, TrialRow
from sweeps.spec import SweepSpec
from trainables.contract import LOOP_S


def progress_line(spec: SweepSpec, row: TrialRow, rows: list[TrialRow], elapsed: float) -> str:
    """One line per trial event: what it gave, how the sweep stands, best so far, ETA."""
    done = [r for r in rows if r.status not in UNFINISHED]
    failed = [r for r in done if r.status not in NOT_FAILED]
    metric, mode = spec.objective.primary, spec.objective.primary_mode
    if row.status in MEASURED:
        what = f"{metric}={row.metrics.get(metric, float('nan')):.4g} [{row.verdict.split(':')[0]}]"
        what += f" INFEASIBLE: {row.reason}" if row.status == "infeasible" else ""
    else:
        what = f"{'FAILED' if row in failed else row.status.upper()} ({row.status}: {row.reason})"
    total = spec.budget.num_trials
    eta = elapsed / len(done) * (total - len(done)) if done else math.nan
    ranked = [r for r in done if r.status == "ok" and metric in r.metrics]
    best = ""
    if ranked:
        b = (max if mode == "max" else min)(ranked, key=lambda r: r.metrics[metric])
        best = f" | best {metric}={b.metrics[metric]:.4g} (trial {b.number})"
    return (
        f"[trial {row.number}/{total}] {what} | done {len(done)}/{total}, running {len(rows) - len(done)}, "
        f"failed {len(failed)}{best} | elapsed {elapsed:.0f}s, ETA {eta:.0f}s"
    )


def overhead_line(rows: list[TrialRow], wall_s: float, groups: int | None) -> str:
    """What the sweep cost beyond its training: (sweep wall - the trials' own loop time) / trials."""
    loops = [float(r.metrics[LOOP_S]) for r in rows if isinstance(r.metrics.get(LOOP_S), (int, float))]
    mode = (f"warm worker groups: {groups} started for {len(rows)} trial(s)" if groups is not None
            else "one Ray Train run per trial")
    if not loops:
        return f"{mode}; no trial ran its loop to the end, so no overhead figure"
    return (f"{mode}; per-trial overhead (sweep wall {wall_s:.1f} s - loops {sum(loops):.1f} s) / {len(loops)} = "
            f"{(wall_s - sum(loops)) / len(loops):.1f} s")
