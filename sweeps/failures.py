"""Classify why a trial failed, from the exceptions its workers raised.

Kinds: ``unsupported`` (hardware cannot run the config), ``oom`` (device or host memory),
``diverged`` (NaN/inf loss), ``crash`` (a worker process died), ``error`` (anything else).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from trainables.errors import DivergedError, UnsupportedError, WorkloadError

KINDS: tuple[str, ...] = ("unsupported", "oom", "diverged", "config", "dataloader", "crash", "error")  # crash: transient
_LOADER_HINT = (" — a dataloader worker died or hung: give the container more shared memory (docker --shm-size, "
                "/dev/shm), lower num_dataloader_workers or prefetch_factor, or check the dataset's __getitem__")
_OOM_NAMES = {"OutOfMemoryError", "MemoryError"}  # torch.OutOfMemoryError, ray's, Python's
# A worker process or its node went away: transient, worth one more attempt elsewhere.
_CRASH_NAMES = {"ActorDiedError", "RayActorError", "WorkerCrashedError", "ActorUnavailableError", "NodeDiedError",
                "WorkerHealthCheckFailedError", "WorkerHealthCheckTimeoutError", "ActorPlacementGroupRemoved"}
TRANSIENT_KINDS = ("crash",)


class TrialFailure(RuntimeError):
    """Raised by the trial driver so Tune marks the trial errored; carries the kind."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (TrialFailure, (self.kind, self.reason))


def _leaves(exc: BaseException, rank: int | None = None) -> Iterator[tuple[int | None, BaseException]]:
    failures = getattr(exc, "worker_failures", None)  # ray.train.WorkerGroupError
    if isinstance(failures, dict) and failures:
        for r, e in sorted(failures.items()):
            yield from _leaves(e, r)
        return
    yield rank, exc
    cause = getattr(exc, "cause", None) or exc.__cause__  # RayTaskError keeps .cause
    if isinstance(cause, BaseException) and cause is not exc:
        yield from _leaves(cause, rank)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def classify(exc: BaseException) -> tuple[str, str]:
    """(kind, one-line reason naming the rank) for a failed `TorchTrainer.fit()`."""
    leaves = list(_leaves(exc))
    rules = (
        ("unsupported", lambda e: isinstance(e, UnsupportedError)),
        ("config", lambda e: isinstance(e, WorkloadError)),
        ("oom", lambda e: type(e).__name__ in _OOM_NAMES),
        ("diverged", lambda e: isinstance(e, DivergedError)),
        ("dataloader", lambda e: "DataLoader worker" in str(e) or "DataLoader timed out" in str(e)),
        ("crash", lambda e: type(e).__name__ in _CRASH_NAMES),
    )
    for kind, match in rules:
        for rank, e in leaves:
            if match(e):
                where = f"rank {rank}: " if rank is not None else ""
                return kind, f"{where}{type(e).__name__}: {_first_line(e)}" + (_LOADER_HINT if kind == "dataloader" else "")
    rank, e = leaves[-1] if len(leaves) > 1 and leaves[0][0] is not None else leaves[0]
    where = f"rank {rank}: " if rank is not None else ""
    return "error", f"{where}{type(e).__name__}: {_first_line(e)}"


_RANK_PREFIX = re.compile(r"^rank \d+: ")


def signature(kind: str, reason: str) -> tuple[str, str]:
    """What makes two failures "the same" for the circuit breaker: the kind and the error,
    not which rank happened to report it first."""
    return kind, _RANK_PREFIX.sub("", reason)


def failure_of(error: BaseException | None) -> tuple[str, str]:
    """Kind and reason of an errored Tune trial's stored exception."""
    if error is None:
        return "error", "the trial failed without a stored error"
    for _, e in _leaves(error):
        if isinstance(e, TrialFailure):
            return e.kind, e.reason
    return classify(error)
