"""A profiler trace of a few steps per trial, on every rank, and where each traced step's time went.

**When.** The last steps of warm-up (`TrialConfig.trace_steps` of them, after one step of the
profiler's own warm-up): they run anyway and are never timed, so the trace adds no step, no data and
no change to the model, and no traced step is in the measured window (`throughput/*`). A trial whose
warm-up is too short (step 0 builds; one profiler warm-up step; one traced step at least), or whose
warm-up `max_warmup_s` ended before the traced steps did, has no trace: `trace/skipped` says why.

**What.** Each rank's trace (`torch.profiler`, with `distributedInfo`, as Holistic Trace Analysis
reads it), gzipped into `TrialConfig.trace_dir` when one is given (the sweep logs it as an artifact of
the trial's MLflow run; Perfetto and chrome://tracing open it), and its breakdown (`breakdown`): the
share of the traced steps' wall time each rank spent

- `trace/compute_pct`: in operators on the training thread (forward, backward, optimizer);
- `trace/data_wait_pct`: waiting for the next batch (the DataLoader's `__next__`);
- `trace/comm_exposed_pct`: with the gradient all-reduce running and the training thread doing
  neither: communication that compute did not hide;
- `trace/idle_pct`: none of these (Python and framework overhead between operators, other waits);

which partition the wall time (they sum to 100), and `trace/comm_pct`, all communication, hidden or
not. The metrics are the mean over ranks; `trace/comm_exposed_max_pct` and its rank, and
`trace/per_rank`, say which rank waited most.

On CPU the split is computed here from the trace's own events: gloo's spans (`gloo:*`) on its
`pt_gloo_runloop` threads are communication, the training thread's `cpu_op` events outside `c10d::`
are compute. A GPU trace (kernels on CUDA streams) is split by Holistic Trace Analysis (`hta`, the
gpu extra): its temporal breakdown and communication overlap, with memory copies as
`trace/memcpy_pct`; both behind `breakdown`, one output.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

# kineto prints two "USDT" lines per trace to stdout (profiler_start, profiler_stop), per rank per trial: its
# levels run VERBOSE 0 .. USDT 5; 6 keeps them out of the sweep's output (a user's own setting wins)
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

from trainables import contract

logger = logging.getLogger(__name__)

PARTS = ("compute", "data_wait", "comm_exposed", "idle")  # partition the traced wall time
MAX_TRACE_BYTES = 8 * 1024 * 1024  # a kept trace's gzipped size at most; a larger one is summarised, not kept
_COMM_PREFIXES = ("gloo:", "nccl:", "ncclDevKernel", "ncclKernel")
_DATA_PREFIX = "enumerate(DataLoader)"
_NOT_COMPUTE = ("c10d::", "record_param_comms")


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        elif b > a:
            out.append((a, b))
    return out


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def _minus(spans: list[tuple[float, float]], cut: list[tuple[float, float]]) -> list[tuple[float, float]]:
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


def _clip(spans: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi]


def cpu_breakdown(trace: dict[str, Any]) -> dict[str, float]:
    """The traced steps' wall time split on a CPU trace (module doc); percentages, and `wall_ms` per step."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    threads = {(e.get("pid"), e.get("tid")): str(e.get("args", {}).get("name", ""))
               for e in trace.get("traceEvents", []) if e.get("ph") == "M" and e.get("name") == "thread_name"}
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        raise ValueError("the trace has no ProfilerStep events: no traced step to split")
    main = (steps[0].get("pid"), steps[0].get("tid"))
    lo, hi = min(float(e["ts"]) for e in steps), max(float(e["ts"]) + float(e["dur"]) for e in steps)
    wall = hi - lo

    def spans(keep: Any) -> list[tuple[float, float]]:
        return _union(_clip([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events if keep(e)], lo, hi))

    on_main = lambda e: (e.get("pid"), e.get("tid")) == main  # noqa: E731 - a predicate, named once
    data = spans(lambda e: on_main(e) and str(e.get("name", "")).startswith(_DATA_PREFIX))
    ops = spans(lambda e: on_main(e) and e.get("cat") == "cpu_op" and not str(e.get("name", "")).startswith(_NOT_COMPUTE))
    compute = _minus(ops, data)
    comm = spans(lambda e: str(e.get("name", "")).startswith(_COMM_PREFIXES)
                 or "pt_gloo_runloop" in threads.get((e.get("pid"), e.get("tid")), ""))
    busy = _union(data + compute)
    exposed = _minus(comm, busy)
    parts = {"compute": _length(compute), "data_wait": _length(data), "comm_exposed": _length(exposed)}
    parts["idle"] = max(0.0, wall - sum(parts.values()))
    out = {f"{k}_pct": 100.0 * v / wall for k, v in parts.items()}
    out["comm_pct"] = 100.0 * _length(comm) / wall
    out["wall_ms"] = wall / 1000.0 / len(steps)
    return out


def is_gpu_trace(trace: dict[str, Any]) -> bool:
    return any(e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") for e in trace.get("traceEvents", [])[:200000])


def hta_breakdown(trace_path: Path, trace: dict[str, Any]) -> dict[str, float]:
    """A GPU trace split by Holistic Trace Analysis (one rank's trace in a folder of its own): its temporal
    breakdown (idle, compute, non-compute), its communication/computation overlap and kernel types; data
    wait from the training thread's own DataLoader spans, as on a CPU."""
    from hta.trace_analysis import TraceAnalysis  # the gpu extra

    folder = Path(tempfile.mkdtemp(prefix="hta-"))
    try:
        shutil.copy(trace_path, folder / trace_path.name)
        analysis = TraceAnalysis(trace_dir=str(folder))
        temporal = analysis.get_temporal_breakdown(visualize=False).iloc[0]
        overlap = analysis.get_comm_comp_overlap(visualize=False).iloc[0]
        kinds, _ = analysis.get_gpu_kernel_breakdown(visualize=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    share = {str(r["kernel_type"]): float(r["percentage"]) for _, r in kinds.iterrows()}
    comm = share.get("COMMUNICATION", 0.0) * (1.0 - float(temporal["idle_time_pctg"]) / 100.0)
    exposed = comm * (1.0 - float(overlap["comp_comm_overlap_pctg"]) / 100.0)
    cpu = cpu_breakdown(trace)
    return {"compute_pct": float(temporal["compute_time_pctg"]), "comm_pct": comm, "comm_exposed_pct": exposed,
            "data_wait_pct": cpu["data_wait_pct"], "idle_pct": float(temporal["idle_time_pctg"]),
            "memcpy_pct": share.get("MEMORY", 0.0) * (1.0 - float(temporal["idle_time_pctg"]) / 100.0),
            "wall_ms": cpu["wall_ms"]}


def breakdown(trace_path: Path) -> dict[str, float]:
    """Where one rank's traced steps' time went (percentages of their wall time, module doc), from its
    trace: our own split of a CPU trace, Holistic Trace Analysis' of a GPU trace."""
    with (gzip.open(trace_path, "rt") if trace_path.suffix == ".gz" else open(trace_path)) as f:
        trace = json.load(f)
    return hta_breakdown(trace_path, trace) if is_gpu_trace(trace) else cpu_breakdown(trace)


class Tracer:
    """Profiles the last `steps` warm-up steps of one rank (after one profiler warm-up step) and, at the
    warm-up's end, splits and keeps its trace. Every rank calls `before`, `after` and `finish` at the
    same steps (`finish` holds the window's collectives: an all-reduce of every rank's split)."""

    def __init__(self, steps: int, trace_dir: str | None, rank: int, world: int, device: torch.device) -> None:
        self.steps, self.trace_dir, self.rank, self.world, self.device = steps, trace_dir, rank, world, device
        self.prof: Any = None
        self.first: int | None = None  # the first traced step (after the profiler's warm-up step)
        self.active = 0  # the steps this trace holds: `steps`, or fewer where max_warmup_s left less room
        self.traced = 0
        self.path: Path | None = None  # this rank's gzipped trace, once the profiler saved it
        self.kept = False  # in trace_dir (logged by the sweep), not a temp file
        self.skipped = ""
        self.spent_s = 0.0  # this rank's seconds writing, gzipping and splitting its trace: not a step's time

    def before(self, step: int, warmup_steps: int) -> None:
        """Before step `step` of warm-up (which is now expected to end at `warmup_steps`: max_warmup_s may move
        that end closer as steps are timed): start the profiler so that its warm-up step and then `steps`
        traced steps are the last of warm-up, or, where the end came closer than planned, as many as still fit."""
        if not self.steps or self.first is not None or self.skipped or step < warmup_steps - 1 - self.steps:
            return
        if step < 1:  # step 0 builds, starts the loaders and compiles: no step to trace
            self.skipped = (f"warm-up too short: {warmup_steps} step(s); tracing {self.steps} needs "
                            f"num_warmup_steps >= {self.steps + 2}")
            return
        self.active = min(self.steps, warmup_steps - 1 - step)
        if self.active < 1:  # no traced step fits after the profiler's warm-up step: `finish` says so
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=activities, on_trace_ready=self._ready,
                                           schedule=torch.profiler.schedule(wait=0, warmup=1, active=self.active, repeat=1))
        self.prof.start()
        self.first = step + 1

    def after(self, step: int) -> None:
        if self.prof is not None:
            self.prof.step()
            if self.first is not None and step >= self.first:
                self.traced += 1

    def finish(self, all_reduce: Any) -> dict[str, Any]:
        """At the warm-up's end, on every rank: stop the profiler, keep this rank's trace, split it, and
        combine every rank's split (`all_reduce(values, device, op)`). Returns the final report's trace
        figures (rank 0's say; every rank computes them), or why there are none."""
        if not self.steps:  # off (every rank alike): no collective, nothing said
            return {}
        t0 = time.perf_counter()
        mine = [float("nan")] * (len(PARTS) + 3)
        if self.prof is not None:
            try:
                self.prof.stop()  # a completed schedule saved its trace already (`_ready`); stopping early saves a part
                if self.path is not None and self.traced >= self.active:
                    split = breakdown(self.path)
                    # memory copies: a GPU trace's only (-1: none on this rank's kind of trace)
                    mine = [split[f"{p}_pct"] for p in PARTS] + [split["comm_pct"], split.get("memcpy_pct", -1.0),
                                                                 split["wall_ms"]]
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
        elif not self.skipped:
            self.skipped = (f"warm-up ended before the trace began: tracing {self.steps} step(s) needs "
                            f"num_warmup_steps >= {self.steps + 2} (and max_warmup_s long enough for them)")
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
        for i, part in enumerate((*PARTS, "comm")):
            out[f"trace/{part}_pct"] = sum(r[i] for r in ranks) / self.world
        memcpy = [r[len(PARTS) + 1] for r in ranks]
        if min(memcpy) >= 0:
            out["trace/memcpy_pct"] = sum(memcpy) / self.world
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
        """The trial ended before warm-up did (a failure, a target met in warm-up): stop the profiler, no
        collective, no figures."""
        if self.prof is not None:
            try:
                self.prof.stop()
            except Exception:  # noqa: BLE001 - the trial is ending anyway
                pass
            self.prof = None
        if not self.kept:
            self._discard()

    def _discard(self) -> None:
        """Remove this rank's trace: a kept file, or the temp folder of one kept only to be split."""
        if self.path is not None:
            if self.kept:
                self.path.unlink(missing_ok=True)
            else:
                shutil.rmtree(self.path.parent, ignore_errors=True)
        self.path, self.kept = None, False

    def _ready(self, prof: Any) -> None:
        """The profiler's traced steps are done: this rank's trace, gzipped, into `trace_dir` when it is kept
        (bounded in size), else into a temp folder for the split alone."""
        t0 = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix="trace-"))
        raw = tmp / f"rank-{self.rank}.pt.trace.json"
        prof.export_chrome_trace(str(raw))
        gz = raw.with_suffix(".json.gz")
        with open(raw, "rb") as src, gzip.open(gz, "wb", compresslevel=5) as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        self.path = gz
        if self.trace_dir and gz.stat().st_size <= MAX_TRACE_BYTES:
            os.makedirs(self.trace_dir, exist_ok=True)
            self.path = Path(shutil.move(str(gz), Path(self.trace_dir) / gz.name))
            self.kept = True
            shutil.rmtree(tmp, ignore_errors=True)
        self.spent_s += time.perf_counter() - t0
