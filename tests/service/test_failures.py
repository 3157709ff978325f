"""Trial failure classification from the exceptions Ray Train hands the driver."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from sweeps.service.failures import TrialFailure, classify, failure_of, signature
from trainables.loop_errors import DivergedError, UnsupportedError


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


class _BadItem:
    """A dataset whose items cannot be decoded: the user's error, raised inside a loader worker."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        raise KeyError(f"no label for item {i}")


def test_a_datasets_own_error_out_of_a_loader_worker_is_the_users_not_the_loaders() -> None:
    import torch.utils.data as tud

    with pytest.raises(KeyError) as info:  # torch re-raises it as the same type, traceback as text
        next(iter(tud.DataLoader(_BadItem(), num_workers=1)))
    kind, reason = classify(FakeWorkerGroupError({1: info.value}))
    assert kind == "error", reason
    assert reason == "rank 1: KeyError: 'no label for item 0' (raised by the dataset in DataLoader worker process 0)", reason
    assert "shared memory" not in reason and "\n" not in reason
    # ...also when its peer failed too, waiting in a collective for it
    peer = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    assert classify(FakeWorkerGroupError({0: peer, 1: info.value})) == (kind, reason)
    # a loader worker that died or hung is still the loader's
    died = RuntimeError("DataLoader worker (pid(s) 4242) exited unexpectedly")
    assert classify(FakeWorkerGroupError({0: died}))[0] == "dataloader"
    assert classify(FakeWorkerGroupError({0: RuntimeError("DataLoader timed out after 3 seconds")}))[0] == "dataloader"


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


_NCCL = ("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with "
         "NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function failed.\n"
         "Last error:\n")


@pytest.mark.parametrize(
    "exc,oom",
    [
        (OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB"),
         True),
        (MemoryError(), True),
        (type("_ArrayMemoryError", (MemoryError,), {})("Unable to allocate 1.00 TiB for an array"), True),  # numpy
        (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity)"), True),
        (RuntimeError("HIP out of memory. Tried to allocate 1.00 GiB"), True),
        (RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.00 GB)"), True),
        (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"), True),
        (RuntimeError("CUDA driver error: out of memory"), True),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                      "tried to allocate 1152921504606846976 bytes. Error code 12 (Cannot allocate memory)"), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
        (RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"), True),
        (RuntimeError(_NCCL + "Cuda failure 'out of memory'"), True),  # NCCL < 2.19
        (RuntimeError(_NCCL + "Cuda failure 2 'out of memory'"), True),
        (RuntimeError(_NCCL + "Failed to CUDA calloc async 2432 bytes"), True),
        # look-alikes: a smaller batch fixes none of them
        (RuntimeError("cuDNN error: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE"), False),
        (RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"), False),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
        (RuntimeError(_NCCL + "Cuda failure 1 'invalid argument'"), False),
        (RuntimeError("NCCL error: unhandled system error, NCCL version 2.21.5\nncclSystemError: System call (e.g. "
                      "socket, malloc) or external library call failed or device error.\nLast error:\nCall to "
                      "ibv_create_cq failed with error Cannot allocate memory"), False),  # locked-memory ulimit
        (RuntimeError("out of resource: shared memory, Required: 98304, Hardware limit: 65536. Reducing block sizes "
                      "or `num_stages` may help."), False),  # Triton kernel config
        (RuntimeError("NCCL error: unhandled system error\nLast error:\nError while creating shared memory segment "
                      "/dev/shm/nccl-vzIpS6 (size 9637888)"), False),  # --shm-size
    ],
)
def test_out_of_memory_in_each_form_it_takes(exc: BaseException, oom: bool) -> None:
    kind, reason = classify(FakeWorkerGroupError({0: exc}))
    assert (kind == "oom") is oom, reason
    assert kind in ("oom", "error")


def _gloo_rank(rank: int, port: int, errors: Any, ready: Any, done: Any, peer_exits: bool) -> None:
    """One rank of a 2-rank gloo group: rank 1 runs out of memory, rank 0 waits for it in all_reduce."""
    import torch
    import torch.distributed as dist

    ready.wait(60)  # both have imported torch: the short timeout below is not spent on a slow start
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=timedelta(seconds=2))
        if rank == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity "
                                         "of 79.10 GiB of which 1.06 GiB is free.")
        dist.all_reduce(torch.ones(4))
    except Exception as exc:
        errors.put((rank, exc))
        if not peer_exits:  # hold the group open, as a live Ray Train actor would, until rank 0 has timed out
            done.wait(30)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("peer_exits", [True, False], ids=["peer-exits", "peer-hangs"])
def test_oom_on_one_rank_while_the_other_waits_in_a_collective(peer_exits: bool) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    errors, ready, done = ctx.Queue(), ctx.Barrier(2), ctx.Event()
    procs = [ctx.Process(target=_gloo_rank, args=(r, port, errors, ready, done, peer_exits), daemon=True)
             for r in (0, 1)]
    try:
        for p in procs:
            p.start()
        got = dict(errors.get(timeout=60) for _ in range(2))
        done.set()
        for p in procs:
            p.join(30)
        assert [p.exitcode for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        errors.close()
        errors.join_thread()
    waiting = got[0]  # what the waiting rank really sees: connection reset by peer, or a gloo timeout
    # alone, it is what it says: a peer's process went away (a crash, retried), or a timeout (an error)
    alone = "error" if "Timed out" in str(waiting) or not peer_exits else "crash"
    assert type(got[1]).__name__ == "OutOfMemoryError" and classify(FakeWorkerGroupError({0: waiting}))[0] == alone
    for failures in ({0: waiting, 1: got[1]}, {0: got[1], 1: waiting}):  # whichever rank is listed first
        kind, reason = classify(FakeWorkerGroupError(failures))
        assert kind == "oom" and "OutOfMemoryError: CUDA out of memory" in reason, (reason, str(waiting))


def test_a_loader_worker_dying_mid_hand_over_reads_as_the_loader_failure_it_is() -> None:
    """A worker that dies while handing a batch over through shared memory can surface as the hand-over's
    connection reset (seen on a loaded 2-core machine) instead of torch's "DataLoader worker ... exited"."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    from trainables.loader import handed_over as _handed_over

    class Resets(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.zeros(2)

    class ResetLoader(DataLoader):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            yield torch.zeros(1, 2)
            raise ConnectionResetError(104, "Connection reset by peer")

    batches = _handed_over(ResetLoader(Resets(), batch_size=1, num_workers=1))
    assert next(batches).shape == (1, 2)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid\(s\) .*\) died handing over a batch") as info:
        next(batches)
    assert classify(info.value)[0] == "dataloader"
    with pytest.raises(ConnectionResetError):  # in-process loading has no hand-over: not a loader's death
        list(_handed_over(ResetLoader(Resets(), batch_size=1, num_workers=0)))


_RESET = ("Got the following error when running the callback: RuntimeError: [../third_party/gloo/gloo/transport/tcp/"
          "pair.cc:537] Read error [127.0.0.1]:31655: Connection reset by peer. This is typically caused by a remote "
          "worker having exited")


def test_a_peer_gone_alone_is_a_crash_but_never_hides_a_ranks_own_error() -> None:
    """Rank 1 crashed (os._exit) and Ray Train collected only rank 0's read of the reset connection: seen
    on a loaded 2-core machine, where the crashed trial then ended `error`, not retried."""
    reset = RuntimeError(_RESET)
    kind, reason = classify(FakeWorkerGroupError({0: reset}))
    assert kind == "crash" and reason.startswith("rank 0: RuntimeError: ") and reason.endswith("(a peer's process went away)")
    assert classify(FakeWorkerGroupError({0: reset, 1: reset}))[0] == "crash"
    nccl = RuntimeError("NCCL error: remote process exited or there was a network error, NCCL version 2.21.5")
    closed = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.7]:4411")
    assert classify(FakeWorkerGroupError({0: nccl}))[0] == classify(FakeWorkerGroupError({1: closed}))[0] == "crash"
    assert classify(reset) == ("crash", f"RuntimeError: {_RESET} (a peer's process went away)")  # no rank named
    # the same death on the next trial (another port) is the same failure for the circuit breaker
    other = RuntimeError(_RESET.replace("31655", "40127"))
    assert signature(*classify(FakeWorkerGroupError({0: reset}))) == signature(*classify(FakeWorkerGroupError({1: other})))
    # a user's own call reset by its server is its error, not a peer's death
    assert classify(FakeWorkerGroupError({0: ConnectionResetError(104, "Connection reset by peer")}))[0] == "error"
    # a rank's own error, generic or specific, is the failure; its peer's reset only a consequence
    assert classify(FakeWorkerGroupError({0: reset, 1: ValueError("bad label 7")})) == ("error", "rank 1: ValueError: bad label 7")
    assert classify(FakeWorkerGroupError({1: reset, 0: OutOfMemoryError("CUDA out of memory")}))[0] == "oom"
    # a timeout is a hung peer's mark, not a crash's
    timeout = RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 4000ms "
                           "for recv operation to complete")
    assert classify(FakeWorkerGroupError({0: timeout}))[0] == "error"
    assert classify(FakeWorkerGroupError({0: reset, 1: timeout}))[0] == "error"


def test_tunes_traceback_of_a_failed_trial_goes_to_the_sweeps_log_not_the_console(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Ray Tune logs each failed trial's whole traceback (~35 lines) on the console; the sweep's progress line
    already says it in one (issue 50, item 9): the traceback goes to a file, every other record stays."""
    import logging

    from sweeps.service.failures import TUNE_FAILURE_LOGGER, tracebacks_to

    tune_logger = logging.getLogger(TUNE_FAILURE_LOGGER)
    path = tmp_path / "exp" / "trial-tracebacks.log"
    with caplog.at_level(logging.INFO), tracebacks_to(path) as moved:
        try:
            raise RuntimeError("rank 1 raised it")
        except RuntimeError as exc:
            tune_logger.error("Trial task failed for trial run_trial_1a2b3_00001", exc_info=exc)
        tune_logger.warning("something else Tune says")
    tune_logger.error("Trial task failed for trial after_the_sweep")  # outside: the console has it again
    shown = [r.getMessage() for r in caplog.records if r.name == TUNE_FAILURE_LOGGER]
    assert shown == ["something else Tune says", "Trial task failed for trial after_the_sweep"], shown
    kept = path.read_text()
    assert moved.written == 1 and "run_trial_1a2b3_00001" in kept and "RuntimeError: rank 1 raised it" in kept
    assert "Traceback (most recent call last)" in kept
