"""Trial failure classification from the exceptions Ray Train hands the driver."""

from __future__ import annotations

import pickle

import pytest

from sweeps.failures import TrialFailure, classify, failure_of, signature
from trainables.errors import DivergedError, UnsupportedError


class OutOfMemoryError(RuntimeError):  # stands in for torch.OutOfMemoryError (matched by name)
    pass


class FakeWorkerGroupError(RuntimeError):
    def __init__(self, failures: dict[int, BaseException]) -> None:
        super().__init__("Training failed due to worker errors")
        self.worker_failures = failures


@pytest.mark.parametrize(
    "failures,kind,reason",
    [
        ({0: UnsupportedError("tf32 is a GPU format"), 1: UnsupportedError("tf32 is a GPU format")}, "unsupported", "rank 0: UnsupportedError: tf32"),
        ({1: OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")}, "oom", "rank 1: OutOfMemoryError: CUDA out of memory"),
        ({0: DivergedError("training loss became nan")}, "diverged", "rank 0: DivergedError"),
        ({0: ValueError("boom\nlong traceback")}, "error", "rank 0: ValueError: boom"),
        ({0: OSError(28, "No space left on device")}, "disk_full", "rank 0: OSError: [Errno 28] No space left on device"),
        ({1: OSError(122, "Disk quota exceeded")}, "disk_full", "rank 1: OSError: [Errno 122] Disk quota exceeded"),
        # an error that says so only in its message (no errno), e.g. from a storage library
        ({0: OSError("Failed to write file: No space left on device")}, "disk_full", "rank 0: OSError: Failed"),
    ],
)
def test_classify_worker_group_errors(failures: dict[int, BaseException], kind: str, reason: str) -> None:
    got_kind, got_reason = classify(FakeWorkerGroupError(failures))
    assert got_kind == kind
    assert got_reason.startswith(reason) and "\n" not in got_reason


def test_specific_kind_wins_over_generic_on_any_rank() -> None:
    kind, reason = classify(FakeWorkerGroupError({0: ValueError("peer gone"), 1: OutOfMemoryError("oom")}))
    assert (kind, reason.split(":")[0]) == ("oom", "rank 1")


def test_trial_failure_survives_pickling_and_is_found_in_a_chain() -> None:
    failure = pickle.loads(pickle.dumps(TrialFailure("unsupported", "rank 0: tf32")))
    assert (failure.kind, failure.reason) == ("unsupported", "rank 0: tf32")
    try:
        try:
            raise failure
        except TrialFailure as inner:
            raise RuntimeError("wrapped by Ray") from inner
    except RuntimeError as outer:
        assert failure_of(outer) == ("unsupported", "rank 0: tf32")
    assert failure_of(None)[0] == "error"


def test_same_error_on_another_rank_is_the_same_failure_for_the_breaker() -> None:
    # Which rank's error Ray Train collects first varies with timing (seen on a slower CI machine).
    a = classify(FakeWorkerGroupError({0: ImportError("no module x")}))
    b = classify(FakeWorkerGroupError({1: ImportError("no module x")}))
    assert a != b and signature(*a) == signature(*b)
    assert signature(*a) != signature(*classify(FakeWorkerGroupError({0: ImportError("no module y")})))
