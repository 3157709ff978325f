"""Probe the memory frontier before the search: the largest batch size that fits, per memory setting.

The frontier is measured for every combination of the settings that decide memory. Those settings are
`live_state.oom_key`'s: the knobs declared `memory` (`trainables.knobs.MEMORY_KNOBS`) and the trainable's own
params in the space. The probe measures each combination the space can produce (every choice of a categorical
or fixed one; the first value of a range, which has too many; every accelerator type and worker count, each on
a warm group of that shape: per-rank memory changes little with the ranks, but that is measured, not assumed),
every other searched knob at its first value: the others do not decide a step's memory on the device
(grad_accum_steps: a micro-batch's activations are the same whether its gradients accumulate; the loader
knobs: host memory; lr, clipping: a probe always clips).

Per combination, a binary search over the space's batch sizes, each candidate a few steps on the
real (warm) workers, as `TrialConfig.as_probe` sets them (each setting declared with a `probe` value):
every rank learns each step whether any rank ran out of memory and all raise together, so no rank waits
forever for one that gave up, and the group stays warm. Candidates tried per combination: at most
ceil(log2(n + 1)) for n batch sizes.

What it learns bounds the search (`search.record_probe`, `search.oom_excluded`): a batch that did
not fit, and every larger one, is never run with that combination (such proposals are told to
Optuna as infeasible); a combination the probe did not measure (another value of a range, or one
a failure other than OOM stopped) runs no batch at or above the smallest batch the probe saw fail
anywhere. Without the probe, only trials that ran out of memory bound the search.
"""

from __future__ import annotations

import itertools
import re
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

from sweeps.results.outcome import Probed, probed_tag
from sweeps.search.live_state import SearchState
from sweeps.search.trials import fixed_knobs, resolve_trial, worker_counts
from sweeps.service.failures import classify
from sweeps.service.trial import WarmFailure, warm_reports
from sweeps.spec import PARAMS_PREFIX, CategoricalParam, FixedParam, FloatParam, IntParam, Param, SweepSpec
from sweeps.spec.cost import accelerator_types
from sweeps.spec.space import GROUP_KEYS
from trainables.knobs import KNOBS, MEMORY_KNOBS


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
    cfg = resolve_trial(spec, knobs).as_probe()  # whether a step fits, not how fast
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


def memory_settings(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every combination of the memory settings (`live_state.oom_key`) the probe measures.

    That is every choice of a categorical, the value of a fixed one, a range's first value (a knob the space
    does not hold: its default), on every accelerator type and worker count of the space."""
    space = spec.space
    held = {k: space.param(k) for k in MEMORY_KNOBS if k not in GROUP_KEYS}
    knobs: dict[str, Param] = {k: p if p is not None else FixedParam(type="fixed", value=KNOBS[k][1])
                               for k, p in held.items()}
    knobs |= {PARAMS_PREFIX + name: p for name, p in space.params.items()}
    values = [list(p.choices) if isinstance(p, CategoricalParam) else [_first(p)] for p in knobs.values()]
    # the group's shape slowest (the type, then the worker count): the warm groups change shape once per type
    # and count; each type is probed on its own devices (its own memory)
    return [{**({"accelerator_type": kind} if kind else {}), "num_workers": n, **dict(zip(knobs, combo, strict=True))}
            for kind in accelerator_types(spec) for n in worker_counts(spec) for combo in itertools.product(*values)]


def _frontier(queue: Any, spec: SweepSpec, knobs: dict[str, Any], candidates: list[int]) -> tuple[int, int, list[str], str]:
    """Binary search for one combination: (index of the largest batch that fits or -1, index of the
    smallest that ran out of memory or len(candidates), what was tried, why it stopped early or "")."""
    lo, hi, tried = -1, len(candidates), []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        kind, reason = _try(queue, spec, {**knobs, "batch_size": candidates[mid]})
        tried.append(f"{candidates[mid]} {'fits' if kind == 'fits' else kind}")
        if kind == "fits":
            lo = mid
        elif kind == "oom":
            hi = mid
        else:  # unsupported precision, a bug: the search will meet it as a trial failure
            return lo, hi, tried, f"; stopped: {kind}: {reason}"
    return lo, hi, tried, ""


def _names(setting: dict[str, Any], searched: set[str]) -> tuple[str, str]:
    """How a probe line and its parent-run tag name one combination: `bf16-mixed, compile, params.hidden=512`
    and `bf16-mixed.compile.params.hidden.512`. Its memory knobs (`MEMORY_KNOBS`): those every space holds, then
    the others where searched; each by its value (`bf16-mixed`), a switch by its name where on (`compile`), a
    count with its noun (`2-workers`)."""
    parts = []
    for name in sorted(MEMORY_KNOBS, key=lambda k: not KNOBS[k][2].implicit):
        kind, _, declared = KNOBS[name]
        value = setting.get(name)
        if not declared.implicit and name not in searched:
            continue
        if kind is bool:
            parts += [name] if value else []
        else:
            parts.append(f"{value}-{name.removeprefix('num_')}" if kind is int else str(value))
    own = [(k, str(v)) for k, v in setting.items() if k.startswith(PARAMS_PREFIX) and k in searched]
    line = ", ".join(parts + [f"{k}={v}" for k, v in own])
    tag = ".".join(parts + [f"{k}.{v}" for k, v in own])
    return line, re.sub(r"[^\w.\-]", "_", tag)  # the characters MLflow allows in a tag's key


def probe_frontier(spec: SweepSpec, queue: Any, state: SearchState, echo: Callable[[str], None]) -> dict[str, str]:
    """Probe every combination of memory settings (`memory_settings`) and tell the search what it learnt.

    Returns the parent run's tags (`sweep.probe.<precision>[.compile][.params.<name>.<value>]`). It runs in
    the sweep's warm groups, which are priced whole (`sweeps.results.money.groups_usd`)."""
    space = spec.space
    searched = space.searched()
    others = {k: _first(p) for k, p in searched.items()  # each other searched knob at its first value
              if k != "batch_size" and k not in MEMORY_KNOBS and not k.startswith(PARAMS_PREFIX)}
    candidates = batch_candidates(space.held("batch_size"))
    tags: dict[str, str] = {}
    found_all: list[Probed] = []
    for setting in memory_settings(spec):
        knobs = {**fixed_knobs(spec), **others, **setting}
        lo, hi, tried, note = _frontier(queue, spec, knobs, candidates)
        failed = candidates[hi] if hi < len(candidates) else None
        state.record_probe(knobs, failed, measured=not note)
        name, tag = _names(setting, set(searched))
        fits = candidates[lo] if lo >= 0 else None
        found = (f"largest batch_size that fits {fits if fits is not None else 'none'}"
                 + (f", {failed} does not" if failed is not None else "")
                 + f" ({len(tried)} of {len(candidates)} candidates tried: {', '.join(tried)}){note}")
        echo(f"memory probe {name}: {found}")
        tags[f"sweep.probe.{tag}"] = found[:5000]
        if not note:  # its frontier measured: what the answer's memory-bound sentence may cite
            found_all.append(Probed(setting, fits, failed))
    kept = probed_tag(found_all)
    if found_all and not kept:
        echo(f"memory probe: its {len(found_all)} findings are longer than an MLflow tag holds; the answer's "
             "memory-bound sentence will not cite them (each is in its sweep.probe.* tag above)")
    return tags | kept
