"""A profiler trace of a few steps per trial, on every rank, and where each traced step's time went.

**When.** The last steps of warm-up (`TrialConfig.trace_steps` of them, after one step of the
profiler's own warm-up): they run anyway and are never timed, so the trace adds no step, no data and
no change to the model, and no traced step is in the measured window (`throughput/*`). A trial whose
warm-up is too short (step 0 builds; one profiler warm-up step; one traced step at least), or whose
warm-up `max_warmup_s` ended before the traced steps did, has no trace: `trace/skipped` says why. No
traced step holds an evaluation (`eval_every_steps`): where one would, the trace moves to the latest
steps that hold none, or holds fewer steps (`trace/steps` says which).

**What.** Each rank's trace (`torch.profiler`, with `distributedInfo`, as Holistic Trace Analysis
reads it), gzipped into `TrialConfig.trace_dir` when one is given (the sweep logs it as an artifact of
the trial's MLflow run; Perfetto and chrome://tracing open it), and its split (`split`, one function
for CPU and GPU traces): the share of the traced steps' wall time each rank spent

- `trace/compute_pct`: computing;
- `trace/data_wait_pct`: waiting for the next batch (the training thread's DataLoader `__next__`);
- `trace/comm_exposed_pct`: communicating while nothing computed: communication compute did not hide;
- `trace/idle_pct`: none of these;

which partition the wall time (they sum to 100), and `trace/comm_pct`, all communication, hidden or
not. The metrics are the mean over ranks; `trace/comm_exposed_max_pct` and its rank, and
`trace/per_rank`, say which rank waited most.

**The split.** The window is the traced steps: from the first `ProfilerStep#` span's start to the last
one's end (every traced step), on a GPU trace extended to the last GPU event's end where kernels of the
traced steps finish later. Each part is a union of intervals clipped to the window, minus the parts
before it, so nothing is counted twice and the four sum to the window:

- on a CPU trace (the training thread is the resource): data wait first, then compute (the training
  thread's `cpu_op` events outside `c10d::`, the collective's launch), then exposed communication (gloo's
  spans, `gloo:*` and its `pt_gloo_runloop` threads, outside both);
- on a GPU trace (events with cat `kernel`, `gpu_memcpy`, `gpu_memset`; the GPU is the resource; kernels on
  every stream of the GPU, one union): compute (every kernel that is not NCCL's, and every memory copy and
  set: the GPU busy with work that is not communication), then exposed communication (NCCL's kernels,
  `nccl*Kernel*` as HTA names them, outside compute), then data wait (outside both: a wait hidden behind
  queued kernels is not a wait). `trace/memcpy_pct` is the copies' and sets' union, a part of compute.

A GPU trace without NCCL kernels (one rank) has no communication: 0, never NaN. Holistic Trace Analysis
0.5.0 is the reference this was checked against (docs/explain/traces.md), not a dependency.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# kineto prints two "USDT" lines per trace to stdout (profiler_start, profiler_stop), per rank per trial: its
# levels run VERBOSE 0 .. USDT 5; 6 keeps them out of the sweep's output (a user's own setting wins)
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

from trainables import contract
from trainables.storage import Storage

logger = logging.getLogger(__name__)

PARTS = ("compute", "data_wait", "comm_exposed", "idle")  # partition the traced wall time
_PART_KEYS = (contract.TRACE_COMPUTE_PCT, contract.TRACE_DATA_WAIT_PCT, contract.TRACE_EXPOSED_PCT,
              contract.TRACE_IDLE_PCT)  # what each of PARTS is reported as
MAX_TRACE_BYTES = 8 * 1024 * 1024  # a kept trace's gzipped size at most; a larger one is summarised, not kept
_DATA_PREFIX = "enumerate(DataLoader)"
_NOT_COMPUTE = ("c10d::", "record_param_comms")
_GPU = ("kernel", "gpu_memcpy", "gpu_memset")  # what runs on the GPU (gpu_user_annotation only labels it)
_NCCL = re.compile(r"nccl.*Kernel")  # a communication kernel: HTA 0.5.0's rule (hta.utils.utils.NCCL_KERNEL_RE)

Spans = list[tuple[float, float]]


def _union(spans: Spans) -> Spans:
    out: Spans = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        elif b > a:
            out.append((a, b))
    return out


def _length(spans: Spans) -> float:
    return sum(b - a for a, b in spans)


def _minus(spans: Spans, cut: Spans) -> Spans:
    """`spans` without what `cut` covers (both unions)."""
    out, j = [], 0
    for a, b in spans:
        start = a
        while j < len(cut) and cut[j][1] <= start:
            j += 1
        k = j
        while k < len(cut) and cut[k][0] < b:
            if cut[k][0] > start:
                out.append((start, cut[k][0]))
            start = max(start, cut[k][1])
            k += 1
        if start < b:
            out.append((start, b))
    return out


def _clip(spans: Spans, lo: float, hi: float) -> Spans:
    return [(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi]


def split(trace: dict[str, Any]) -> dict[str, float]:
    """Split where one rank's traced steps' wall time went (module doc), on a CPU or a GPU trace.

    The four parts (`<part>_pct`, summing to 100), `comm_pct`, `memcpy_pct` (a GPU trace's only) and `wall_ms`
    per step."""
    every = trace.get("traceEvents", [])
    events = [e for e in every if e.get("ph") == "X" and "dur" in e]
    threads = {(e.get("pid"), e.get("tid")): str(e.get("args", {}).get("name", ""))
               for e in every if e.get("ph") == "M" and e.get("name") == "thread_name"}
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") != "gpu_user_annotation"]  # the host's spans; a GPU trace repeats them on its streams
    if not steps:
        raise ValueError("the trace has no ProfilerStep events: no traced step to split")
    main = (steps[0].get("pid"), steps[0].get("tid"))
    gpu = [e for e in events if e.get("cat") in _GPU]
    lo = min(float(e["ts"]) for e in steps)
    hi = max(float(e["ts"]) + float(e["dur"]) for e in steps + gpu)  # the last kernel may end after the last step

    def spans(keep: Any) -> Spans:
        return _union(_clip([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events if keep(e)], lo, hi))

    name = lambda e: str(e.get("name", ""))  # noqa: E731 - named once, read below
    on_main = lambda e: (e.get("pid"), e.get("tid")) == main  # noqa: E731
    data = spans(lambda e: on_main(e) and name(e).startswith(_DATA_PREFIX))
    out: dict[str, float] = {}
    if gpu:  # the GPU is the resource: what it did first, a wait for data only where it did nothing
        nccl = lambda e: e.get("cat") == "kernel" and _NCCL.match(name(e)) is not None  # noqa: E731
        comm = spans(nccl)
        layers = [("compute", spans(lambda e: e.get("cat") in _GPU and not nccl(e))), ("comm_exposed", comm),
                  ("data_wait", data)]
        out["memcpy_pct"] = _length(spans(lambda e: e.get("cat") in ("gpu_memcpy", "gpu_memset")))
    else:  # the training thread is the resource: waiting for data, then its operators, then gloo's threads
        comm = spans(lambda e: name(e).startswith("gloo:")
                     or "pt_gloo_runloop" in threads.get((e.get("pid"), e.get("tid")), ""))
        ops = spans(lambda e: on_main(e) and e.get("cat") == "cpu_op" and not name(e).startswith(_NOT_COMPUTE))
        layers = [("data_wait", data), ("compute", ops), ("comm_exposed", comm)]
    wall = hi - lo
    if wall <= 0:
        raise ValueError("the traced steps last no time: nothing to split")
    taken: Spans = []
    for part, part_spans in layers:  # each part: its spans outside the parts before it
        mine = _minus(part_spans, taken)
        out[f"{part}_pct"] = _length(mine)
        taken = _union(taken + mine)
    out["idle_pct"] = max(0.0, wall - _length(taken))
    out["comm_pct"] = _length(comm)
    out = {k: 100.0 * v / wall for k, v in out.items()}
    out["wall_ms"] = wall / 1000.0 / len(steps)
    return out


def breakdown(trace_path: Path) -> dict[str, float]:
    """`split` of one rank's trace file (gzipped or not)."""
    with (gzip.open(trace_path, "rt") if trace_path.suffix == ".gz" else open(trace_path)) as f:
        return split(json.load(f))


_KINETO_THREAD = b"External init callback must run in same thread as registerClient"
_kineto_ready = False  # a profiler started in this process already: kineto is initialised


def _start(prof: Any) -> None:
    """Start the profiler. The first start in a process initialises kineto, which then calls back the client
    torch registered while it loaded, on the thread that imported torch; on any other thread it skips the
    callback and prints "ERROR: External init callback must run in same thread as registerClient" (C++, to
    fd 2). Under Ray Train that is every rank: the loop runs in a thread of the worker actor, whose main thread
    imported torch (plain torchrun runs it on the main thread: no such line). The callback is empty on CPU and
    CUDA (torch's LibKinetoClient.init; MTIA's memory profiler in newer torch), and no public API runs kineto's
    initialisation on the importing thread from this one; so on that first start this one line is left out of
    fd 2, and whatever else is written meanwhile passes through."""
    global _kineto_ready
    if _kineto_ready:
        prof.start()
        return
    _kineto_ready = True
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            prof.start()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            rest = b"".join(line for line in caught.read().splitlines(keepends=True) if _KINETO_THREAD not in line)
            if rest:
                os.write(2, rest)


class Tracer:
    """Profiles the last `steps` warm-up steps of one rank, and at warm-up's end splits and keeps its trace.

    One profiler warm-up step comes first. Every rank calls `before`, `after` and `finish` at the same steps
    (`finish` holds the window's collectives: an all-reduce of every rank's split)."""

    def __init__(self, steps: int, trace_dir: str | None, rank: int, world: int, device: torch.device) -> None:
        self.steps, self.trace_dir, self.rank, self.world, self.device = steps, trace_dir, rank, world, device
        self.prof: Any = None
        self.first: int | None = None  # the first traced step (after the profiler's warm-up step)
        self.active = 0  # the steps this trace holds: `steps`, or fewer where max_warmup_s left less room
        self.traced = 0
        self.path: Path | None = None  # this rank's gzipped trace, once the profiler saved it
        self.kept = False  # a copy in trace_dir (logged by the sweep), uploaded from this node
        self._tmp: Path | None = None  # the trace's temporary folder on this node: removed once it is split
        self.skipped = ""
        self.spent_s = 0.0  # this rank's seconds writing, gzipping and splitting its trace: not a step's time
        self.evaluated = False  # an evaluation took a step the trace could have held

    def before(self, step: int, warmup_steps: int, evaluates: Callable[[int], bool] = lambda step: False) -> None:
        """Start the profiler, where due, before step `step` of warm-up.

        Warm-up is now expected to end at `warmup_steps` (max_warmup_s may move that end closer as steps are timed).
        The profiler starts so that its warm-up step and then `steps` traced steps are the last of warm-up, or, where
        the end came closer than planned, as many as still fit. `evaluates(k)`: an evaluation runs before step k
        (inside step k's span): no traced step holds one, so the trace moves to the latest steps without one, or,
        where none hold `steps`, holds fewer."""
        if not self.steps or self.first is not None or self.skipped:
            return
        latest = warmup_steps - 1 - self.steps  # the start that makes the traced steps the last of warm-up
        if step < 1:  # step 0 builds, starts the loaders and compiles: no step to trace
            if latest < 1:
                self.skipped = (f"warm-up too short: {warmup_steps} step(s); tracing {self.steps} needs "
                                f"num_warmup_steps >= {self.steps + 2}")
            return
        room = self._room(step, warmup_steps, evaluates)
        if step < latest and (room < self.steps or any(self._room(s, warmup_steps, evaluates) == self.steps
                                                       for s in range(step + 1, latest + 1))):
            return  # a later start holds every traced step (nearer warm-up's end), or this one does not
        if room < 1:  # none fits here: the next step may hold one; else `finish` says why
            self.evaluated = self.evaluated or (step + 1 < warmup_steps and evaluates(step + 1))
            return
        self.active = room
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=activities, on_trace_ready=self._ready,
                                           schedule=torch.profiler.schedule(wait=0, warmup=1, active=self.active, repeat=1))
        _start(self.prof)
        self.first = step + 1

    def _room(self, start: int, warmup_steps: int, evaluates: Callable[[int], bool]) -> int:
        """The traced steps that fit after a profiler warm-up step at `start`: up to `steps`, before warm-up
        ends, and before the next step an evaluation runs in."""
        n = 0
        while n < self.steps and start + 1 + n < warmup_steps and not evaluates(start + 1 + n):
            n += 1
        return n

    def after(self, step: int) -> None:
        if self.prof is not None:
            self.prof.step()
            if self.first is not None and step >= self.first:
                self.traced += 1

    def finish(self, all_reduce: Any) -> dict[str, Any]:
        """Stop the profiler at the warm-up's end, on every rank, and return the trace figures.

        Keep this rank's trace, split it, and combine every rank's split (`all_reduce(values, device, op)`). Returns
        the final report's trace figures (rank 0's say; every rank computes them), or why there are none."""
        if not self.steps:  # off (every rank alike): no collective, nothing said
            return {}
        t0 = time.perf_counter()
        mine = [float("nan")] * (len(PARTS) + 3)
        if self.prof is not None:
            try:
                self.prof.stop()  # a completed schedule saved its trace already (`_ready`); stopping early saves a part
                if self.path is not None and self.traced >= self.active:
                    got = breakdown(self.path)
                    # memory copies: a GPU trace's only (-1: none on this rank's kind of trace)
                    mine = [got[f"{p}_pct"] for p in PARTS] + [got["comm_pct"], got.get("memcpy_pct", -1.0),
                                                               got["wall_ms"]]
                    unsaid = [n for n, v in zip((*PARTS, "comm", "memcpy", "wall_ms"), mine, strict=True) if v != v]
                    if unsaid:  # this rank's own: never "another rank"
                        self.skipped = f"this rank's split has no number for {', '.join(unsaid)}"
                else:
                    self.skipped = (f"max_warmup_s ended warm-up after {self.traced} of the {self.active} traced "
                                    "step(s)")
                    self._discard()  # a part of the steps it would name: neither split nor kept
            except Exception as exc:  # noqa: BLE001 - a trace is evidence beside the figures, never a failed trial
                self.skipped = f"the trace could not be split: {type(exc).__name__}: {exc}"
                logger.warning("rank %d: %s", self.rank, self.skipped)
            finally:
                self.prof = None
                if not self.kept:
                    self._discard()
                self._remove_tmp()  # a kept trace is in trace_dir: nothing stays on this node
        elif not self.skipped:
            self.skipped = (f"warm-up ended before the trace began: tracing {self.steps} step(s) needs "
                            f"num_warmup_steps >= {self.steps + 2} (and max_warmup_s long enough for them)" + (
                                "; an evaluation (eval_every_steps) ran in every step left to trace" if self.evaluated
                                else ""))
        width = len(mine)
        slots = [0.0] * (width * self.world)
        slots[self.rank * width:(self.rank + 1) * width] = mine
        every = all_reduce(slots, self.device)  # NaN anywhere: some rank has no split, so none is reported
        self.spent_s += time.perf_counter() - t0
        (spent,) = all_reduce([self.spent_s], self.device, op="max")
        out: dict[str, Any] = {contract.TRACE_S: spent}
        ranks = [every[r * width:(r + 1) * width] for r in range(self.world)]
        if any(v != v for r in ranks for v in r):
            out[contract.TRACE_SKIPPED] = self.skipped or "another rank has no trace"
            return out
        for i, key in enumerate((*_PART_KEYS, contract.TRACE_COMM_PCT)):
            out[key] = sum(r[i] for r in ranks) / self.world
        memcpy = [r[len(PARTS) + 1] for r in ranks]
        if min(memcpy) >= 0:
            out[contract.TRACE_MEMCPY_PCT] = sum(memcpy) / self.world
        exposed = [r[PARTS.index("comm_exposed")] for r in ranks]
        worst = max(range(self.world), key=lambda r: exposed[r])
        out[contract.TRACE_EXPOSED_MAX_PCT], out[contract.TRACE_EXPOSED_MAX_RANK] = exposed[worst], worst
        out[contract.TRACE_STEP_MS] = max(r[-1] for r in ranks)
        out[contract.TRACE_STEPS] = f"{self.first}-{(self.first or 0) + self.active - 1}"
        out[contract.TRACE_PER_RANK] = "; ".join(
            f"rank {n}: " + ", ".join(f"{p.replace('_', ' ')} {r[i]:.0f}%" for i, p in enumerate(PARTS))
            for n, r in enumerate(ranks))
        return out

    def close(self) -> None:
        """Stop the profiler when the trial ended before warm-up did: no collective, no figures.

        The trial ended early through a failure, or a target met in warm-up."""
        if self.prof is not None:
            try:
                self.prof.stop()
            except Exception:  # noqa: BLE001 - the trial is ending anyway
                pass
            self.prof = None
        if not self.kept:
            self._discard()
        self._remove_tmp()

    def _discard(self) -> None:
        """Remove this rank's trace: its copy in trace_dir, and its temp folder."""
        if self.path is not None and self.kept and self.trace_dir:
            try:
                Storage(self.trace_dir).delete(self.path.name)
            except OSError as exc:  # a store that does not answer: a stray trace, never a failed trial
                logger.warning("rank %d: could not remove its cut-short trace from %s: %s", self.rank, self.trace_dir, exc)
        self._remove_tmp()
        self.path, self.kept = None, False

    def _remove_tmp(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _ready(self, prof: Any) -> None:
        """The profiler's traced steps are done: this rank's trace, gzipped into a temp folder for the split, and
        uploaded to `trace_dir` (a path or a URI: `trainables.storage`) when it is kept (bounded in size)."""
        t0 = time.perf_counter()
        tmp = self._tmp = Path(tempfile.mkdtemp(prefix="trace-"))
        raw = tmp / f"rank-{self.rank}.pt.trace.json"
        prof.export_chrome_trace(str(raw))
        gz = raw.with_suffix(".json.gz")
        with open(raw, "rb") as src, gzip.open(gz, "wb", compresslevel=5) as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        self.path = gz
        if self.trace_dir and gz.stat().st_size <= MAX_TRACE_BYTES:
            try:
                Storage(self.trace_dir).upload(gz, gz.name)  # from this rank's node: the driver reads it from there
                self.kept = True
            except OSError as exc:  # a store that does not answer: the split still stands, the trace is not kept
                logger.warning("rank %d: the trace could not be kept in %s: %s", self.rank, Storage(self.trace_dir), exc)
        self.spent_s += time.perf_counter() - t0
