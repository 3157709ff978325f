"""The answer in memory: what the best configuration holds per rank, and what the leanest one saves and costs.

Where a sweep varied a setting whose purpose is to trade speed for memory (the strategy, activation
checkpointing: `TRADES`; the batch and the precision decide memory too, but a sweep searches them for speed and
says their effect elsewhere), the trade is said from what the trials measured: the best
trial's peak per rank beside its prediction, and the trial with the smallest peak, how much less it holds and at
what share of the best's throughput. A GPU's figure is the allocator's peak (`memory/max_allocated_gib`); a CPU's
the rank's resident set (`memory/peak_rss_gib`), which also holds the process's libraries and data, so there the
prediction (model states and activations only) sits below it and the two are compared by their order.

**Memory-bound** (`frontier_sentence`): where the best trial's batch is the largest its memory settings ran (a larger
batch with the same settings ran out of memory), the sentence says which setting let the larger batch fit (a trial at
that batch that differs only in one `TRADES` setting and finished), what that setting costs at the best's own batch
(its twin there, measured), and how the larger batch with it ran against the best: "Memory-bound: batch_size 8 is the
largest that fit with activation_checkpointing none (16 ran out of memory: trial 5); 16 fit with
activation_checkpointing selective (trial 7), which costs 12% of the throughput at batch_size 8 (trial 3 vs trial
1), and ran at 0.95x the best's throughput/tokens_per_s". Only what the sweep measured is said: no OOM, or no
leaner trial at the larger batch, and the sentence says less or nothing. With the memory probe on, no trial runs a
batch the probe saw fail: the probe's findings (`SweepOutcome.probed`) then stand in for the OOM trial, and for the
leaner trial where none ran ("the memory probe").
"""

from __future__ import annotations

from collections.abc import Callable

from sweeps.results.outcome import SweepOutcome, TrialRow, number, same, speed_key, twins
from trainables.contract import (
    MEM_MAX_ALLOCATED_GIB,
    MEM_PEAK_RSS_GIB,
    MEM_PREDICTED_GIB,
)

TRADES = ("strategy", "activation_checkpointing", "cpu_offload")  # each trades compute or communication for memory per rank


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
    """Say the memory trade: the peaks, then whether the best is memory-bound.

    They are `peaks_sentence` and `frontier_sentence`; empty where neither has anything to say."""
    return ". ".join(s for s in (peaks_sentence(outcome, configuration), frontier_sentence(outcome)) if s)


def peaks_sentence(outcome: SweepOutcome, configuration: Callable[[TrialRow], str]) -> str:
    """Say the peaks per rank; empty where no `TRADES` setting varied or fewer than two trials measured a peak."""
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
    speed = speed_key(outcome.spec, (best, leanest))
    if speed is not None:
        text += f", at {leanest.metrics[speed] / best.metrics[speed]:.2f}x the best's {speed}"
    return text


def _said(knob: str, value: object) -> str:
    return f"{knob} {value}"


def _bound(outcome: SweepOutcome, best: TrialRow) -> tuple[TrialRow, str] | None:
    """The smallest batch above the best's that ran out of memory with the best's settings, as a row (a trial, or
    the best's settings at the batch the memory probe saw fail), and how the sweep knows it; None where none did."""
    batch = number(best.params.get("batch_size"))
    if batch is None:
        return None
    out = [t for t in outcome.trials if t.status == "oom" and twins(best, t, "batch_size")
           and (number(t.params.get("batch_size")) or 0) > batch]
    if out:
        oom = min(out, key=lambda t: (number(t.params["batch_size"]), t.number))
        return oom, f"{oom.params['batch_size']} ran out of memory: trial {oom.number}"
    # the probe bounds the search: with it, a batch that does not fit is never a trial
    probe = next((p for p in outcome.probed if p.fails is not None and number(p.fits) == batch
                  and p.matches(best.params)), None)
    if probe is None:
        return None
    return (TrialRow("probe", 0, {**best.params, "batch_size": probe.fails}, status="oom"),
            f"{probe.fails} ran out of memory in the memory probe")


def _probe_fits(outcome: SweepOutcome, oom: TrialRow, knobs: list[str]) -> str:
    """A memory setting the probe found `oom`'s batch fits with, where it differs from `oom`'s in one of `knobs`."""
    larger = number(oom.params["batch_size"]) or 0
    for p in outcome.probed:
        setting = p.logged()
        if not all(k in oom.params for k in setting):  # a setting the trials do not log: not theirs to compare
            continue
        other = [k for k, v in setting.items() if not same(oom.params[k], v)]
        if len(other) == 1 and other[0] in knobs and (number(p.fits) or 0) >= larger:
            return f"; {oom.params['batch_size']} fits with {_said(other[0], setting[other[0]])} (the memory probe; no trial ran it)"
    return ""


def frontier_sentence(outcome: SweepOutcome) -> str:
    """Say that the best trial is memory-bound, and what the sweep measured would let a larger batch fit.

    Empty where no larger batch with the best's settings ran out of memory (in a trial, or in the memory probe,
    which keeps such batches out of the search), or no memory setting or batch was searched."""
    searched, best = outcome.spec.space.searched(), outcome.best
    if best is None or "batch_size" not in searched or not any(k in searched for k in TRADES):
        return ""
    bound = _bound(outcome, best)
    if bound is None:
        return ""
    oom, how = bound
    larger = oom.params["batch_size"]
    held = ", ".join(_said(k, best.params.get(k)) for k in TRADES if k in searched)
    text = f"Memory-bound: batch_size {best.params['batch_size']} is the largest that fit with {held} ({how})"
    fit = [(k, t) for t in outcome.trials if t.status == "ok" and same(t.params.get("batch_size"), larger)
           for k in TRADES if k in searched and not same(t.params.get(k), oom.params.get(k)) and twins(oom, t, k)]
    if not fit:
        return text + (_probe_fits(outcome, oom, [k for k in TRADES if k in searched])
                       or "; no trial ran it with another memory setting")
    speed = speed_key(outcome.spec, (best,))
    knob, leaner = max(fit, key=lambda kt: (number(kt[1].metrics.get(speed or "")) or 0.0, -kt[1].number))
    text += f"; {larger} fit with {_said(knob, leaner.params[knob])} (trial {leaner.number})"
    cost = [t for t in outcome.ranked() if twins(best, t, knob) and same(t.params.get(knob), leaner.params[knob])]
    if speed is not None and cost and number(cost[0].metrics.get(speed)):
        ratio = cost[0].metrics[speed] / best.metrics[speed]
        text += (f", which costs {100 * (1 - ratio):.0f}% of the throughput at batch_size {best.params['batch_size']} "
                 f"(trial {cost[0].number} vs trial {best.number})" if ratio < 1 else
                 f", which costs nothing measurable at batch_size {best.params['batch_size']} (trial {cost[0].number}: "
                 f"{ratio:.2f}x trial {best.number})")
    if speed is not None and number(leaner.metrics.get(speed)):
        text += f", and ran at {leaner.metrics[speed] / best.metrics[speed]:.2f}x the best's {speed}"
    return text
