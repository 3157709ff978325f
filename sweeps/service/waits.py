"""Wait for resources other work holds, saying what the sweep waits for and booking the time apart.

On a shared cluster a sweep asks for a worker group (a Ray placement group, one bundle per rank) that what is
free cannot hold yet, and Ray keeps it pending until other jobs release theirs: a warm group is held until its
sweep ends, between trials too (docs/howto/clusters.md).

```
 WaitWatcher (a thread of the driver, every SAMPLE_S)
   reads   this job's placement groups (`job_groups`): a pending one is a wait; the warm pool's starting groups
   says    a line every LINE_EVERY_S of a wait: what it waits for, what is free, who holds the rest
   books   each starting warm group's wait apart from its start (`Queue.group_waited`): the planned cost and the
           ETA price a start by what starting took, the money what the group held; the sweep's waits in all
           (`waited_s`) for the overhead line
   stops   budget.max_queue_s: a wait longer than that sets `over`, on which the sweep's callback halts the
           sweep, resumable
```

A wait runs from the first sample that finds one of the job's groups pending to the last one that does, across
the moment Ray Train takes to ask again after its placement group timed out (60 s); a group placed within a
sample is no wait. A group's share is booked for the time it was pending at two samples in a row.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import ray

from sweeps.spec import SweepSpec

logger = logging.getLogger(__name__)

SAMPLE_S = 1.0
LINE_EVERY_S = 30.0  # a waiting sweep says so this often
# No group pending for this long ends a wait: Ray Train asks again within a second or two of a placement group
# that timed out, and that gap is part of the wait
_SAME_WAIT_S = 10.0
_KINDS = ("CPU", "GPU")


@dataclass(frozen=True)
class Placement:
    """One of this job's worker placement groups: its bundles (one per rank) and whether it is still pending."""

    bundles: tuple[dict[str, float], ...]
    pending: bool

    def needs(self) -> dict[str, float]:
        return {k: sum(b.get(k, 0.0) for b in self.bundles) for k in _KINDS}

    def said(self) -> str:
        """"a worker group of 2 x {CPU: 1}"."""
        each = ", ".join(f"{k}: {v:g}" for k, v in self.bundles[0].items()) if self.bundles else ""
        return f"a worker group of {len(self.bundles)} x {{{each}}}"


def job_groups(job_id: str) -> list[Placement]:
    """Return the job's worker placement groups that Ray has not removed.

    They come from Ray's table of every job's groups (public: `ray.util.placement_group_table`). Ray names no
    group's job there; a group's id ends with the id of the job that made it (`ray.PlacementGroupID.of(job)`,
    tests/service/test_ray_private.py fails loudly when that changes). Tune's groups for the trials' drivers (no CPU, no
    GPU: `sweeps.service.resources.DRIVER_RESOURCES`) are left out."""
    from ray.util import placement_group_table

    found = []
    for pg_id, info in placement_group_table().items():
        if not pg_id.endswith(job_id) or info.get("state") == "REMOVED":
            continue
        bundles = tuple(dict(b) for _, b in sorted(info.get("bundles", {}).items()))
        if any(b.get("CPU", 0) > 0 or b.get("GPU", 0) > 0 for b in bundles):
            found.append(Placement(bundles, pending=info.get("state") != "CREATED"))
    return found


class Cluster(Protocol):
    """What the watcher reads of the cluster (a fake in the tests)."""

    def groups(self) -> list[Placement]: ...
    def free(self) -> dict[str, float]: ...
    def total(self) -> dict[str, float]: ...


class RayCluster:
    """The Ray cluster this driver is connected to, as its job sees it."""

    def __init__(self) -> None:
        self.job = ray.get_runtime_context().get_job_id()

    def groups(self) -> list[Placement]:
        return job_groups(self.job)

    def free(self) -> dict[str, float]:
        return dict(ray.available_resources())  # a kind none of is free is absent

    def total(self) -> dict[str, float]:
        return dict(ray.cluster_resources())


class Starts(Protocol):
    """The warm pool's groups that are starting (`sweeps.service.pool.Queue`, whose methods these are)."""

    def starting(self) -> dict[int, tuple[float, int]]: ...
    def group_waited(self, slot: int, seconds: float) -> None: ...


class PoolStarts:
    """The warm pool's queue actor, called as `Starts`."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def starting(self) -> dict[int, tuple[float, int]]:
        return dict(ray.get(self.queue.starting.remote(), timeout=10))

    def group_waited(self, slot: int, seconds: float) -> None:
        self.queue.group_waited.remote(slot, seconds)


def _summed(needs: Iterable[dict[str, float]]) -> dict[str, float]:
    total = dict.fromkeys(_KINDS, 0.0)
    for need in needs:
        for k in _KINDS:
            total[k] += need.get(k, 0.0)
    return total


def free_for_sweep(cluster: Cluster) -> dict[str, float]:
    """Return what this sweep may use now.

    What nobody holds, and what its own groups hold already (its first warm group may be placed by the time
    this is asked)."""
    ours, free = _summed(g.needs() for g in cluster.groups() if not g.pending), cluster.free()
    return {k: free.get(k, 0.0) + ours[k] for k in _KINDS}


def holders_said(group: Placement, cluster: Cluster) -> str:
    """Where the group's resources are: "the cluster has 0 of 4 CPUs free; other jobs hold 4 CPUs"."""
    need, free, total = group.needs(), cluster.free(), cluster.total()
    kinds = [k for k in _KINDS if need[k] > 0]
    short = [k for k in kinds if total.get(k, 0.0) < need[k]]
    if short:
        return (f"the cluster has {', '.join(f'{total.get(k, 0.0):g} {k}s' for k in short)} in all: the group waits "
                "for nodes to be added")
    ours = _summed(g.needs() for g in cluster.groups() if not g.pending)
    said = f"the cluster has {', '.join(f'{free.get(k, 0.0):g} of {total[k]:g} {k}s' for k in kinds)} free"
    others = {k: total[k] - free.get(k, 0.0) - ours[k] for k in kinds}
    theirs = ", ".join(f"{v:g} {k}s" for k, v in others.items() if v > 0)
    mine = ", ".join(f"{ours[k]:g} {k}s" for k in kinds if ours[k] > 0)
    if theirs:
        return f"{said}; other jobs hold {theirs}" + (f", this sweep {mine}" if mine else "")
    return f"{said}; this sweep holds {mine}" if mine else said


class WaitWatcher:
    """Watches the sweep wait for resources (see the module doc).

    `sample` once, or `start` a thread that samples every `SAMPLE_S` until `stop`. `starts`: the warm pool's,
    None without one (a cold trial's wait is said and limited alike, but stays in its trial's time)."""

    def __init__(self, spec: SweepSpec, echo: Callable[[str], None], cluster: Cluster, starts: Starts | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = spec.budget.max_queue_s
        self.echo, self.cluster, self.starts, self.clock = echo, cluster, starts, clock
        self.over = ""  # why the sweep must stop: a wait longer than budget.max_queue_s, in words
        self._lock = threading.Lock()
        self._done_s = 0.0  # the waits that ended
        self._since: float | None = None  # the wait going on: the first sample that found a group pending...
        self._seen = 0.0  # ...and the last one
        self._said = 0  # lines said about it
        self._last: float | None = None  # the last sample
        self._pending: dict[int, int] = {}  # ranks -> the job's groups of that many ranks pending at the last sample
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def waited_s(self) -> float:
        """Seconds the sweep waited for resources, in all (wall time: waits of two groups at once count once)."""
        with self._lock:
            return self._done_s + (self._seen - self._since if self._since is not None else 0.0)

    def sample(self) -> None:
        now = self.clock()
        starting = self.starts.starting() if self.starts is not None else {}
        # a warm pool's groups wait only while they start: the table is read then (or always, without a pool)
        groups = self.cluster.groups() if starting or self.starts is None else []
        pending = [g for g in groups if g.pending]
        with self._lock:
            booked = self._book(starting, pending, now)
            waited = self._wait(bool(pending), now)
        for slot, seconds in booked:
            assert self.starts is not None
            self.starts.group_waited(slot, seconds)
        if waited is not None:
            self._say(pending, waited)

    def _book(self, starting: dict[int, tuple[float, int]], pending: list[Placement],
              now: float) -> list[tuple[int, float]]:
        """Each starting group's share of the time since the last sample: the oldest starting groups of n ranks,
        as many as the job had groups of n ranks pending at both samples."""
        counts = collections.Counter(len(g.bundles) for g in pending)
        dt = now - self._last if self._last is not None else 0.0
        booked = []
        for ranks, n in counts.items():
            both = min(n, self._pending.get(ranks, 0))
            oldest = sorted((since, slot) for slot, (since, r) in starting.items() if r == ranks)[:both]
            booked += [(slot, dt) for _, slot in oldest if dt > 0]
        self._pending, self._last = dict(counts), now
        return booked

    def _wait(self, pending: bool, now: float) -> float | None:
        """The wait going on, after this sample; None when there is none."""
        if pending:
            if self._since is None:
                self._since, self._said = now, 0
            self._seen = now
        elif self._since is not None and now - self._seen >= _SAME_WAIT_S:
            self._done_s += self._seen - self._since
            self._since = None
        return self._seen - self._since if pending and self._since is not None else None

    def _say(self, pending: list[Placement], waited: float) -> None:
        """The line due every LINE_EVERY_S of a wait, and the limit."""
        line = waited >= LINE_EVERY_S * (self._said + 1)
        limit = self.limit_s is not None and waited > self.limit_s and not self.over
        if not (line or limit):
            return
        more = f" and {len(pending) - 1} more" if len(pending) > 1 else ""
        what = f"{pending[0].said()}{more} ({holders_said(pending[0], self.cluster)})"
        if line:
            self._said = int(waited // LINE_EVERY_S)
            self.echo(f"waiting {waited:.0f} s for {what}")
        if limit:
            self.over = f"it waited longer than budget.max_queue_s ({self.limit_s:g} s) for {what}"

    def start(self, period_s: float = SAMPLE_S) -> WaitWatcher:
        self._thread = threading.Thread(target=self._run, args=(period_s,), name="sweep-waits", daemon=True)
        self._thread.start()
        return self

    def _run(self, period_s: float) -> None:
        while not self._stop.wait(period_s) and ray.is_initialized():
            try:
                self.sample()
            except Exception as exc:  # noqa: BLE001 - a sample missed only blurs the figures
                logger.debug("could not read what the sweep waits for: %s", exc)

    def stop(self) -> float:
        """Stop sampling; the sweep's waits in all."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            if self._since is not None:
                self._done_s += self._seen - self._since
                self._since = None
        return self.waited_s
