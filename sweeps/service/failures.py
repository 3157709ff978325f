"""Classify why a trial failed, from the exceptions its workers raised.

Kinds: ``unsupported`` (hardware cannot run the config), ``oom`` (device or host memory),
``diverged`` (NaN/inf loss), ``disk_full`` (ENOSPC / quota), ``config`` (bad workload params),
``dataloader`` (a loader worker died or hung), ``crash`` (a worker process died), ``error``
(anything else).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

from sweeps.results.outcome import at_word
from trainables.loop_errors import DivergedError, UnsupportedError, WorkloadError
from trainables.storage import Storage

# Each kind, what it means and what follows (the documentation's exit-codes page is generated from this).
KIND_MEANING: dict[str, str] = {
    "unsupported": "the hardware cannot run the configuration (e.g. bf16 or fp16 where the device has no support); "
                   "not retried",
    "oom": "device or host memory ran out; the larger batches that would follow at the same settings are pruned",
    "diverged": "the loss became NaN or inf (a learning rate too high for the batch, fp16 without enough range)",
    "disk_full": "the disk is full (ENOSPC or quota): the sweep halts, keeping this trial to run again on resume",
    "config": "the workload refused its params, or a finished trial lacks a metric the objective names",
    "dataloader": "a dataloader worker died or hung (often too little shared memory)",
    "crash": "a worker process or its node went away: retried in place (`budget.max_retries` times), from its last "
             "checkpoint",
    "error": "anything else: the rank that raised it, its type and its whole message are in `sweep.failure_reason`",
}
_LOADER_HINT = (" — a dataloader worker died or hung: give the container more shared memory (docker --shm-size, "
                "/dev/shm), lower num_dataloader_workers or prefetch_factor, or check the dataset's __getitem__")
# Every form an out-of-memory failure takes, matched against "<type name>: <whole message>" (NCCL puts the
# cause under "Last error:", lines below the first). Each entry is specific on purpose: an oom verdict
# prunes the larger batches that follow (search.record_oom), so a misread error costs real configurations.
# Not here: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE (the workspace *passed* is smaller than the algorithm wants,
# a size mismatch, not a failed allocation: torch allocates the workspace itself and raises
# torch.OutOfMemoryError when that fails), CUDNN_STATUS_INTERNAL_ERROR, Triton's "out of resource: shared
# memory" (a kernel config), NCCL's "ibv_* failed ... Cannot allocate memory" (locked-memory ulimit) and
# "/dev/shm" segment errors (shared-memory size): none of them is fixed by a smaller batch.
_OOM_FORMS: tuple[tuple[str, str], ...] = (
    (r"^OutOfMemoryError: ", "torch.OutOfMemoryError (CUDA/HIP/MPS/XPU allocators), Ray's memory monitor"),
    (r"\b(CUDA|HIP|XPU|MPS backend) out of memory", "the caching allocator's text, also when raised as RuntimeError"),
    (r"\b(CUDA|HIP)( driver)? error: out of memory", "cudaErrorMemoryAllocation from a launch, context or driver call"),
    (r"\bCUDA_ERROR_OUT_OF_MEMORY\b|\bcudaErrorMemoryAllocation\b|Triton Error \[CUDA\]: out of memory",
     "the driver's / runtime's name for it (Triton, NVRTC, raw driver calls)"),
    (r"\bDefaultCPUAllocator: (can't allocate memory|not enough memory)", "host memory: torch's CPU allocator"),
    (r"\b(CUBLAS|CUSOLVER|CUSPARSE)_STATUS_ALLOC_FAILED\b|\bCUFFT_ALLOC_FAILED\b",
     "a CUDA math library could not allocate its handle or workspace (cublasCreate ...)"),
    (r"\bCUDNN_STATUS_(ALLOC_FAILED|INTERNAL_ERROR_(HOST|DEVICE)_ALLOCATION_FAILED)\b", "cuDNN < 9 and >= 9 names"),
    (r"\b(Cuda|HIP) failure (\d+ )?'out of memory'",
     "NCCL/RCCL: ncclUnhandledCudaError ... Last error: Cuda failure 2 'out of memory'"),
    (r"\bFailed to CUDA calloc\b", "NCCL/RCCL: its communication buffers did not fit (ncclCudaCalloc)"),
)
_OOM = re.compile("|".join(f"(?:{pattern})" for pattern, _ in _OOM_FORMS))


def _oom(e: BaseException) -> bool:
    # Python's MemoryError by class: numpy raises a subclass of it (_ArrayMemoryError)
    return isinstance(e, MemoryError) or _OOM.search(f"{type(e).__name__}: {e}") is not None


# A worker process or its node went away: transient, worth one more attempt elsewhere.
_CRASH_NAMES = {"ActorDiedError", "RayActorError", "WorkerCrashedError", "ActorUnavailableError", "NodeDiedError",
                "WorkerHealthCheckFailedError", "WorkerHealthCheckTimeoutError", "ActorPlacementGroupRemoved"}
TRANSIENT_KINDS = ("crash",)  # retried in place (from the trial's last checkpoint)
# What a rank left in a collective reads when its peer's process went away (the socket closed under it):
# gloo's read of a reset or closed connection, NCCL's remote-process check. Alone (no rank's own error
# collected: Ray Train had not yet seen the peer die, as on a loaded machine), that is a crash. A timeout is
# not in it: a hung peer is no crash, and nothing says another attempt would not hang again.
# Their own wording only: a user's HTTP call reset by its server ("[Errno 104] Connection reset by peer") is no
# sign of a peer rank.
_PEER_GONE = re.compile(r"gloo/transport/tcp/\S+\] .*Connection (?:reset|closed) by peer"
                        r"|remote process exited or there was a network error")
# Say nothing about the configuration and would hit every trial that follows: the sweep halts,
# keeping this trial (and its checkpoint) to run again when it is resumed.
HALT_KINDS = ("disk_full",)
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_DISK_HINT = (" — the disk is full: free space on it (old sweeps under storage_path, Ray's session logs under "
              "/tmp/ray) or move storage_path to a bigger disk")
_HINTS = {"dataloader": _LOADER_HINT, "disk_full": _DISK_HINT}


def _disk_full(e: BaseException) -> bool:
    text = str(e)
    return getattr(e, "errno", None) in _DISK_ERRNOS or "No space left on device" in text or "Disk quota exceeded" in text


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


# torch re-raises an error from a DataLoader worker's __getitem__ as "Caught <Type> in DataLoader worker
# process N.\nOriginal Traceback ...": the dataset's own error, not the loader's (no shared-memory hint).
_CAUGHT = re.compile(r"Caught (\w+) in DataLoader worker process (\d+)")


def _loader_died(exc: BaseException) -> bool:
    """A loader worker process died (killed, exited) or hung past the loader timeout."""
    text = str(exc)
    return not _CAUGHT.search(text) and ("DataLoader worker" in text or "DataLoader timed out" in text)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if caught := _CAUGHT.search(text):  # the original error is the traceback's last line
        last = [line.strip() for line in text.splitlines() if line.strip()][-1]
        last = last.removeprefix(f"{caught[1]}:").strip() or last
        return f"{at_word(last, 1000)} (raised by the dataset in DataLoader worker process {caught[2]})"
    return at_word(text.splitlines()[0], 2000)  # whole, as a rule: tables shorten it at a word, MLflow keeps it


def classify(exc: BaseException) -> tuple[str, str]:
    """(kind, one-line reason naming the rank) for a failed `TorchTrainer.fit()`."""
    leaves = list(_leaves(exc))
    rules = (
        ("unsupported", lambda e: isinstance(e, UnsupportedError)),
        ("config", lambda e: isinstance(e, WorkloadError)),
        # Before the rest: the ranks an OOM leaves waiting in a collective fail too (connection reset,
        # timeout, aborted communicator), and whichever rank Ray Train lists first, the cause is the OOM.
        ("oom", _oom),
        ("diverged", lambda e: isinstance(e, DivergedError)),
        ("disk_full", _disk_full),
        ("dataloader", _loader_died),
        # the dataset's own error in a loader worker wins over its peers' (a collective left waiting)
        ("error", lambda e: _CAUGHT.search(str(e)) is not None),
        ("crash", lambda e: type(e).__name__ in _CRASH_NAMES),
    )
    for kind, match in rules:
        for rank, e in leaves:
            if match(e):
                return kind, _named(rank, e) + _HINTS.get(kind, "")
    if all(_PEER_GONE.search(str(e)) for _, e in leaves):  # every rank heard of, only as left behind by a peer
        return "crash", _named(*leaves[0]) + " (a peer's process went away)"
    return "error", _named(*(leaves[-1] if len(leaves) > 1 and leaves[0][0] is not None else leaves[0]))


def _named(rank: int | None, e: BaseException) -> str:
    """A failure's reason: the rank that raised it (where known), its type and its first line."""
    where = "" if rank is None else f"rank {rank}: "
    return f"{where}{type(e).__name__}: {_first_line(e)}"


_RANK_PREFIX = re.compile(r"^rank \d+: ")
_PEER_ADDRESS = re.compile(r"\[[^\]\s]*\]:\d+")  # gloo's "[127.0.0.1]:31655": another port every trial


def signature(kind: str, reason: str) -> tuple[str, str]:
    """Return what makes two failures "the same" for the circuit breaker: the kind and the error.

    Not which rank happened to report it first, nor the port its peer had."""
    return kind, _PEER_ADDRESS.sub("[peer]", _RANK_PREFIX.sub("", reason))


def failure_of(error: BaseException | None) -> tuple[str, str]:
    """Kind and reason of an errored Tune trial's stored exception."""
    if error is None:
        return "error", "the trial failed without a stored error"
    for _, e in _leaves(error):
        if isinstance(e, TrialFailure):
            return e.kind, e.reason
    return classify(error)


# Ray Tune logs each failed trial's whole traceback (~35 lines) on the console under this logger; the sweep's
# own progress line already says the trial failed and why, in one line (issue 50, item 9).
TUNE_FAILURE_LOGGER = "ray.tune.execution.tune_controller"


class TracebacksToFile(logging.Filter):
    """Move Ray Tune's "Trial task failed" tracebacks off the console into the sweep's own log.

    The log is the file `key` of `st` (a local folder or a URI: `trainables.storage`). Every other record of the logger passes unchanged."""

    def __init__(self, st: Storage, key: str) -> None:
        super().__init__()
        self.st, self.key, self.written = st, key, 0
        self.shown = st.child(key)  # the file, as it may be printed

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Trial task failed"):
            return True
        text = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {record.getMessage()}\n"
        if record.exc_info:
            text += "".join(traceback.format_exception(*record.exc_info)) + "\n"
        try:
            self.st.append_text(self.key, text)
        except OSError:  # nowhere to keep it (a StorageError too): the console keeps it rather than lose it
            return True
        self.written += 1
        return False


@contextlib.contextmanager
def tracebacks_to(st: Storage | Path, key: str = "") -> Iterator[TracebacksToFile]:
    """Send each failed trial's Tune traceback, while inside, to the sweep's log instead of the console.

    The log is the file `key` of `st`, or the file `st` (a local path)."""
    tune_logger = logging.getLogger(TUNE_FAILURE_LOGGER)
    moved = TracebacksToFile(st, key) if isinstance(st, Storage) else TracebacksToFile(Storage(str(st.parent)), st.name)
    tune_logger.addFilter(moved)
    try:
        yield moved
    finally:
        tune_logger.removeFilter(moved)
