"""When compiling pays for itself, from a pair of trials that differ only in `compile`.

The seconds `torch.compile` adds before the first measured step are set against the milliseconds it saves per
step, both measured. The seconds are the difference of the twins' `time/warmup_s` (the build, loader start-up, compilation and the
same number of warm-up steps), the saving the difference of their `time/step_ms`; the payback is their quotient
in optimizer steps: "Compile: trial 5 spent 41 s more before its measured window than trial 6 (compile off) and
takes 12.0 ms less per step (88.0 vs 100.0 ms): it pays for itself after 3,417 steps (41 s / 12.0 ms)". A compiled
trial that is no faster per step never pays back, and is said so. The pair is the best trial and its compile
twin, else the fastest compiled trial and its eager twin. A compiled trial that compiled no graph itself
(`compile/graphs_captured` 0: a warm rank ran code an earlier trial compiled; or inductor compiled none and took
them from its cache)
has little or no compilation in its seconds, and the sentence says so: a first compile costs more.
"""

from __future__ import annotations

from sweeps.results.outcome import SweepOutcome, TrialRow, number, same, twins
from trainables.contract import COMPILE_CACHE_HITS, COMPILE_CACHE_MISSES, COMPILE_GRAPHS, STEP_TIME_MS, WARMUP_S


def _on(t: TrialRow) -> bool:
    return same(t.params.get("compile"), True)


def _pair(outcome: SweepOutcome) -> tuple[TrialRow, TrialRow] | None:
    """(compiled, eager) twins, both with a step time and a warm-up time; the best's own pair first."""
    have = [t for t in outcome.ranked() if all(number(t.metrics.get(k)) is not None for k in (STEP_TIME_MS, WARMUP_S))]
    for t in have:  # best first
        twin = next((e for e in have if e is not t and _on(e) != _on(t) and twins(t, e, "compile")), None)
        if twin is not None:
            return (t, twin) if _on(t) else (twin, t)
    return None


def _none_compiled(on: TrialRow) -> str:
    """Where the compiled trial compiled no graph: why, and that its seconds understate a first compile."""
    captured, cached, compiled = (number(on.metrics.get(k)) for k in (COMPILE_GRAPHS, COMPILE_CACHE_HITS,
                                                                      COMPILE_CACHE_MISSES))
    if captured == 0:  # dynamo ran code it had compiled for an earlier trial's model
        how = "ran code an earlier trial of its warm process compiled"
    elif compiled == 0 and cached:  # inductor compiled nothing and found graphs (the cache off counts neither)
        how = "took its graphs from the compile cache"
    else:
        return ""
    return f"; trial {on.number} compiled no graph: it {how}, so a first compile adds more than this"


def payback_sentence(outcome: SweepOutcome) -> str:
    """Say compile's cost in seconds and the step at which it pays back.

    Empty where `compile` was not searched or no pair of twins measured both figures."""
    if "compile" not in outcome.spec.space.searched():
        return ""
    pair = _pair(outcome)
    if pair is None:
        return ""
    on, off = pair
    extra = float(on.metrics[WARMUP_S]) - float(off.metrics[WARMUP_S])
    a, b = float(on.metrics[STEP_TIME_MS]), float(off.metrics[STEP_TIME_MS])
    text = (f"Compile: trial {on.number} spent {abs(extra):.0f} s {'more' if extra >= 0 else 'less'} before its "
            f"measured window than trial {off.number} (compile off{_none_compiled(on)})")
    if a >= b:
        return text + f" and is no faster per step ({a:.1f} vs {b:.1f} ms): it never pays back here"
    text += f" and takes {b - a:.1f} ms less per step ({a:.1f} vs {b:.1f} ms)"
    if extra <= 0:
        return text + ": it pays from the first step"
    return text + f": it pays for itself after {extra * 1000 / (b - a):,.0f} steps ({extra:.0f} s / {b - a:.1f} ms)"
