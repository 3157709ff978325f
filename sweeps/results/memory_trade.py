"""The answer in memory: what the best configuration holds per rank, and what the leanest one saves and costs.

Where a sweep varied a setting whose purpose is to trade speed for memory (the strategy, activation
checkpointing: `TRADES`; the batch and the precision decide memory too, but a sweep searches them for speed and
says their effect elsewhere), the trade is said from what the trials measured: the best
trial's peak per rank beside its prediction, and the trial with the smallest peak, how much less it holds and at
what share of the best's throughput. A GPU's figure is the allocator's peak (`memory/max_allocated_gib`); a CPU's
the rank's resident set (`memory/peak_rss_gib`), which also holds the process's libraries and data, so there the
prediction (model states and activations only) sits below it and the two are compared by their order.
"""

from __future__ import annotations

from collections.abc import Callable

from sweeps.results.outcome import SweepOutcome, TrialRow, number
from trainables.contract import (
    MEM_MAX_ALLOCATED_GIB,
    MEM_PEAK_RSS_GIB,
    MEM_PREDICTED_GIB,
    THROUGHPUT_PREFIX,
    throughput_key,
)

TRADES = ("strategy", "activation_checkpointing")  # each trades compute or communication for memory per rank


def peak_key(rows: list[TrialRow]) -> str | None:
    """The measured peak the trials share: the GPU allocator's where every trial has it, else the resident set."""
    for key in (MEM_MAX_ALLOCATED_GIB, MEM_PEAK_RSS_GIB):
        if rows and all(number(t.metrics.get(key)) is not None for t in rows):
            return key
    return None


def _peak(t: TrialRow, key: str) -> str:
    predicted = number(t.metrics.get(MEM_PREDICTED_GIB))
    said = f"{t.metrics[key]:.2f} GiB per rank"
    return said + (f" (predicted {predicted:.2f})" if predicted is not None else "")


def memory_sentence(outcome: SweepOutcome, configuration: Callable[[TrialRow], str]) -> str:
    """Say the memory trade; empty where no `TRADES` setting varied or fewer than two trials measured a peak."""
    searched = outcome.spec.space.searched()
    if not any(k in searched for k in TRADES):
        return ""
    have = [t for t in outcome.ranked() if not t.degraded]
    key = peak_key(have)
    best = outcome.best
    if key is None or len(have) < 2 or best is None or best not in have:
        return ""
    kind = "allocator peak" if key == MEM_MAX_ALLOCATED_GIB else "resident set, libraries and data included"
    leanest = min(have, key=lambda t: (t.metrics[key], t.number))
    text = f"Memory ({kind}): the best, trial {best.number}, peaks at {_peak(best, key)}"
    if leanest is best:
        heaviest = max(have, key=lambda t: (t.metrics[key], -t.number))
        return text + (f", the least of the sweep (the most: trial {heaviest.number}, {configuration(heaviest)}, "
                       f"{_peak(heaviest, key)})")
    saved = 100.0 * (1.0 - leanest.metrics[key] / best.metrics[key]) if best.metrics[key] > 0 else 0.0
    text += f"; the least, trial {leanest.number} ({configuration(leanest)}), {_peak(leanest, key)}: {saved:.0f}% less"
    speed = next((k for k in (outcome.spec.objective.primary, throughput_key("samples"), throughput_key("tokens"))
                  if k.startswith(THROUGHPUT_PREFIX) and k in best.metrics and k in leanest.metrics), None)
    if speed is not None and best.metrics[speed] > 0:
        text += f", at {leanest.metrics[speed] / best.metrics[speed]:.2f}x the best's {speed}"
    return text
