"""What a sweep produced: one row per trial, ranked by the objective. No Ray, no MLflow."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sweeps.spec import SweepSpec


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


@dataclass
class SweepOutcome:
    spec: SweepSpec
    parent_run_id: str
    tracking_uri: str
    trials: list[TrialRow]
    elapsed_s: float
    stopped_reason: str = ""  # set when the circuit breaker stopped the sweep early

    def ranked(self) -> list[TrialRow]:
        """Finished trials, best first by the objective; failed ones never rank."""
        metric, sign = self.spec.objective.metric, (-1 if self.spec.objective.mode == "max" else 1)
        ok = [t for t in self.trials if t.status == "ok" and isinstance(t.metrics.get(metric), (int, float))]
        return sorted(ok, key=lambda t: sign * float(t.metrics[metric]))

    @property
    def best(self) -> TrialRow | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None
