"""The warm pool's queue protocol on its own (no Ray): when a group may serve again, and who is
charged when a group dies."""

from __future__ import annotations

import threading

import torch

from sweeps.pool import Queue
from trainables.errors import WorkloadError


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
