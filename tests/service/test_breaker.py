"""The circuit breaker's streak on its own (`sweeps/service/breaker.py`)."""

from __future__ import annotations

import torch

CPU = torch.device("cpu")




def test_the_breakers_streak_counts_the_same_failure_in_a_row() -> None:
    from sweeps.service.breaker import FailureStreak

    streak = FailureStreak(limit=3)
    assert streak.add("error", "rank 0: ImportError: no module x") == ""
    assert streak.add("error", "rank 1: ImportError: no module x") == ""  # another rank said it: the same
    assert streak.add("ok", "") == ""  # a success breaks the streak
    for _ in range(2):
        assert streak.add("crash", "gloo [127.0.0.1]:4000 Connection reset") == ""
    assert streak.add("crash", "gloo [127.0.0.1]:4111 Connection reset").startswith("3 trials in a row failed the same way")
    assert FailureStreak(limit=0).add("error", "x") == ""  # 0: never
