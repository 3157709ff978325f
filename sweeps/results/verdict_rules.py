"""What bounds one trial: the verdict rules, as data a reader can scan.

`RULES` is the table, tried in order, the first that holds wins. Each rule is its kind, the condition
(`when`, over the trial's `Figures`) and what it says: the facts that made it hold and the moves to
try (`advice`). A move names the knob it changes and which way (a larger value, *on*, or a value such
as `bf16-mixed`), so that the sweep can later measure it (`sweeps.results.verdict.revise`); a move no
knob measures (cheaper decode) has none. A move never names what the trial already uses.

| kind | when | advice |
|---|---|---|
| input-bound | data wait >= 20% of the measured window (and, on a GPU, busy below the input bar) | loader workers up, pinned memory (GPU), cheaper decode |
| communication-bound | 2+ ranks and >= 25% of the window waiting for the gradient all-reduce backward did not hide (a sharded strategy: the trace's exposed all-gathers and reduce-scatters) | fewer ranks, a larger batch per rank, more accumulation (sharded: fsdp_no_reshard, hsdp across nodes, a larger batch per rank) |
| compute-bound | GPU: achieved FLOP/s >= 60% of the measured peak | a faster precision |
| compute-bound | GPU: SM activity (GPM) >= 80%, or NVML utilisation >= 90% where GPM is missing | a faster precision, compile |
| memory-headroom | GPU: less than half the device's memory reserved at peak | a larger batch; checkpointing or CPU offload off |
| underutilised | GPU: none of the above | a larger batch, compile |
| compute-bound | CPU: the rank's cores >= 80% busy (its loader workers too when they share them) | fp32 where bf16/fp16 looks emulated, bf16 where native, compile, more cores |
| underutilised | CPU: less than 80% of even one core busy: the rank waits (on its peers, or for a core) | a larger batch, fp32 where emulated |
| unclear | none of the above, or the figures are missing | fp32 where the CPU's precision looks emulated |

"GPU busy" is the best signal the GPU gives: GPM SM activity (the share of SMs with work) where it
exists, else NVML utilisation, which only says that *some* kernel ran in each sample period. Emulated
or native on a CPU: the machine's measured figures say it where known (`sweeps.results.sol.emulated`),
else the CPU's ISA flags (avx512_bf16/amx_bf16, avx512_fp16/amx_fp16); that is only a reason to try
`precision 32`, proved once a twin ran it faster. Where the loop reports speed-of-light figures the
verdict quotes them: `perf/sol_pct`, `perf/input_sol_pct`, `perf/h2d_bw_pct`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sweeps.results.outcome import number as _number
from sweeps.results.sol import emulated, held_to, of_fp32_pct
from sweeps.spec.sections import GLOBAL_BATCH_FIXED
from trainables.contract import (
    ALLREDUCE_WAIT_PCT,
    CPU_LOADERS_PCT,
    CPU_WORKER_PCT,
    DATA_WAIT_PCT,
    GPU_SM_ACTIVE_PCT,
    GPU_UTIL_MEAN_PCT,
    H2D_BW_PCT,
    INPUT_SOL_PCT,
    MEM_HEADROOM_GIB,
    MEM_TOTAL_GIB,
    SOL_PCT,
    TRACE_COMPUTE_PCT,
    TRACE_DATA_WAIT_PCT,
    TRACE_EXPOSED_MAX_PCT,
    TRACE_EXPOSED_MAX_RANK,
    TRACE_EXPOSED_PCT,
    TRACE_IDLE_PCT,
    TRACE_STEP_MS,
    TRACE_STEPS,
)
from trainables.knobs import SHARDED

INPUT_WAIT_PCT = 20.0
# "GPU busy" per signal: (compute-bound at or above, input-bound only below)
GPU_BUSY: dict[str, tuple[float, float]] = {GPU_SM_ACTIVE_PCT: (80.0, 70.0), GPU_UTIL_MEAN_PCT: (90.0, 80.0)}
_SIGNAL_NAME = {GPU_SM_ACTIVE_PCT: "SM active (GPM)", GPU_UTIL_MEAN_PCT: "GPU busy"}
MEMORY_USED_FRACTION = 0.5
CPU_BUSY_FRACTION = 0.8
NEAR_PEAK_PCT = 60.0  # at or above: a speed-of-light figure leaves little to gain from that knob
SATURATED_PCT = 80.0  # loader workers at or above this share of their decode capacity are the limit
ALLREDUCE_BOUND_PCT = 25.0  # at or above this share of the window waiting for the all-reduce: communication-bound
_NATIVE_CPU_ISA = {"bf16-mixed": ("amx_bf16", "avx512_bf16"), "16-mixed": ("amx_fp16", "avx512_fp16")}
PEAK_NAME = {"32": "fp32", "tf32": "tf32", "16-mixed": "fp16", "bf16-mixed": "bf16"}  # whose peak a trial is held to
UP, DOWN, ON = "up", "down", "on"  # Move.toward for a larger or smaller value, a switch turned on; else the value itself
_FASTER = {"32": ["bf16-mixed", "tf32"], "tf32": ["bf16-mixed"]}  # on a GPU; the mixed precisions are the fastest


@dataclass(frozen=True)
class Move:
    """One suggested next step: its words, and the knob and direction a sweep's trials can measure it by.

    `toward` is UP, ON or the value the knob is set to; no knob: no trial can measure it."""

    text: str
    knob: str = ""
    toward: str = ""
    claim: str = ""  # what a twin that ran this move faster proves (`revise` says it then, with the figures)


def text(value: Any) -> str:
    return str(value).strip().lower()


def on(params: dict[str, Any], knob: str) -> bool:
    return text(params.get(knob, False)) in ("true", "1")


def pct(metrics: dict[str, Any], key: str) -> float | None:
    v = metrics.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Figures:
    """What the rules read of one trial: its metrics and params, and what follows from them once."""

    metrics: dict[str, Any]
    params: dict[str, Any]
    wait: float | None  # % of the window waiting for data
    signal: str | None  # the best "GPU busy" signal the trial has (SM active, else NVML utilisation)
    util: float | None  # its value

    @classmethod
    def of(cls, metrics: dict[str, Any], params: dict[str, Any]) -> Figures:
        signal = next((k for k in GPU_BUSY if metrics.get(k) is not None), None)
        return cls(metrics, params, pct(metrics, DATA_WAIT_PCT), signal, pct(metrics, signal) if signal else None)

    @property
    def gpu(self) -> bool:
        return self.util is not None or on(self.params, "use_gpu")

    @property
    def said(self) -> str:
        """The GPU signal in words ("SM active (GPM) 85%"), or ""."""
        return f"{_SIGNAL_NAME[self.signal]} {self.util:.0f}%" if self.signal and self.util is not None else ""

    @property
    def sol(self) -> float | None:
        return pct(self.metrics, SOL_PCT)

    @property
    def ranks(self) -> float | None:
        return _number(self.params.get("num_workers"))

    def cpu_busy(self) -> tuple[float, float, str] | None:
        """(cores busy in %, cores the rank has, how that splits) on a CPU; None without the figure."""
        cpu = pct(self.metrics, CPU_WORKER_PCT)
        if cpu is None:
            return None
        cores = float(self.params.get("cpus_per_worker") or 1)
        loaders = pct(self.metrics, CPU_LOADERS_PCT) or 0.0
        shared = float(self.params.get("cpus_per_loader_worker") or 0) == 0  # loader workers run on the rank's cores
        how = f"training process {cpu:.0f}%" + (f" + loader workers {loaders:.0f}%" if shared and loaders >= 1 else "")
        return cpu + (loaders if shared else 0.0), cores, how

    def cpu_peak(self) -> str:
        """", compute at 40% of this machine's measured fp32 peak" where the figure is known."""
        sol, precision = self.sol, text(self.params.get("precision", ""))
        named = PEAK_NAME.get(held_to(self.metrics, precision), "its precision's")  # fp32's for an emulated precision
        return f", compute at {sol:.0f}% of this machine's measured {named} peak" if sol is not None else ""

    def gpu_peak(self) -> str:
        named = PEAK_NAME.get(text(self.params.get("precision", "")), "its precision's")
        return f", compute at {self.sol:.0f}% of this machine's measured {named} peak" if self.sol is not None else ""


# -- the moves ---------------------------------------------------------------------------------


def native_on_cpu(metrics: dict[str, Any], precision: str) -> tuple[bool, str] | None:
    """Tell whether `precision` (bf16-mixed, 16-mixed) runs natively on the trial's CPU, and why that is said.

    The machine's measured figures where known, else its ISA flags; None when neither is known."""
    isa, label = text(metrics.get("device/cpu_isa", "")).split(), PEAK_NAME[precision]
    has = next((f for f in _NATIVE_CPU_ISA[precision] if f in isa), None)
    of_fp32 = of_fp32_pct(metrics, precision)
    if of_fp32 is not None and emulated(metrics, precision):
        return False, f"its {label} matmul measured at {of_fp32:.2g}% of fp32's here"
    if of_fp32 is not None:
        return True, f"this CPU has {has}" if has else f"its {label} matmul measured native here"
    if not isa or isa[0].startswith("none-of:"):  # no flag the loop knows: an ARM CPU may well have bf16
        return None
    return (True, f"this CPU has {has}") if has else (False, f"no {'/'.join(reversed(_NATIVE_CPU_ISA[precision]))} in this CPU")


def emulated_move(f: Figures) -> list[Move]:
    """`precision 32` for a CPU trial whose bf16/fp16 looks emulated, claiming it is (said once proved)."""
    precision = text(f.params.get("precision", ""))
    if precision not in _NATIVE_CPU_ISA or on(f.params, "use_gpu") or text(f.metrics.get("device/type", "cpu")) != "cpu":
        return []
    native = native_on_cpu(f.metrics, precision)
    if native is None or native[0]:
        return []
    return [Move(f"precision 32 ({native[1]})", "precision", "32", claim=f"{PEAK_NAME[precision]} is emulated on this CPU")]


def faster_precisions(f: Figures, gpu: bool) -> list[Move]:
    """Faster precisions than the trial's own (on a CPU, bf16-mixed only where bf16 looks native there)."""
    now = text(f.params.get("precision", ""))
    if gpu:
        return [Move(p, "precision", p) for p in _FASTER.get(now, [])]
    native = native_on_cpu(f.metrics, "bf16-mixed")
    return [Move(f"bf16-mixed ({native[1]})", "precision", "bf16-mixed")] if native and native[0] and now != "bf16-mixed" else []


def more_loader_workers(n: int | None) -> Move:
    return Move(f"more num_dataloader_workers (now {n})" if n is not None else "more num_dataloader_workers",
                "num_dataloader_workers", UP)


def larger_batch(params: dict[str, Any], why: str = "") -> Move:
    batch = params.get("batch_size")
    return Move((f"a batch_size above {batch}" if batch is not None else "a larger batch_size") + why, "batch_size", UP)


COMPILE = Move("compile", "compile", ON)


def compile_unless_on(f: Figures, words: str = "compile") -> list[Move]:
    return [] if on(f.params, "compile") else [Move(words, "compile", ON) if words != "compile" else COMPILE]


# -- the rules: (kind, when, advice) ---------------------------------------------------------------


def input_bound(f: Figures) -> bool:
    return f.wait is not None and f.wait >= INPUT_WAIT_PCT and (f.util is None or f.util < GPU_BUSY[f.signal or ""][1])


def input_advice(f: Figures) -> tuple[str, tuple[Move, ...]]:
    workers = f.params.get("num_dataloader_workers")
    n = int(workers) if workers is not None and text(workers).isdigit() else None
    loaders = "loader workers" if n is None else f"{n} loader worker{'s' if n != 1 else ''}"
    facts = [f"{f.wait:.0f}% of step time waiting for data"] + ([f.said] if f.said else [])
    decode, h2d = pct(f.metrics, INPUT_SOL_PCT), pct(f.metrics, H2D_BW_PCT)
    moves: list[Move] = []
    if decode is not None:
        facts.append(f"input pipeline at {decode:.0f}% of what {loaders} can decode")
        if decode >= SATURATED_PCT:
            moves += [more_loader_workers(n), Move("decode on the GPU" if f.gpu else "cheaper decode/augment")]
        else:
            moves.append(Move("cheaper collate/transfer (decode is not the limit)"))
    else:
        moves += [more_loader_workers(n), Move("cheaper decode/augment")]
    if h2d is not None:
        facts.append(f"host-to-device copies at {h2d:.0f}% of the measured bandwidth")
    if f.gpu and not on(f.params, "pin_memory"):
        moves.append(Move("pin_memory", "pin_memory", ON))
    return ", ".join(facts), tuple(moves)


def _sharded(f: Figures) -> bool:
    return text(f.params.get("strategy", "ddp")) in SHARDED


def comm_wait(f: Figures) -> float | None:
    """Return the share of the step waiting for communication that compute did not hide.

    That is DDP's all-reduce counter, or for a sharded strategy (no counter: FSDP2 has no DDP hook) the trace's
    exposed collectives, its all-gathers and reduce-scatters."""
    wait = pct(f.metrics, ALLREDUCE_WAIT_PCT)
    return pct(f.metrics, TRACE_EXPOSED_PCT) if wait is None and _sharded(f) else wait


def waits_in_allreduce(f: Figures) -> bool:
    wait = comm_wait(f)
    return wait is not None and wait >= ALLREDUCE_BOUND_PCT and f.ranks is not None and f.ranks >= 2


def sharded_comm_advice(f: Figures, wait: float) -> tuple[str, tuple[Move, ...]]:
    """Advise on FSDP2's exposed all-gathers and reduce-scatters.

    Keep the gathered blocks, gather inside a node, or give each gathered parameter more compute."""
    strategy, moves = text(f.params.get("strategy")), []
    if strategy in ("fsdp", "hsdp"):
        moves.append(Move("strategy fsdp_no_reshard (no all-gather again in backward; more memory)", "strategy",
                          "fsdp_no_reshard"))
    if strategy != "hsdp":
        moves.append(Move("strategy hsdp where the ranks span nodes (all-gathers inside a node)", "strategy", "hsdp"))
    moves.append(larger_batch(f.params, " per rank (more compute per gathered parameter)"))
    return (f"at {f.ranks:g} ranks {wait:.0f}% of the step in FSDP2's all-gathers and reduce-scatters that compute "
            "did not hide (the trace)"), tuple(moves)


def allreduce_advice(f: Figures) -> tuple[str, tuple[Move, ...]]:
    wait, ranks, accum = comm_wait(f), f.ranks, f.params.get("grad_accum_steps", 1)
    if pct(f.metrics, ALLREDUCE_WAIT_PCT) is None and wait is not None:
        return sharded_comm_advice(f, wait)
    fewer = Move(f"fewer ranks (num_workers below {ranks:g})", "num_workers", DOWN)
    if text(f.params.get(GLOBAL_BATCH_FIXED, "")) == "true":  # one all-reduce per global batch whatever its split
        return (f"at {ranks:g} ranks {wait:.0f}% of the step waiting for the gradient all-reduce that backward did not "
                "hide (one per fixed global batch, whatever its micro-batch split)", (fewer,))
    moves = (fewer, larger_batch(f.params, " per rank (fewer all-reduces per sample)"),
             Move(f"grad_accum_steps above {accum} (one all-reduce per that many micro-batches)", "grad_accum_steps", UP))
    return f"at {ranks:g} ranks {wait:.0f}% of the step waiting for the gradient all-reduce that backward did not hide", moves


def gpu_near_peak(f: Figures) -> bool:
    return f.util is not None and f.sol is not None and f.sol >= NEAR_PEAK_PCT


def near_peak_advice(f: Figures) -> tuple[str, tuple[Move, ...]]:
    named = PEAK_NAME.get(text(f.params.get("precision", "")), "its precision's")
    return (f"{f.said}, compute at {f.sol:.0f}% of this machine's measured {named} peak: little left to gain from "
            "batch size", tuple(faster_precisions(f, True)))


def gpu_busy(f: Figures) -> bool:
    return f.util is not None and f.util >= GPU_BUSY[f.signal or ""][0]


def busy_advice(f: Figures) -> tuple[str, tuple[Move, ...]]:
    return f"{f.said}{f.gpu_peak()}", tuple(faster_precisions(f, True) + compile_unless_on(f))


def gpu_memory_left(f: Figures) -> bool:
    headroom, total = f.metrics.get(MEM_HEADROOM_GIB), f.metrics.get(MEM_TOTAL_GIB)
    return f.util is not None and headroom is not None and bool(total) and (total - headroom) / total < MEMORY_USED_FRACTION


def headroom_advice(f: Figures) -> tuple[str, tuple[Move, ...]]:
    """A larger batch; and memory bought with compute that is not needed: checkpointing or offload turned off."""
    headroom, total = f.metrics[MEM_HEADROOM_GIB], f.metrics[MEM_TOTAL_GIB]
    moves = [larger_batch(f.params)]
    if text(f.params.get("activation_checkpointing", "none")) != "none":
        moves.append(Move("activation_checkpointing none (the memory it saves is not needed; its recomputation is "
                          "paid every step)", "activation_checkpointing", "none"))
    if on(f.params, "cpu_offload"):
        moves.append(Move("cpu_offload off (the device has room for the shard)", "cpu_offload", "false"))
    return f"{f.said}{f.gpu_peak()} with only {total - headroom:.1f} of {total:.0f} GiB reserved", tuple(moves)


def gpu_other(f: Figures) -> bool:
    return f.util is not None


def gpu_underused_advice(f: Figures) -> tuple[str, tuple[Move, ...]]:
    return (f"{f.said}{f.gpu_peak()} and data wait {f.wait or 0:.0f}%",
            (larger_batch(f.params), *compile_unless_on(f, "compile (fewer kernel launches)")))


def cpu_saturated(f: Figures) -> bool:
    busy = f.cpu_busy()
    return busy is not None and busy[0] >= CPU_BUSY_FRACTION * 100 * busy[1]


def saturated_advice(f: Figures) -> tuple[str, tuple[Move, ...]]:
    _, cores, how = f.cpu_busy()  # type: ignore[misc]  # the rule held: the figure is there
    moves = emulated_move(f) + faster_precisions(f, False) + compile_unless_on(f)
    moves.append(Move("more cpus_per_worker (or a GPU)", "cpus_per_worker", UP))
    return (f"the rank's core(s) are saturated: {how} of {cores:.0f} core(s) busy{f.cpu_peak()}, data wait "
            f"{f.wait or 0:.0f}%", tuple(moves))


def cpu_idle(f: Figures) -> bool:
    busy = f.cpu_busy()
    return busy is not None and busy[0] < CPU_BUSY_FRACTION * 100  # not even one core kept busy: it waits


def idle_advice(f: Figures) -> tuple[str, tuple[Move, ...]]:
    _, cores, how = f.cpu_busy()  # type: ignore[misc]  # the rule held: the figure is there
    alone = f.ranks is not None and f.ranks < 2  # one rank: no all-reduce to wait in
    fixed = text(f.params.get(GLOBAL_BATCH_FIXED, "")) == "true"  # all-reduces per sample: the global batch's
    moves = [larger_batch(f.params, "" if alone else " (fewer, larger micro-batches per step)" if fixed
                          else " (fewer all-reduces per sample)"), *emulated_move(f)]
    waits = ("for a core another process holds" if alone else
             "for the other ranks in the gradient all-reduce or for a core another process holds")
    return (f"only {how} of {cores:.0f} core(s) busy{f.cpu_peak()}, data wait {f.wait or 0:.0f}%: the rest of each "
            f"step the rank sits idle, waiting {waits}", tuple(moves))


def always(f: Figures) -> bool:
    return True


def unclear_advice(f: Figures) -> tuple[str, tuple[Move, ...]]:
    shown = ", ".join(f"{k}={f.metrics[k]:.0f}" for k in (DATA_WAIT_PCT, CPU_WORKER_PCT, CPU_LOADERS_PCT)
                      if pct(f.metrics, k) is not None)
    return f"no single bottleneck stands out ({shown or 'no figures'})", tuple([] if f.gpu else emulated_move(f))


@dataclass(frozen=True)
class Rule:
    kind: str
    when: Callable[[Figures], bool]
    advice: Callable[[Figures], tuple[str, tuple[Move, ...]]]  # (the facts that made it hold, the moves)


RULES: tuple[Rule, ...] = (
    Rule("input-bound", input_bound, input_advice),
    Rule("communication-bound", waits_in_allreduce, allreduce_advice),
    Rule("compute-bound", gpu_near_peak, near_peak_advice),
    Rule("compute-bound", gpu_busy, busy_advice),
    Rule("memory-headroom", gpu_memory_left, headroom_advice),
    Rule("underutilised", gpu_other, gpu_underused_advice),
    Rule("compute-bound", cpu_saturated, saturated_advice),
    Rule("underutilised", cpu_idle, idle_advice),
    Rule("unclear", always, unclear_advice),
)


# -- the trace: cited, and followed where a counter disagrees with it -------------------------------

TRACE_DISAGREES_PTS = 5.0  # a counter and the trace further apart than this: the verdict says so and follows the trace
# ... when the traced steps are known to span at least this long: a shorter trace is a sample of a few OS time slices
# (steps of 4 ms on the 2-core scaling example: 8 ms traced against a 5-s counter window, whose exposed
# all-reduce read 31% then 69% in two runs while the counter read 61% and 65%; docs/explain/traces.md)
TRACE_MIN_SPAN_MS = 100.0
# (counter, the trace's figure for the same thing, its words)
_TRACED = ((DATA_WAIT_PCT, TRACE_DATA_WAIT_PCT, "data wait"),
           (ALLREDUCE_WAIT_PCT, TRACE_EXPOSED_PCT, "all-reduce wait backward did not hide"))


def trace_view(metrics: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Return the figures the rules read, with the trace's where a counter disagrees with it.

    The trace's figure wins where the two differ by more than `TRACE_DISAGREES_PTS` (the trace saw where each
    step's time went; a counter infers it). Also returns what the verdict says of the trace: its split, the rank
    that waited most, each disagreement. No trace: the figures as they are, nothing said."""
    compute = pct(metrics, TRACE_COMPUTE_PCT)
    if compute is None:
        return metrics, ""
    followed, notes = dict(metrics), []
    span = traced_span_ms(metrics)
    for counter, traced, words in _TRACED:
        c, t = pct(metrics, counter), pct(metrics, traced)
        if c is not None and t is not None and abs(c - t) > TRACE_DISAGREES_PTS:
            said = f"the counter {counter} said {c:.0f}% {words}, the trace {t:.0f}%"
            if span is None or span < TRACE_MIN_SPAN_MS:  # an unknown span never overrules the counter
                over = "over traced steps of unknown length" if span is None else f"over only {span:.0f} ms of traced steps"
                notes.append(f"{said} {over}: keeping the counter's longer window")
            else:
                followed[counter] = t
                notes.append(f"{said}: following the trace")
    steps = metrics.get(TRACE_STEPS)
    said = (f"; trace{f' (warm-up steps {steps})' if steps else ''}: compute {compute:.0f}%, "
            f"exposed all-reduce {pct(metrics, TRACE_EXPOSED_PCT) or 0:.0f}%, "
            f"data wait {pct(metrics, TRACE_DATA_WAIT_PCT) or 0:.0f}%, idle {pct(metrics, TRACE_IDLE_PCT) or 0:.0f}%")
    worst, rank = pct(metrics, TRACE_EXPOSED_MAX_PCT), pct(metrics, TRACE_EXPOSED_MAX_RANK)
    if worst is not None and rank is not None and worst >= 1:
        said += f"; {worst:.0f}% of each step in exposed all-reduce on rank {rank:.0f}"
    return followed, said + "".join(f"; {n}" for n in notes)


def traced_span_ms(metrics: dict[str, Any]) -> float | None:
    """Return how long the traced steps lasted, or None where either figure is missing.

    `trace/step_ms` x the steps of `trace/steps` ("3-4": 2)."""
    step_ms, steps = pct(metrics, TRACE_STEP_MS), str(metrics.get(TRACE_STEPS) or "")
    first, _, last = steps.partition("-")
    if step_ms is None or not first.isdigit() or not (last or first).isdigit():
        return None
    return step_ms * (int(last or first) - int(first) + 1)


def first_rule(metrics: dict[str, Any], params: dict[str, Any]) -> tuple[Rule, Figures]:
    """The first rule of `RULES` that holds for the trial, and the figures it read."""
    f = Figures.of(metrics, params)
    return next(rule for rule in RULES if rule.when(f)), f
