"""The sweep's figures in money, from the spec's prices (`sweeps.spec.cost`): what each trial and the
whole sweep cost, the planned cost before it starts, and the answer's sentence on the cheapest
configuration. Per-report figures (dollars per hour, per million items, to the target) come from the loop
itself (`trainables.contract.money_metrics`), so the search can rank by them; this module adds what needs
the sweep: wall times, the trials compared, the plan."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sweeps.results.outcome import SweepOutcome, TrialRow
from sweeps.spec import SweepSpec
from sweeps.spec.cost import accelerator_types, devices, priced_type, usd_per_hour
from trainables.contract import (
    PREDICT_TIME_TO_TARGET_S,
    PREDICT_USD_TO_TARGET,
    TRIAL_USD,
    USD_PER_HOUR,
    USD_TO_TARGET,
    throughput_key,
    usd_per_million_key,
)


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return default


def trial_rate(spec: SweepSpec, params: dict[str, Any]) -> float:
    """A trial's devices' price per hour from its logged params (0.0: unpriced)."""
    return usd_per_hour(spec, str(params.get("accelerator_type") or ""), _int(params.get("num_workers"), 1),
                        _int(params.get("num_dataloader_workers")))


def trial_usd(spec: SweepSpec, params: dict[str, Any], seconds: float) -> dict[str, float]:
    """What a trial cost over `seconds` of its own wall time (none when unpriced)."""
    rate = trial_rate(spec, params)
    return {TRIAL_USD: rate * seconds / 3600.0} if rate > 0 and seconds >= 0 else {}


def predicted_usd(metrics: dict[str, Any]) -> dict[str, float]:
    """Dollars to the target as the noise-scale model predicts its time (none without both figures)."""
    rate, seconds = metrics.get(USD_PER_HOUR), metrics.get(PREDICT_TIME_TO_TARGET_S)
    if isinstance(rate, (int, float)) and isinstance(seconds, (int, float)) and rate > 0 and seconds >= 0:
        return {PREDICT_USD_TO_TARGET: rate * seconds / 3600.0}
    return {}


def sweep_usd(outcome: SweepOutcome, starts: list[tuple[Any, float, str]], loaders: int,
              probe: list[tuple[tuple[int, str], float]] | None = None) -> float | None:
    """What the sweep cost: its trials' own costs, its warm groups' start-ups (each group's devices, holding
    `loaders` loader workers' share per rank, for the seconds it took to start) and the memory probe (each
    combination it probed on that combination's devices: (workers, type), seconds; the starts it waited for
    are in its seconds, so `starts` leaves them out); None when unpriced."""
    spec = outcome.spec
    if spec.cost is None:
        return None
    total = sum(float(t.metrics[TRIAL_USD]) for t in outcome.trials if isinstance(t.metrics.get(TRIAL_USD), (int, float)))
    for (size, kind), seconds in [(shape, s) for shape, s, _ in starts] + list(probe or []):
        total += usd_per_hour(spec, str(kind), int(size), loaders) * float(seconds) / 3600.0
    return total


def money_key(outcome: SweepOutcome) -> str | None:
    """The figure trials are compared on in money: dollars to the target where the objective is a time
    to target, else dollars per million items; None when no finished trial has it."""
    spec = outcome.spec
    unit = next((u for u in ("samples", "tokens") if any(throughput_key(u) in t.metrics for t in outcome.ranked())), None)
    key = USD_TO_TARGET if spec.objective.time_to_target else usd_per_million_key(unit) if unit else None
    return key if key and any(isinstance(t.metrics.get(key), (int, float)) for t in outcome.ranked()) else None


def on_what(spec: SweepSpec, t: TrialRow) -> str:
    """What a trial ran on, in words: `2 x H100`, or `4 cores of cpu-small`."""
    kind = priced_type(spec, str(t.params.get("accelerator_type") or "")) or "GPU"
    n = devices(spec, _int(t.params.get("num_workers"), 1), _int(t.params.get("num_dataloader_workers")))
    return f"{n:g} x {kind}" if spec.scaling.use_gpu else f"{n:g} core{'s' if n != 1 else ''} of {kind}"


def _usd(value: float) -> str:
    return f"${value:.2f}" if value >= 0.1 else f"${value:.3g}"


def money_sentence(outcome: SweepOutcome, configuration: Callable[[TrialRow], str]) -> str:
    """The answer in money: the cheapest finished trial, what it costs, and how much cheaper it is than the
    fastest; then what the sweep cost and whose prices said so. Empty when the sweep has no prices."""
    spec, key = outcome.spec, money_key(outcome)
    if spec.cost is None or key is None:
        return ""
    have = [t for t in outcome.ranked() if isinstance(t.metrics.get(key), (int, float))]
    cheapest = min(have, key=lambda t: (t.metrics[key], t.number))
    per = "to the target" if key == USD_TO_TARGET else f"per 1M {key.rsplit('_', 1)[-1]}"
    text = (f"**Cheapest: trial {cheapest.number}** ({configuration(cheapest)}) on {on_what(spec, cheapest)}: "
            f"**{_usd(cheapest.metrics[key])} {per}**")
    speed = next((k for k in (spec.objective.primary, throughput_key("samples"), throughput_key("tokens"))
                  if k.startswith("throughput/") and all(k in t.metrics for t in have)), None)
    if speed is not None:
        fastest = max(have, key=lambda t: (t.metrics[speed], -t.number))
        if fastest is not cheapest and cheapest.metrics[key] > 0:
            ratio = fastest.metrics[key] / cheapest.metrics[key]
            text += (f", {ratio:.1f}x cheaper than the fastest (trial {fastest.number} on {on_what(spec, fastest)}, "
                     f"{_usd(fastest.metrics[key])})")
        elif fastest is cheapest:
            text += ", and it is also the fastest"
    swept = outcome.sweep_usd
    if swept is not None:
        text += f". The sweep cost {_usd(swept)}"
    used = sorted({priced_type(spec, str(t.params.get('accelerator_type') or '')) or "" for t in outcome.trials} - {""})
    prices = "; ".join(f"{k} ${p.usd_per_hour:g}/{'GPU' if spec.scaling.use_gpu else 'core'}-hour, {p.date}, {p.source}"
                       for k in used if (p := spec.cost.price(k)) is not None)
    return text + (f" (prices: {prices})" if prices else "") + "."


def planned_usd(spec: SweepSpec, trials: int, boxed_s: float, shapes: tuple[list[int], int]) -> str:
    """The planned cost's words in money: what `trials` trials of at most `boxed_s` seconds of training each
    cost at the spec's prices (`shapes`: the space's worker counts and its most loader workers per rank; a
    range where the space searches what the price depends on); "" unpriced."""
    if spec.cost is None or not boxed_s:
        return ""
    counts, most_loaders = shapes
    rates = [usd_per_hour(spec, kind, n, k) for kind in accelerator_types(spec) for n in counts
             for k in sorted({0, most_loaders})]
    low, high = min(rates), max(rates)
    if not high:
        return ""
    hours = trials * boxed_s / 3600.0
    said = _usd(low * hours) if math.isclose(low, high) else f"{_usd(low * hours)}-{_usd(high * hours)}"
    return (f"; in money, their training alone: {said} at {trials} x {boxed_s:g} s x "
            f"{_usd(low) if math.isclose(low, high) else f'{_usd(low)}-{_usd(high)}'}/h (the spec's prices; "
            "start-ups and validation add what each trial measures)")
