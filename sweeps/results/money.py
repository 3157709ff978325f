"""The sweep's figures in money, from the spec's prices (`sweeps.spec.cost`).

What each trial and the whole sweep cost, the planned cost before it starts, and the answer's sentence on the
cheapest configuration. Per-report figures (dollars per hour, per million items, to the target) come from the
loop itself (`trainables.contract.money_metrics`), so the search can rank by them; this module adds what needs
the sweep: wall times, the trials compared, the plan."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from sweeps.results.outcome import SweepOutcome, TrialRow, speed_key
from sweeps.spec import SweepSpec
from sweeps.spec.cost import accelerator_types, devices, priced_type, usd_per_hour
from sweeps.spec.params import param_values
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


def groups_usd(spec: SweepSpec, lives: list[tuple[Any, float, bool]]) -> float:
    """Price what the warm groups held, from asking for them to their end, between their trials too.

    Each group's devices: its ranks, its type, the loader share every group is started with. The trials ran
    inside the groups, and so did the memory probe: this is all a sweep with warm groups held."""
    return sum(usd_per_hour(spec, str(kind), int(size), 0) * float(seconds) / 3600.0
               for (size, kind), seconds, _ in lives)


def sweep_total(earlier: list[float | None], this_run: float, this_run_whole: bool) -> tuple[float, str]:
    """Return what the sweep cost across its drivers, and why that is a lower bound.

    The drivers are a resumed sweep's earlier runs (`earlier`), then this one. The reason is "" when it is the
    whole cost: a driver killed outright never said what it held."""
    lost = sum(v is None for v in earlier)
    total = this_run + sum(v for v in earlier if v is not None)
    why = []
    if lost:
        why.append(f"{lost} earlier run(s) of the sweep ended without saying what they held (killed outright)")
    if not this_run_whole:
        why.append("a warm group had not ended when the sweep did")
    return total, "; ".join(why)


def money_key(outcome: SweepOutcome) -> str | None:
    """Return the figure trials are compared on in money, or None when no finished trial has it.

    That is dollars to the target where the objective is a time to target, else dollars per million items."""
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


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()<>#+!|~])")


def md_text(text: str) -> str:
    """Free text (a price's source) as literal markdown: no link, image or HTML of its own renders."""
    return _MARKDOWN.sub(r"\\\1", text)


def mispriced(spec: SweepSpec, t: TrialRow) -> str:
    """Say why a GPU trial's price may not be its device's; "" when they agree or either is unknown.

    The GPU it reported (`device/name`) is not the type it was priced as (an unpinned trial is priced as the one
    GPU type priced, wherever it ran)."""
    kind = priced_type(spec, str(t.params.get("accelerator_type") or ""))
    name = t.metrics.get("device/name")
    if not spec.scaling.use_gpu or not kind or not isinstance(name, str) or not name:
        return ""
    squash = lambda text: re.sub(r"[^0-9a-z]", "", text.lower())  # noqa: E731 - "H100" in "NVIDIA H100 80GB HBM3"
    return "" if squash(kind) in squash(name) else f"trial {t.number} ran on {name} but was priced as {kind}"


def money_sentence(outcome: SweepOutcome, configuration: Callable[[TrialRow], str], md: bool = True) -> str:
    """Write the answer in money; empty when the sweep has no prices.

    The cheapest finished trial that is not degraded, what it costs, and how much cheaper it is than the fastest;
    then what the sweep cost and whose prices said so. Markdown (the MLflow description), or plain text for a
    terminal (`md=False`)."""
    spec, key = outcome.spec, money_key(outcome)
    if spec.cost is None or key is None:
        return ""
    bold = (lambda x: f"**{x}**") if md else (lambda x: x)
    free = md_text if md else (lambda x: x)
    # a degraded trial (worse quality than the fp32 reference at equal data) is never named, as for "best"
    have = [t for t in outcome.ranked() if isinstance(t.metrics.get(key), (int, float)) and not t.degraded]
    if not have:
        return ""
    cheapest = min(have, key=lambda t: (t.metrics[key], t.number))
    per = "to the target" if key == USD_TO_TARGET else f"per 1M {key.rsplit('_', 1)[-1]}"
    text = (f"{bold(f'Cheapest: trial {cheapest.number}')} ({configuration(cheapest)}) on {on_what(spec, cheapest)}: "
            f"{bold(f'{_usd(cheapest.metrics[key])} {per}')}")
    speed = speed_key(spec, have)
    if speed is not None:
        fastest = max(have, key=lambda t: (t.metrics[speed], -t.number))
        if fastest is not cheapest and cheapest.metrics[key] > 0:
            ratio = fastest.metrics[key] / cheapest.metrics[key]
            than = f"trial {fastest.number} on {on_what(spec, fastest)}, {_usd(fastest.metrics[key])}"
            text += (f", {ratio:.1f}x cheaper than the fastest ({than})" if round(ratio, 1) > 1.0 else
                     f", as cheap as the fastest within 5% ({than})")
        elif fastest is cheapest:
            text += ", and it is also the fastest"
    swept = outcome.sweep_usd
    if swept is not None:
        short = outcome.sweep_usd_short
        text += f". The sweep cost {'at least ' if short else ''}{_usd(swept)}" + (f" ({short})" if short else "")
    used = sorted({priced_type(spec, str(t.params.get('accelerator_type') or '')) or "" for t in outcome.trials} - {""})
    prices = "; ".join(f"{k} ${p.usd_per_hour:g}/{'GPU' if spec.scaling.use_gpu else 'core'}-hour, {p.date}, "
                       f"{free(p.source)}" for k in used if (p := spec.cost.price(k)) is not None)
    text += (f" (prices: {prices})" if prices else "") + "."
    wrong = [w for t in outcome.trials if (w := mispriced(spec, t))]
    if wrong:
        text += f" Caution, {free('; '.join(wrong))}: pin the trials to a type (space.accelerator_type) or price it."
    return text


def planned_usd(spec: SweepSpec, trials: int, boxed_s: float, counts: list[int]) -> str:
    """Put the planned cost in money; "" unpriced.

    What `trials` trials of at most `boxed_s` seconds of training each cost at the spec's prices (`counts`: the
    space's worker counts; a range only where the space searches what a trial's price depends on: its type, its
    ranks, and without warm groups its loader workers)."""
    if spec.cost is None or not boxed_s:
        return ""
    loaders = sorted({int(v) for v in param_values(spec.space.held("num_dataloader_workers"))})
    rates = [usd_per_hour(spec, kind, n, k) for kind in accelerator_types(spec) for n in counts for k in loaders]
    low, high = min(rates), max(rates)
    if not high:
        return ""
    hours = trials * boxed_s / 3600.0
    said = _usd(low * hours) if math.isclose(low, high) else f"{_usd(low * hours)}-{_usd(high * hours)}"
    return (f"; in money, their training alone: {said} at {trials} x {boxed_s:g} s x "
            f"{_usd(low) if math.isclose(low, high) else f'{_usd(low)}-{_usd(high)}'}/h (the spec's prices; "
            "start-ups and validation add what each trial measures)")
