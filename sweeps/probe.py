"""The memory frontier, probed before the search: each precision's largest batch size that fits.

A binary search over the space's batch sizes, each candidate a few steps on the real (warm)
workers with `TrialConfig.probe`: every rank learns each step whether any rank ran out of memory
and all raise together, so no rank waits forever for one that gave up, and the group stays warm.
The smallest batch that did not fit bounds the search (`search.record_oom`: larger batches are
told to Optuna as infeasible, never run). Candidates tried per precision: at most
ceil(log2(n + 1)) for n batch sizes.
"""

from __future__ import annotations

import dataclasses
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

from sweeps.failures import classify
from sweeps.search import record_oom
from sweeps.space import resolve_trial
from sweeps.spec import CategoricalParam, FixedParam, FloatParam, IntParam, Param, SweepSpec
from sweeps.trial import WarmFailure, warm_reports

_PROBE_STEPS = 2


def batch_candidates(p: Param) -> list[int]:
    """The batch sizes a search could propose, ascending (a log range: its powers of two and ends)."""
    if isinstance(p, FixedParam):
        return [int(p.value)]  # type: ignore[arg-type]
    if isinstance(p, CategoricalParam):
        return sorted({int(c) for c in p.choices})  # type: ignore[arg-type]
    assert isinstance(p, IntParam)
    if not p.log:
        return list(range(p.low, p.high + 1, p.step))
    powers = {2**k for k in range(p.high.bit_length() + 1) if p.low <= 2**k <= p.high}
    return sorted(powers | {p.low, p.high})


def _first(p: Param) -> Any:
    if isinstance(p, FixedParam):
        return p.value
    if isinstance(p, CategoricalParam):
        return p.choices[0]
    assert isinstance(p, (IntParam, FloatParam))
    return p.low


def _try(queue: Any, spec: SweepSpec, knobs: dict[str, Any]) -> tuple[str, str]:
    """Run one candidate on a warm group: ("fits", "") or (failure kind, reason)."""
    cfg = dataclasses.replace(resolve_trial(spec, knobs), num_steps=_PROBE_STEPS, num_warmup_steps=1, probe=True,
                              telemetry_period_s=0.0, report_interval_s=1e9, checkpoint_every_steps=0, num_items=0,
                              eval_every_steps=0, target_metric=None, target_max=None, target_min=None)
    trial_id = f"probe-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="probe-") as tmp:
        try:
            for _ in warm_reports(queue, trial_id, cfg, tmp, None):
                pass
        except WarmFailure as failure:
            return classify(failure)
        except RuntimeError as exc:  # the pool closed
            return "error", str(exc)
    return "fits", ""


def probe_frontier(spec: SweepSpec, queue: Any, token: str, echo: Callable[[str], None]) -> dict[str, str]:
    """Probe every precision of the space; returns the parent run's tags (`sweep.probe.<precision>`)."""
    space = spec.space
    others = {k: _first(p) for k, p in space.searched().items() if k not in ("batch_size", "precision")}
    precisions = [str(v) for v in (space.precision.choices if isinstance(space.precision, CategoricalParam)
                                   else [_first(space.precision)])]
    candidates = batch_candidates(space.batch_size)
    tags: dict[str, str] = {}
    for precision in precisions:
        lo, hi, tried = -1, len(candidates), []
        note = ""
        while hi - lo > 1:
            mid = (lo + hi) // 2
            kind, reason = _try(queue, spec, {**others, "precision": precision, "batch_size": candidates[mid]})
            tried.append(f"{candidates[mid]} {'fits' if kind == 'fits' else kind}")
            if kind == "fits":
                lo = mid
            elif kind == "oom":
                hi = mid
            else:  # unsupported precision, a bug: the search will meet it as a trial failure
                note = f"; stopped: {kind}: {reason}"
                break
        if hi < len(candidates) and not note:
            record_oom(token, {**space.fixed(), **others, "precision": precision, "batch_size": candidates[hi]})
        fits = candidates[lo] if lo >= 0 else None
        line = (f"memory probe {precision}: largest batch_size that fits " + (str(fits) if fits else "none")
                + (f", {candidates[hi]} does not" if hi < len(candidates) and not note else "")
                + f" ({len(tried)} of {len(candidates)} candidates tried: {', '.join(tried)}){note}")
        echo(line)
        tags[f"sweep.probe.{precision}"] = line.split(": ", 1)[1][:5000]
    return tags
