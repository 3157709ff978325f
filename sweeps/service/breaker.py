"""The circuit breaker: the same failure N times in a row stops the sweep.

Such a failure will not fix itself (an ImportError, a missing file); the sweep stops instead of spending its
budget on it."""

from __future__ import annotations

from typing import Any

from ray import tune

from sweeps.results.outcome import NOT_FAILED
from sweeps.search.live_state import current
from sweeps.service.failures import signature


class FailureStreak:
    """Counts trials in a row that failed the same way (kind and error, not the rank that said it)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._same: list[tuple[str, str]] = []

    def add(self, status: str, reason: str) -> str:
        """Record a trial's end; returns why the sweep must stop, or "" to go on."""
        if status in NOT_FAILED:
            self._same = []
            return ""
        failure = signature(status, reason)
        if self._same and self._same[-1] != failure:
            self._same = []
        self._same.append(failure)
        if self.limit and len(self._same) >= self.limit:
            return f"{self.limit} trials in a row failed the same way ({status}: {reason})"
        return ""


class BreakerStopper(tune.Stopper):
    """Stops every trial, and starts no new one, once the sweep callback's breaker trips.

    The breaker is the running sweep's `SearchState.tripped`: Tune copies the stopper, so it holds nothing itself."""

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return bool(current().tripped)
