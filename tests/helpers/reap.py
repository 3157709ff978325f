"""Stopping a Ray cluster a test started, through its own handle, and then its own process tree.

Ray's shutdown stops the node processes (gcs, raylet, ...); their worker processes are meant to
exit when they see their raylet gone. One CI run in several left a `ray::TrainController` worker
running a minute after its cluster had stopped. So each cluster-owning fixture lists the processes
below its own nodes just before it shuts them down, waits for them after, and kills only those that
outlive the wait, saying so (never a pattern match over the machine's processes).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Iterable

import psutil

# Each pytest process (`make test` runs two) tags what it starts: the Ray processes, torchrun groups and
# doctor checks inherit this variable, set to that pytest process's pid (tests/conftest.py).
TAG = "SWEEPS_TEST_SESSION"


def started_here(p: psutil.Process) -> bool:
    """Started by this process or below it: the nearest of `p` and its ancestors whose environment can
    be read carries this process's tag. An environment that setproctitle rewrote (Ray's agents: psutil
    reads it empty) defers to the parent; one without the tag was started by someone else. A process
    that cannot be read, or an orphan no tagged ancestor owns, counts as ours: a check then errs on the
    side of a leak reported."""
    mine = os.environ.get(TAG)
    q: psutil.Process | None = p
    while q is not None and q.pid > 1:
        if q.pid == os.getpid():  # our own /proc environ is the one we started with, not os.environ
            return True
        try:
            env = q.environ()
            if TAG in env:
                return env[TAG] == mine
            if env:
                return False
            q = q.parent()
        except psutil.Error:
            return True
    return True


def tree(roots: Iterable[int]) -> list[psutil.Process]:
    """The processes below `roots` (and the roots), as handles that remember their start time."""
    found: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                found[p.pid] = p
        except psutil.Error:
            continue
    return list(found.values())


def _running(p: psutil.Process) -> bool:
    """Still running: a zombie has exited (nobody may reap an orphan's in a container without init)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def reap(procs: list[psutil.Process], grace_s: float, what: str) -> list[str]:
    """Wait up to `grace_s` for `procs` to exit; kill the ones still running; return what was killed
    (also said on stderr and as a warning, so a test log shows it)."""
    deadline = time.monotonic() + grace_s
    while (alive := [p for p in procs if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    killed = []
    for p in alive:
        try:
            name = " ".join(p.cmdline())[:80]
            p.kill()
            killed.append(f"{p.pid} {name}")
        except psutil.Error:
            continue
    if killed:  # said twice: a subprocess's stderr reaches its test's output, a warning pytest's summary
        said = f"{what}: {len(killed)} process(es) outlived the cluster's shutdown by {grace_s:.0f} s and were killed: {killed}"
        print(said, file=sys.stderr, flush=True)
        warnings.warn(said, stacklevel=2)
    return killed


def ray_node_pids() -> list[int]:
    """The node processes (gcs, raylet, ...) this process's `ray.init()` started, if it started any."""
    from ray._private import worker

    node = getattr(worker, "_global_node", None)
    if node is None:
        return []
    pids = []
    for infos in node.all_processes.values():
        pids += [info.process.pid for info in infos if info.process is not None and info.process.poll() is None]
    return pids
