"""Bottleneck verdict per trial: what bounds it, in one line, from its measured figures; then, across
the sweep, the next steps that another trial already measured worse are replaced by that evidence.

The rules for one trial, in the order they are tried (the first that matches wins). Each suggestion
is a `Move`: the knob it changes and which way (↑ a larger value, *on*, or a value such as
`bf16-mixed`); a move no knob measures (cheaper decode) has none.

| verdict | when | moves |
|---|---|---|
| input-bound | data wait >= 20% of the measured window (and, on a GPU, utilisation < 80%) | `num_dataloader_workers` ↑, `pin_memory` on (GPU), cheaper decode/augment or decode on the GPU |
| communication-bound | two ranks or more, and >= 25% of the measured window waiting, after backward, for the gradient all-reduce (`time/allreduce_wait_pct`: what backward did not hide) | `num_workers` ↓, `batch_size` ↑ (per rank: fewer all-reduces per sample), `grad_accum_steps` ↑ |
| compute-bound (GPU) | SM activity (GPM, Hopper+) >= 80%, or where GPM is missing NVML utilisation >= 90% | `precision` `bf16-mixed`/`tf32` (Tensor Cores), `compile` on |
| memory headroom | GPU and less than half of the device's memory reserved at peak | `batch_size` ↑ |
| underutilised (GPU) | below the compute-bound bar and data wait < 20% | `batch_size` ↑, `compile` on (fewer launches) |
| compute-bound (CPU) | no GPU; the rank's cores are >= 80% busy: its training process, plus its loader workers when they share its cores (`cpus_per_loader_worker: 0`) | `precision` `32` where the trial's bf16/fp16 looks emulated (below), `bf16-mixed` where bf16 looks native, `compile` on, `cpus_per_worker` ↑ |
| underutilised (CPU) | no GPU; the rank keeps less than 80% of even one core busy: it idles in the gradient all-reduce (waiting for a slower rank) or for a core another process holds | `batch_size` ↑; `precision` `32` where its precision looks emulated |
| unclear | none of the above (or the figures are missing) | on a CPU, `precision` `32` where its precision looks emulated |

Emulated or native, on a CPU: the machine's measured figures say it where known (`sweeps.results.sol.emulated`:
that precision's matmul peak under a quarter of fp32's, copied onto each trial by `sweeps.results.sol.score`),
else the CPU's ISA flags (avx512_bf16/amx_bf16, avx512_fp16/amx_fp16). That is only a reason to try
`precision 32`; the verdict says the precision *is emulated* once a twin at precision 32 measured it
faster (below). On a GPU no precision is called emulated.

A suggestion never names what the trial already uses (bf16-mixed to a bf16-mixed trial, `compile`
to a compiled one, `pin_memory` to a pinned one, a GPU-only knob on a CPU). Where the loop
reports speed-of-light figures, the verdict quotes them: `perf/sol_pct` (achieved FLOP/s over the
measured peak for the trial's precision), `perf/input_sol_pct` (samples/s over what its loader
workers can decode), `perf/h2d_bw_pct` (host-to-device copy bandwidth over the measured peak).

"GPU busy" is the best signal the GPU gives: GPM SM activity (the share of SMs with work) where it
exists, else NVML utilisation, which only says that *some* kernel ran in each sample period (a
single tiny kernel reads as 100%). The all-reduce wait is measured by the DDP comm hook
(`trainables.noise_scale.CommTimer`); a rank waiting there for a slower peer counts too.

**Scaling.** A trial with a twin on fewer ranks (`sweeps.results.quality.scaling_twin`) says its scaling
efficiency against it, right after its facts: "scaling efficiency 62% of linear against 1 rank
(trial 3: 900/s vs 1,120/s at 2 ranks)".

**Across the sweep** (`revise`, once all trials have ended). One trial's figures cannot tell
whether its move pays off; the sweep may have measured it. A move is dropped when a *twin* of the
trial ran it and did worse: a trial that differs in the move's knob in the move's direction (a
larger `batch_size` for ↑, `compile` on, the named precision) and equals this one in every other
logged param, numbers compared as numbers (`128` = `"128"`), a param only one of them logged
counting as a difference. Params that do not change a step's speed are not compared (the knobs
declared so in `trainables.knobs`, `lr_effective`, `seed`), nor those that follow
from a compared knob (`global_batch_size`, `cpus_reserved`). Worse means: measured (`ok` or
`infeasible`) and worse on the objective's primary metric in its mode, out of memory (`oom`), or
degraded (its quality worse than the fp32 reference's, `sweeps.results.quality`) where this trial is not.
A twin that measured *better* keeps the move (this trial is then simply not the best), and so does
a tie or a twin without the metric. The dropped move becomes a citation of the nearest such twin,
with both figures and, on a speed objective, the twin's own verdict where it says why ("batch_size
512 (trial 8) was input-bound: 8,057/s vs 10,030/s; add loader workers first": an input-bound
twin turns the advice to its input fix first). Moves nobody measured stay as they were.

A move may carry a *claim* that a twin running it faster would prove: `precision 32` for a bf16/fp16 CPU
trial that looks emulated claims "bf16 is emulated on this CPU". The claim is said, right after the
trial's facts, when every measured twin that ran the move beat this trial's throughput beyond both
trials' noise (`noise_tie`), citing the slowest of them: "bf16 is emulated on this CPU: 60/s vs 451/s for
precision 32 (trial 2)". A twin inside the noise, slower, or none at all: no claim (the move stays).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sweeps.results.effects import Effects, worse
from sweeps.results.outcome import MEASURED, SweepOutcome, TrialRow
from sweeps.results.outcome import number as _number
from sweeps.results.outcome import same as _same
from sweeps.results.outcome import twins as _twins
from sweeps.results.quality import efficiency, scaling_twin, throughput, workers
from sweeps.results.sol import (  # against doctor figures
    H2D_BW_PCT,
    INPUT_SOL_PCT,
    SOL_PCT,
    emulated,
    held_to,
    of_fp32_pct,
)
from sweeps.spec import PARAMS_PREFIX
from trainables.contract import (
    ALLREDUCE_WAIT_PCT,
    CPU_LOADERS_PCT,
    CPU_WORKER_PCT,
    DATA_WAIT_PCT,
    GPU_UTIL_MEAN_PCT,
    MEM_HEADROOM_GIB,
    MEM_TOTAL_GIB,
    THROUGHPUT_UNITS,
    cv_key_of,
    throughput_key,
)

SM_ACTIVE_PCT = "gpu/sm_active_mean_pct"
INPUT_WAIT_PCT = 20.0
# "GPU busy" per signal: (compute-bound at or above, input-bound only below)
GPU_BUSY: dict[str, tuple[float, float]] = {SM_ACTIVE_PCT: (80.0, 70.0), GPU_UTIL_MEAN_PCT: (90.0, 80.0)}
_SIGNAL_NAME = {SM_ACTIVE_PCT: "SM active (GPM)", GPU_UTIL_MEAN_PCT: "GPU busy"}
MEMORY_USED_FRACTION = 0.5
CPU_BUSY_FRACTION = 0.8
NEAR_PEAK_PCT = 60.0  # at or above: a speed-of-light figure leaves little to gain from that knob
SATURATED_PCT = 80.0  # loader workers at or above this share of their decode capacity are the limit
_NATIVE_CPU_ISA = {"bf16-mixed": ("amx_bf16", "avx512_bf16"), "16-mixed": ("amx_fp16", "avx512_fp16")}
_PEAK_NAME = {"32": "fp32", "tf32": "tf32", "16-mixed": "fp16", "bf16-mixed": "bf16"}  # whose peak a trial is held to
UP, DOWN, ON = "up", "down", "on"  # Move.toward for a larger or smaller value, a switch turned on; else the value itself
ALLREDUCE_BOUND_PCT = 25.0  # at or above this share of the window waiting for the all-reduce: communication-bound


@dataclass(frozen=True)
class Move:
    """One suggested next step: its words, and the knob and direction a sweep's trials can measure it by
    (`toward` is UP, ON or the value the knob is set to); no knob: no trial can measure it."""

    text: str
    knob: str = ""
    toward: str = ""
    claim: str = ""  # what a twin that ran this move faster proves (`revise` says it then, with the figures)


@dataclass(frozen=True)
class Verdict:
    """What bounds a trial (`name`), the figures that say so, the moves to try and, once the sweep has
    been read, the moves it measured worse, each as the evidence (`measured`)."""

    name: str
    facts: str
    moves: tuple[Move, ...] = ()
    measured: tuple[str, ...] = ()
    confirmed: tuple[str, ...] = ()  # the moves' claims a faster twin proved, with its figures
    scaling: str = ""  # the scaling efficiency against the twin on the fewest ranks, once the sweep is read

    @property
    def reason(self) -> str:
        return (self.facts + "".join(f"; {c}" for c in self.confirmed) + (f"; {self.scaling}" if self.scaling else "")
                + _try(self.moves)
                + "".join(f"; {m}" for m in self.measured))

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


def _text(value: Any) -> str:
    return str(value).strip().lower()


def _on(params: dict[str, Any], knob: str) -> bool:
    return _text(params.get(knob, False)) in ("true", "1")


def _pct(metrics: dict[str, Any], key: str) -> float | None:
    v = metrics.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _try(moves: tuple[Move, ...]) -> str:
    return f"; try {' or '.join(m.text for m in moves)}" if moves else ""


_FASTER = {"32": ["bf16-mixed", "tf32"], "tf32": ["bf16-mixed"]}  # on a GPU; the mixed precisions are the fastest


def _native_on_cpu(metrics: dict[str, Any], precision: str) -> tuple[bool, str] | None:
    """Whether `precision` (bf16-mixed, 16-mixed) runs natively on the trial's CPU, and why that is said:
    the machine's measured figures where known, else its ISA flags; None when neither is known."""
    isa, label = _text(metrics.get("device/cpu_isa", "")).split(), _PEAK_NAME[precision]
    has = next((f for f in _NATIVE_CPU_ISA[precision] if f in isa), None)
    pct = of_fp32_pct(metrics, precision)
    if pct is not None and emulated(metrics, precision):
        return False, f"its {label} matmul measured at {pct:.2g}% of fp32's here"
    if pct is not None:
        return True, f"this CPU has {has}" if has else f"its {label} matmul measured native here"
    if not isa or isa[0].startswith("none-of:"):  # no flag the loop knows: an ARM CPU may well have bf16
        return None
    return (True, f"this CPU has {has}") if has else (False, f"no {'/'.join(reversed(_NATIVE_CPU_ISA[precision]))} in this CPU")


def _emulated_move(metrics: dict[str, Any], params: dict[str, Any]) -> Move | None:
    """`precision 32` for a CPU trial whose bf16/fp16 looks emulated, claiming it is (said once proved)."""
    precision = _text(params.get("precision", ""))
    if precision not in _NATIVE_CPU_ISA or _on(params, "use_gpu") or _text(metrics.get("device/type", "cpu")) != "cpu":
        return None
    native = _native_on_cpu(metrics, precision)
    if native is None or native[0]:
        return None
    return Move(f"precision 32 ({native[1]})", "precision", "32", claim=f"{_PEAK_NAME[precision]} is emulated on this CPU")


def _precision_moves(params: dict[str, Any], gpu: bool, metrics: dict[str, Any]) -> list[Move]:
    """Faster precisions than the trial's own (on a CPU, bf16-mixed only where bf16 looks native there)."""
    now = _text(params.get("precision", ""))
    if gpu:
        return [Move(p, "precision", p) for p in _FASTER.get(now, [])]
    native = _native_on_cpu(metrics, "bf16-mixed")
    return [Move(f"bf16-mixed ({native[1]})", "precision", "bf16-mixed")] if native and native[0] and now != "bf16-mixed" else []


def _more_workers(n: int | None) -> Move:
    return Move(f"more num_dataloader_workers (now {n})" if n is not None else "more num_dataloader_workers",
                "num_dataloader_workers", UP)


def _larger_batch(params: dict[str, Any], why: str = "") -> Move:
    batch = params.get("batch_size")
    return Move((f"a batch_size above {batch}" if batch is not None else "a larger batch_size") + why, "batch_size", UP)


COMPILE = Move("compile", "compile", ON)


def _input_bound(metrics: dict[str, Any], params: dict[str, Any], wait: float, said: str, gpu: bool) -> Verdict:
    workers = params.get("num_dataloader_workers")
    n = int(workers) if workers is not None and _text(workers).isdigit() else None
    loaders = "loader workers" if n is None else f"{n} loader worker{'s' if n != 1 else ''}"
    facts = [f"{wait:.0f}% of step time waiting for data"] + ([said] if said else [])
    sol, h2d = _pct(metrics, INPUT_SOL_PCT), _pct(metrics, H2D_BW_PCT)
    moves: list[Move] = []
    if sol is not None:
        facts.append(f"input pipeline at {sol:.0f}% of what {loaders} can decode")
        if sol >= SATURATED_PCT:
            moves += [_more_workers(n), Move("decode on the GPU" if gpu else "cheaper decode/augment")]
        else:
            moves.append(Move("cheaper collate/transfer (decode is not the limit)"))
    else:
        moves += [_more_workers(n), Move("cheaper decode/augment")]
    if h2d is not None:
        facts.append(f"host-to-device copies at {h2d:.0f}% of the measured bandwidth")
    if gpu and not _on(params, "pin_memory"):
        moves.append(Move("pin_memory", "pin_memory", ON))
    return Verdict("input-bound", ", ".join(facts), tuple(moves))


def _gpu_verdict(metrics: dict[str, Any], params: dict[str, Any], util: float, said: str, busy_at: float,
                 wait: float | None) -> Verdict:
    sol = _pct(metrics, SOL_PCT)
    precision = _PEAK_NAME.get(_text(params.get("precision", "")), "its precision's")
    compiles = [] if _on(params, "compile") else [COMPILE]
    if sol is not None and sol >= NEAR_PEAK_PCT:
        return Verdict("compute-bound", f"{said}, compute at {sol:.0f}% of this machine's measured {precision} peak: "
                       "little left to gain from batch size", tuple(_precision_moves(params, True, metrics)))
    at_peak = f", compute at {sol:.0f}% of this machine's measured {precision} peak" if sol is not None else ""
    if util >= busy_at:
        return Verdict("compute-bound", f"{said}{at_peak}", tuple(_precision_moves(params, True, metrics) + compiles))
    headroom, total = metrics.get(MEM_HEADROOM_GIB), metrics.get(MEM_TOTAL_GIB)
    if headroom is not None and total and (total - headroom) / total < MEMORY_USED_FRACTION:
        return Verdict("memory-headroom", f"{said}{at_peak} with only {total - headroom:.1f} of {total:.0f} GiB reserved",
                       (_larger_batch(params),))
    return Verdict("underutilised", f"{said}{at_peak} and data wait {wait or 0:.0f}%",
                   (_larger_batch(params), *([Move("compile (fewer kernel launches)", "compile", ON)] if compiles else [])))


def _cpu_verdict(metrics: dict[str, Any], params: dict[str, Any], wait: float | None) -> Verdict | None:
    cpu = _pct(metrics, CPU_WORKER_PCT)
    if cpu is None:
        return None
    cores = float(params.get("cpus_per_worker") or 1)
    loaders = _pct(metrics, CPU_LOADERS_PCT) or 0.0
    shared = float(params.get("cpus_per_loader_worker") or 0) == 0  # loader workers run on the rank's cores
    busy = cpu + (loaders if shared else 0.0)
    how = f"training process {cpu:.0f}%" + (f" + loader workers {loaders:.0f}%" if shared and loaders >= 1 else "")
    sol, precision = _pct(metrics, SOL_PCT), _text(params.get("precision", ""))
    named = _PEAK_NAME.get(held_to(metrics, precision), "its precision's")  # fp32's for an emulated precision
    peak = f", compute at {sol:.0f}% of this machine's measured {named} peak" if sol is not None else ""
    emulation = [m for m in [_emulated_move(metrics, params)] if m]
    if busy >= CPU_BUSY_FRACTION * 100 * cores:
        moves = emulation + _precision_moves(params, False, metrics) + ([] if _on(params, "compile") else [COMPILE])
        moves.append(Move("more cpus_per_worker (or a GPU)", "cpus_per_worker", UP))
        return Verdict("compute-bound", f"the rank's core(s) are saturated: {how} of {cores:.0f} core(s) busy{peak}, "
                       f"data wait {wait or 0:.0f}%", tuple(moves))
    if busy < CPU_BUSY_FRACTION * 100:  # not even one core kept busy: the rank waits on something else
        ranks = _number(params.get("num_workers"))
        alone = ranks is not None and ranks < 2  # one rank: no all-reduce to wait in
        moves = [_larger_batch(params, "" if alone else " (fewer all-reduces per sample)"), *emulation]
        waits = ("for a core another process holds" if alone else
                 "for the other ranks in the gradient all-reduce or for a core another process holds")
        return Verdict("underutilised", f"only {how} of {cores:.0f} core(s) busy{peak}, data wait "
                       f"{wait or 0:.0f}%: the rest of each step the rank sits idle, waiting {waits}", tuple(moves))
    return None


def _communication_bound(metrics: dict[str, Any], params: dict[str, Any]) -> Verdict | None:
    """Two ranks or more, waiting a large share of the window for the gradient all-reduce after backward."""
    wait, ranks = _pct(metrics, ALLREDUCE_WAIT_PCT), _number(params.get("num_workers"))
    if wait is None or wait < ALLREDUCE_BOUND_PCT or ranks is None or ranks < 2:
        return None
    accum = params.get("grad_accum_steps", 1)
    moves = (Move(f"fewer ranks (num_workers below {ranks:g})", "num_workers", DOWN),
             _larger_batch(params, " per rank (fewer all-reduces per sample)"),
             Move(f"grad_accum_steps above {accum} (one all-reduce per that many micro-batches)", "grad_accum_steps", UP))
    return Verdict("communication-bound", f"at {ranks:g} ranks {wait:.0f}% of the step waiting for the gradient "
                   "all-reduce that backward did not hide", moves)


def verdict(metrics: dict[str, Any], params: dict[str, Any]) -> Verdict:
    """What bounds a finished trial, and what to try that it does not already use."""
    wait = _pct(metrics, DATA_WAIT_PCT)
    signal = next((k for k in GPU_BUSY if metrics.get(k) is not None), None)  # the best the GPU gives
    util = _pct(metrics, signal) if signal else None
    busy_at, input_below = GPU_BUSY[signal] if signal else (0.0, 0.0)
    said = f"{_SIGNAL_NAME[signal]} {util:.0f}%" if signal and util is not None else ""
    gpu = util is not None or _on(params, "use_gpu")
    if wait is not None and wait >= INPUT_WAIT_PCT and (util is None or util < input_below):
        return _input_bound(metrics, params, wait, said, gpu)
    comm = _communication_bound(metrics, params)
    if comm is not None:
        return comm
    if util is not None:
        return _gpu_verdict(metrics, params, util, said, busy_at, wait)
    cpu = _cpu_verdict(metrics, params, wait)
    if cpu is not None:
        return cpu
    shown = ", ".join(f"{k}={metrics[k]:.0f}" for k in (DATA_WAIT_PCT, CPU_WORKER_PCT, CPU_LOADERS_PCT)
                      if _pct(metrics, k) is not None)
    emulation = None if gpu else _emulated_move(metrics, params)
    return Verdict("unclear", f"no single bottleneck stands out ({shown or 'no figures'})", (emulation,) if emulation else ())


_EVIDENCE = (*MEASURED, "oom")
_SAYS_WHY = ("input-bound", "compute-bound")  # a twin's verdict that explains why it was slower
_SPEED_METRICS = ("throughput/", "time/", "perf/", "predict/time")  # objectives a bottleneck explains
MAX_TAG_LEN = 5000


def noise_tie(a: TrialRow, b: TrialRow, metric: str) -> tuple[float, float, float] | None:
    """(gap %, cv of a, cv of b) when the two trials' `metric` differ by less than the larger of their
    sub-window spreads (the gap relative to the lower value): a tie, not a finding. None when they
    are apart, or a figure is missing (never a guessed spread)."""
    key = cv_key_of(metric)
    va, vb = _number(a.metrics.get(metric)), _number(b.metrics.get(metric))
    cv_a, cv_b = (_number(a.metrics.get(key)), _number(b.metrics.get(key))) if key else (None, None)
    if va is None or vb is None or cv_a is None or cv_b is None or min(abs(va), abs(vb)) <= 0:
        return None
    gap = abs(va - vb) / min(abs(va), abs(vb)) * 100
    return (gap, cv_a, cv_b) if gap < max(cv_a, cv_b) else None


def _toward(move: Move, here: Any, there: Any) -> bool:
    """Whether a trial with `there` for the move's knob ran the move from `here`."""
    if move.toward in (UP, DOWN):
        a, b = _number(here), _number(there)
        return a is not None and b is not None and (b > a if move.toward == UP else b < a)
    if move.toward == ON:
        return _text(there) in ("true", "1") and _text(here) not in ("true", "1")
    return _same(there, move.toward) and not _same(here, move.toward)


def _score(t: TrialRow, metric: str, mode: str) -> float | None:
    """The trial's objective value, signed so that higher is better; None when it was not measured."""
    v = _number(t.metrics.get(metric)) if t.status in MEASURED else None
    return None if v is None or v != v else (v if mode == "max" else -v)


def _evidence(t: TrialRow, move: Move, rows: list[TrialRow], metric: str, mode: str) -> TrialRow | None:
    """The nearest twin that ran `move` and did worse than `t`; None when none did, or when one did better."""
    here, mine = t.params.get(move.knob), _score(t, metric, mode)
    worse = []
    for e in rows:
        if (e is t or e.status not in _EVIDENCE or not _toward(move, here, e.params.get(move.knob))
                or not _twins(t, e, move.knob)):
            continue
        theirs = _score(e, metric, mode)
        if e.degraded and not t.degraded:  # faster or not, its result is worse than the fp32 reference's
            worse.append(e)
            continue
        if e.status != "oom" and (mine is None or theirs is None or theirs == mine or noise_tie(t, e, metric)):
            continue  # nothing to compare, or a difference inside both trials' noise: neither for the move nor against it
        if theirs is not None and mine is not None and theirs > mine:
            return None
        worse.append(e)

    def nearest(e: TrialRow) -> tuple[float, bool, float]:
        step = abs((_number(e.params.get(move.knob)) or 0.0) - (_number(here) or 0.0)) \
            if move.toward in (UP, DOWN) else 0.0
        return step, e.status == "oom" or bool(e.degraded), -(_score(e, metric, mode) or 0.0)

    return min(worse, key=nearest, default=None)


def _figure(metric: str, v: float) -> str:
    n = f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return f"{n}/s" if metric.startswith("throughput/") else n


def _setting(knob: str, value: Any) -> str:
    if _text(value) in ("true", "false"):
        return f"{knob} {'on' if _text(value) == 'true' else 'off'}"
    n = _number(value)
    return f"{knob} {int(n) if n is not None and n.is_integer() else value}"


def _cite(t: TrialRow, move: Move, e: TrialRow, metric: str, verdicts: dict[str, Verdict]) -> str:
    """The evidence that replaces a move: which twin ran it, how it did, and what to fix first."""
    ran = f"{_setting(move.knob, e.params.get(move.knob))} (trial {e.number})"
    if e.status == "oom":
        return f"{ran} ran out of memory"
    if e.degraded and not t.degraded:
        return f"{ran} was degraded: {e.degraded}"
    speed = metric.startswith(_SPEED_METRICS)
    theirs = verdicts[e.trial_id] if e.trial_id in verdicts else None
    why = f"was {theirs.name}" if speed and theirs and theirs.name in _SAYS_WHY else (
        "measured slower" if speed else "measured worse")
    a, b = _figure(metric, float(e.metrics[metric])), _figure(metric, float(t.metrics[metric]))
    text = f"{ran} {why}: {a} vs {b}" if metric.startswith("throughput/") else f"{ran} {why}: {metric} {a} vs {b}"
    if speed and theirs and theirs.name == "input-bound":  # its input fix comes before the move
        fix = theirs.moves[0] if theirs.moves else None
        text += ("; add loader workers first" if fix and fix.knob == "num_dataloader_workers"
                 else f"; {fix.text} first" if fix else "; fix its input first")
    return text


def _confirm(t: TrialRow, move: Move, rows: list[TrialRow]) -> str | None:
    """The move's claim with its proof: every measured twin that ran the move had a higher throughput than
    `t`, beyond both trials' noise; the slowest of them is cited. None without such a twin, or when one
    ran it no faster (or only within noise)."""
    key = next((throughput_key(u) for u in THROUGHPUT_UNITS if _number(t.metrics.get(throughput_key(u))) is not None), None)
    if key is None:
        return None
    mine, here = float(t.metrics[key]), t.params.get(move.knob)
    ran = [e for e in rows if e is not t and e.status in MEASURED and _number(e.metrics.get(key)) is not None
           and _toward(move, here, e.params.get(move.knob)) and _twins(t, e, move.knob)]
    if not ran or any(float(e.metrics[key]) <= mine or noise_tie(t, e, key) for e in ran):
        return None
    e = min(ran, key=lambda r: float(r.metrics[key]))
    theirs = f"{_figure(key, float(e.metrics[key]))} for {_setting(move.knob, e.params.get(move.knob))} (trial {e.number})"
    return f"{move.claim}: {_figure(key, mine)} vs {theirs}"


def revise(rows: list[TrialRow], metric: str, mode: str, effects: Effects | None = None) -> dict[str, Verdict]:
    """Each measured trial's verdict (by trial_id) with the moves a twin measured worse replaced by that
    evidence, then those the sweep's measured `effects` (`sweeps.results.effects`) say are clearly worse replaced by
    the effect, and the claims of the moves a twin measured faster said; `metric` and `mode` ("max"/"min")
    are the objective's primary ones."""
    first = {t.trial_id: verdict(t.metrics, t.params) for t in rows if t.status in MEASURED}
    by_id = {t.trial_id: t for t in rows}
    refuted: dict[str, list[tuple[Move, TrialRow]]] = {}
    by_effect: dict[str, list[tuple[Move, str]]] = {}
    for t in rows:
        if t.trial_id in first:
            found = [(m, _evidence(t, m, rows, metric, mode)) for m in first[t.trial_id].moves if m.knob]
            refuted[t.trial_id] = [(m, e) for m, e in found if e is not None]
            twins = {m for m, _ in refuted[t.trial_id]}
            said = [(m, _effect_against(t, m, effects, mode)) for m in first[t.trial_id].moves if m.knob and m not in twins]
            by_effect[t.trial_id] = [(m, why) for m, why in said if why]
    dropped = {tid: {m for m, _ in refuted[tid]} | {m for m, _ in by_effect[tid]} for tid in first}
    kept = {tid: dataclasses.replace(v, moves=tuple(m for m in v.moves if m not in dropped[tid]),
                                     confirmed=tuple(c for m in v.moves if m.claim and (c := _confirm(by_id[tid], m, rows))))
            for tid, v in first.items()}
    return {tid: dataclasses.replace(v, measured=tuple(_cite(by_id[tid], m, e, metric, kept) for m, e in refuted[tid])
                                     + tuple(why for _, why in by_effect[tid]), scaling=scaling_note(by_id[tid], rows))
            for tid, v in kept.items()}


def _effect_against(t: TrialRow, move: Move, effects: Effects | None, mode: str) -> str:
    """The sweep's measured effect of `move` from `t`, where it is clearly worse: the move's citation
    instead ("precision bf16-mixed measured 0.47x of 32 across the sweep ..."); "" otherwise."""
    if effects is None:
        return ""
    here = t.params.get(move.knob)
    there: Any = move.toward
    if move.toward == ON:
        there = "True"
    elif move.toward in (UP, DOWN):
        there = effects.neighbour(move.knob, here, up=move.toward == UP)
    effect = effects.between(move.knob, here, there) if there is not None else None
    if effect is None or not worse(effect, mode):
        return ""
    return (f"{_setting(move.knob, there)} measured {effect.ratio:.2f}x of {_setting(move.knob, here)} across the "
            f"sweep (95% {effect.low:.2f}-{effect.high:.2f}x, fitted over {effect.n_value} + {effect.n_reference} "
            "trials at the two settings)")


def scaling_note(t: TrialRow, rows: list[TrialRow]) -> str:
    """The trial's scaling efficiency against its twin on the fewest ranks, with both figures; empty without one."""
    twin = scaling_twin(t, rows)
    if twin is None:
        return ""
    (key, mine), (_, theirs) = throughput(t), throughput(twin)  # type: ignore[misc]
    n, m = workers(t), workers(twin)
    return (f"scaling efficiency {efficiency(t, twin):.0f}% of linear against {m} rank{'s' if m != 1 else ''} "
            f"(trial {twin.number}: {_figure(key, theirs)} vs {_figure(key, mine)} at {n})")


def sweep_effects(outcome: SweepOutcome) -> Effects | None:
    """The searched knobs' effects on the objective across the sweep's measured trials (`sweeps.results.effects`),
    by the names the trials logged them under (`params.<name>` as `workload.<name>`)."""
    knobs = [f"workload.{k.removeprefix(PARAMS_PREFIX)}" if k.startswith(PARAMS_PREFIX) else k
             for k in outcome.spec.space.searched()]
    return Effects.fit(outcome.trials, knobs, outcome.spec.objective.primary)


def revise_verdicts(outcome: SweepOutcome) -> dict[str, dict[str, str]]:
    """Revise every finished trial's verdict against the whole sweep, in place (`row.verdict`), and return
    the tags to log again on the child runs whose verdict changed (run_id -> tags).

    Only a verdict that is still this module's verdict for its trial's figures is revised: its
    text is the one-trial verdict, or a revision of it (a resumed sweep revises again with its new
    trials). A verdict logged by other rules (an older version) is left as it was logged."""
    obj = outcome.spec.objective
    revised = revise(outcome.trials, obj.primary, obj.primary_mode, sweep_effects(outcome))
    updates: dict[str, dict[str, str]] = {}
    for row in outcome.trials:
        v = revised.get(row.trial_id)
        if v is None or not row.verdict:
            continue
        head = f"{v.name}: {v.facts}"
        if (row.verdict == head or row.verdict.startswith(head + "; ")) and row.verdict != str(v):
            row.verdict = str(v)
            if row.run_id:
                updates[row.run_id] = {"sweep.verdict_reason": v.reason[:MAX_TAG_LEN]}
    return updates
