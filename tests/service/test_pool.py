"""The warm pool's queue protocol on its own (no Ray): when a group may serve again, and who is
charged when a group dies."""

from __future__ import annotations

import threading

import torch

from sweeps.service.pool import Queue
from trainables.loop_errors import WorkloadError


def _ranks_done(q: Queue, outcomes: list[tuple[BaseException | None, bool, str]]) -> list[bool]:
    kept: list[bool] = [False] * len(outcomes)

    def rank(r: int) -> None:
        error, clean, where = outcomes[r]
        kept[r] = q.rank_done("t", r, len(outcomes), error, clean, where)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(outcomes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return kept


def test_a_group_is_kept_only_when_every_rank_ended_cleanly_at_the_same_point() -> None:
    oom = torch.OutOfMemoryError("CUDA out of memory")
    q = Queue()
    q.submit("t", {}, None, "/tmp")
    assert _ranks_done(q, [(oom, True, "('step', 0, 0)"), (oom, True, "('step', 0, 0)")]) == [True, True]
    assert q.events("t", 0, 0)[0] == {"failed": {0: oom, 1: oom}, "retired": False}  # posted at once
    q = Queue()
    q.submit("t", {}, None, "/tmp")
    stream = WorkloadError("the training IterableDataset ended after 3 batches")
    # the same clean error, at different steps: NCCL may have an all-reduce queued on one rank only
    assert _ranks_done(q, [(stream, True, "('step', 3, 0)"), (stream, True, "('step', 4, 0)")]) == [False, False]
    assert q.events("t", 0, 0) == []  # a retiring group's failure comes from its supervisor, whole
    q = Queue()
    q.submit("t", {}, None, "/tmp")
    assert _ranks_done(q, [(RuntimeError("connection reset"), False, "('step', 5, 0)"), (None, True, "None")])[0] is False


def test_a_group_that_dies_before_taking_a_trial_charges_the_next_waiting_one() -> None:
    q = Queue()
    q.submit("a", {}, None, "/tmp")
    q.submit("b", {}, None, "/tmp")
    q.group_failed(0, RuntimeError("NCCL error: unhandled system error"))
    [event] = q.events("a", 0, 0)
    assert event["retired"] and isinstance(event["failed"][None], RuntimeError)
    assert q.take(0, 0)[0] == "b" and q.events("b", 0, 0) == []


def test_a_trials_cost_begins_when_a_group_took_it_only_if_it_waited_for_one_and_ends_at_its_final_report(
        monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import sweeps.service.pool

    # submit 1, take 1 (the group came up), final report 1, submit 2, take 2
    clock = iter([100.0, 150.0, 157.0, 200.0, 260.0])
    monkeypatch.setattr(sweeps.service.pool.time, "time", lambda: next(clock))
    q = Queue()
    q.submit("first", {}, None, "/tmp")  # no group is waiting yet: the first trial waits for one to start
    assert q.take(0, 1.0)[0] == "first"
    assert q.span("first") == (150.0, None)  # the group's start-up is the sweep's, not the trial's
    q.post("first", {"metrics": {"progress/steps": 3}})  # a progress report ends nothing (and reads no clock)
    q.post("first", {"metrics": {"progress/final": 1}})
    assert q.span("first") == (150.0, 157.0)  # its way on to the driver is not the trial's cost either
    taken: list[object] = []
    waiting = threading.Thread(target=lambda: taken.append(q.take(0, 10.0)))
    waiting.start()  # the group waits in take() when the next trial comes
    for _ in range(200):
        if q._idle:
            break
        threading.Event().wait(0.01)
    q.submit("second", {}, None, "/tmp")
    waiting.join(timeout=10)
    assert taken and taken[0][0] == "second"  # type: ignore[index]
    assert q.span("second") == (200.0, None)  # a group was waiting: its cost begins at its submission
