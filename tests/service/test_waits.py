"""A sweep waiting for resources other work holds, on fakes (a clock, this job's placement groups, what is free):
the line every 30 s, the wait booked apart from the warm group's start, and budget.max_queue_s."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

import sweeps.service.pool
from sweeps.service.controller import SweepController
from sweeps.service.pool import Queue
from sweeps.service.waits import Placement, WaitWatcher, free_for_sweep, holders_said
from sweeps.spec import parse_spec

SPEC = "name: w\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 2, num_steps: 2%s}\n"
TWO = ({"CPU": 1.0}, {"CPU": 1.0})  # a 2-rank group's bundles
SAID = "a worker group of 2 x {CPU: 1} (the cluster has 0 of 4 CPUs free; other jobs hold 4 CPUs)"


@dataclass
class FakeCluster:
    """This job's placement groups and what the cluster has free and in all, set by the test."""

    placed: list[Placement] = field(default_factory=list)
    available: dict[str, float] = field(default_factory=dict)
    all: dict[str, float] = field(default_factory=lambda: {"CPU": 4.0})
    reads: int = 0

    def groups(self) -> list[Placement]:
        self.reads += 1
        return list(self.placed)

    def free(self) -> dict[str, float]:
        return dict(self.available)

    def total(self) -> dict[str, float]:
        return dict(self.all)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _watch(limit: str = "", starts: Queue | None = None) -> tuple[WaitWatcher, FakeCluster, Clock, list[str]]:
    lines: list[str] = []
    cluster, clock = FakeCluster(), Clock()
    return WaitWatcher(parse_spec(SPEC % limit), lines.append, cluster, starts, clock), cluster, clock, lines


def _run(watcher: WaitWatcher, clock: Clock, seconds: int) -> None:
    for _ in range(seconds):
        clock.t += 1.0
        watcher.sample()


def test_a_waiting_group_is_said_every_30_s_and_its_wait_is_booked_apart_from_its_start(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    queue = Queue()
    watcher, cluster, clock, lines = _watch(starts=queue)
    monkeypatch.setattr(sweeps.service.pool, "time", SimpleNamespace(time=clock))  # the queue's clock is the test's
    watcher.sample()
    assert cluster.reads == 0  # no group starting: the table is not read
    queue.group_starting(0, (2, ""), "first")
    cluster.placed = [Placement(TWO, pending=True)]  # another job holds the 4 CPUs
    watcher.sample()  # t = 1000: the first sample that finds it pending
    _run(watcher, clock, 64)  # still pending at t = 1064
    assert lines == [f"waiting 30 s for {SAID}", f"waiting 60 s for {SAID}"]
    cluster.placed = [Placement(TWO, pending=False)]  # released: Ray places the group...
    _run(watcher, clock, 6)
    queue.take(0, 0.0, (2, ""))  # ...whose ranks are up 6 s later
    assert queue.group_starts() == [((2, ""), pytest.approx(6.0), "first")]  # 70 s from asking, 64 of them waiting
    assert queue.group_lives() == [((2, ""), pytest.approx(6.0), False)]  # it held its CPUs for 6 s, not 70
    assert watcher.waited_s == pytest.approx(64.0) and len(lines) == 2
    assert watcher.over == ""  # no budget.max_queue_s: it waits as long as it takes


def test_only_the_oldest_starting_groups_are_booked_for_what_the_job_has_pending(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    queue = Queue()
    watcher, cluster, clock, _ = _watch(starts=queue)
    monkeypatch.setattr(sweeps.service.pool, "time", SimpleNamespace(time=clock))
    queue.group_starting(1, (2, ""), "first")
    clock.t += 1
    queue.group_starting(0, (2, ""), "first")
    cluster.placed = [Placement(TWO, pending=False), Placement(TWO, pending=True)]  # one placed, one waits
    _run(watcher, clock, 10)
    queue.take(0, 0.0, (2, ""))
    queue.take(1, 0.0, (2, ""))
    starts = {round(s) for _, s, _ in queue.group_starts()}
    assert starts == {10, 2}  # slot 1, the older, is booked the 9 s both samples saw pending; slot 0 none


def test_a_wait_spans_ray_trains_new_ask_and_a_group_placed_within_a_sample_is_no_wait() -> None:
    watcher, cluster, clock, _ = _watch()  # cold trials: no pool, the table is read every sample
    cluster.placed = [Placement(TWO, pending=True)]
    _run(watcher, clock, 20)
    cluster.placed = []  # Ray Train's placement group timed out; it asks again 2 s later
    _run(watcher, clock, 2)
    cluster.placed = [Placement(TWO, pending=True)]
    _run(watcher, clock, 20)
    assert watcher.waited_s == pytest.approx(41.0)  # one wait: from the first sample that saw it to the last
    cluster.placed = [Placement(TWO, pending=False)]
    _run(watcher, clock, 15)  # 10 s with nothing pending ends it
    cluster.placed = [Placement(TWO, pending=False), Placement(TWO, pending=True)]
    _run(watcher, clock, 1)  # a group pending at one sample only
    cluster.placed = [Placement(TWO, pending=False)] * 2
    _run(watcher, clock, 12)
    assert watcher.stop() == pytest.approx(41.0)


def test_a_wait_longer_than_max_queue_s_halts_the_sweep_naming_the_limit_and_the_resources() -> None:
    watcher, cluster, clock, lines = _watch(", max_queue_s: 45")
    cluster.placed = [Placement(TWO, pending=True)]
    watcher.sample()
    _run(watcher, clock, 45)
    assert watcher.over == ""  # 45 s is not longer than the limit
    _run(watcher, clock, 1)
    assert watcher.over == f"it waited longer than budget.max_queue_s (45 s) for {SAID}"
    # the sweep's controller halts the sweep on Tune's next step, once its trials are out: resumable (exit 4)
    said: list[str] = []
    controller = SweepController(parse_spec(SPEC % ""), SPEC % "", said.append, None, None,  # type: ignore[arg-type]
                                 tune=SimpleNamespace(waits=watcher, queue=None))  # type: ignore[arg-type]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # no Tune listening: trials are stopped
    try:
        controller.callback.on_step_end(0, [])
        assert controller.halted == "" and said == []  # no trial out yet: a halt would end the sweep as finished
        controller._started.add("t1")
        controller.callback.on_step_end(1, [])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert controller.halted == watcher.over and controller.search.tripped == f"halted: {watcher.over}"
    assert said == [f"HALTING the sweep: {watcher.over}. Finished trials are kept; trials still running run again "
                    "when the sweep is resumed."]


def test_what_holds_the_resources_is_said_and_what_the_sweep_holds_counts_as_free_for_it() -> None:
    waiting = Placement(TWO, pending=True)
    cluster = FakeCluster([Placement(TWO, pending=False), waiting], {"CPU": 1.0}, {"CPU": 5.0, "GPU": 0.0})
    assert holders_said(waiting, cluster) == "the cluster has 1 of 5 CPUs free; other jobs hold 2 CPUs, this sweep 2 CPUs"
    cluster.available = {"CPU": 3.0}
    assert holders_said(waiting, cluster) == "the cluster has 3 of 5 CPUs free; this sweep holds 2 CPUs"
    assert free_for_sweep(cluster) == {"CPU": 5.0, "GPU": 0.0}
    gpus = Placement(({"CPU": 1.0, "GPU": 1.0},) * 4, pending=True)
    assert gpus.said() == "a worker group of 4 x {CPU: 1, GPU: 1}"
    assert holders_said(gpus, FakeCluster([gpus], {"CPU": 8.0}, {"CPU": 8.0, "GPU": 2.0})) == (
        "the cluster has 2 GPUs in all: the group waits for nodes to be added")


HOLDER = """\
import select, sys, ray
ray.init(address=sys.argv[1])
pg = ray.util.placement_group([{"CPU": 2.0}])
ray.get(pg.ready(), timeout=60)
print("held", flush=True)
select.select([sys.stdin], [], [], 90)  # until the test lets go (closes the pipe), 90 s at most
ray.util.remove_placement_group(pg)
"""

REAL = """\
name: waits
trainable: {{name: mlp-tabular, params: {{num_train_rows: 256}}}}
budget: {{num_trials: 1, num_steps: 6, num_warmup_steps: 2, report_interval_s: 0.01}}
scaling: {{num_workers: 1, cpus_per_worker: 1}}
telemetry: {{period_s: 0}}
tracking: {{uri: "sqlite:///{db}"}}
storage_path: {storage}
"""


def test_a_sweep_says_it_waits_while_another_job_holds_the_cluster_and_counts_the_wait_apart(
        ray_cluster: None, tmp_path: Path, new_store: Callable[[Path], Path]) -> None:
    """Another job (a process of its own) holds both of the session cluster's CPUs, and lets go once the sweep
    said it waits (30 s into the wait)."""
    import ray

    from sweeps.service.runner import run_sweep
    from sweeps.service.waits import job_groups

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, ray.get_runtime_context().gcs_address],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert holder.stdin is not None and holder.stdout is not None
    lines: list[str] = []
    said_at: dict[str, float] = {}

    def echo(line: str) -> None:
        lines.append(line)
        said_at[line] = time.monotonic()
        if line.startswith("waiting ") and not holder.stdin.closed:  # type: ignore[union-attr]
            holder.stdin.close()  # type: ignore[union-attr]

    try:
        assert holder.stdout.readline().strip() == "held"
        assert job_groups(ray.get_runtime_context().get_job_id()) == []  # the other job's group is not this one's
        text = REAL.format(db=new_store(tmp_path / "mlflow.db"), storage=tmp_path / "results")
        t0 = time.monotonic()
        outcome = run_sweep(parse_spec(text), text, echo=echo)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert [t.status for t in outcome.trials] == ["ok"], lines
    assert any("0 fit in what is free now (0 of 2 CPU free); running 1 — other work holds the rest" in line
               for line in lines), lines
    said = [line for line in lines if line.startswith("waiting ")]  # the first at 30 s (a sample late under load)
    assert said and re.fullmatch(r"waiting 3[0-5] s for a worker group of 1 x \{CPU: 1\} \(the cluster has 0 of 2 "
                                 r"CPUs free; other jobs hold 2 CPUs\)", said[0]), lines
    overhead = next(line for line in lines if line.startswith("warm worker groups"))
    first = float(re.search(r"\(the first ([\d.]+) s\)", overhead)[1])  # type: ignore[index]
    waited = float(re.search(r"\+ waiting ([\d.]+) s for resources other work held \+ the service's own",
                             overhead)[1])  # type: ignore[index]
    planned = next(line for line in lines if line.startswith("planned: "))  # said once the group took its trial
    assert f"x {first:.1f} s (the first one here)" in planned, planned
    # the group's start and its wait add up to no more than the time from the sweep's call to the group's first
    # trial: a start that still held the wait (as before) would count its 30 s twice
    assert waited >= 29 and first + waited <= said_at[planned] - t0 + 1.0, (overhead, said_at[planned] - t0)
