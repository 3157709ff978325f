"""GPU-shaped profiler traces built by hand, for the split's tests (tests/loop/test_trace.py) and the check
against Holistic Trace Analysis (docs/explain/traces.md): kineto's layout (the host's `ProfilerStep#`,
DataLoader and launch events on the training thread; kernels, copies and sets on the GPU's streams, each
with the launch's correlation id; the GPU repeating the steps as `gpu_user_annotation`; `distributedInfo`),
with times in microseconds chosen so that every answer can be worked out by hand (the tests do)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

HOST, MAIN, GPU = 4242, 4242, 0  # the host's pid and its training thread; the GPU's pid (its device index)
STEP, DATA = "ProfilerStep#", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


class _Trace:
    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world, self.events, self.correlation = rank, world, [], 100
        self.events.append({"ph": "M", "name": "thread_name", "pid": HOST, "tid": MAIN,
                            "args": {"name": "thread 4242 (python)"}})

    def host(self, name: str, ts: float, dur: float, cat: str = "user_annotation") -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": HOST, "tid": MAIN, "ts": ts, "dur": dur,
                            "args": {"External id": len(self.events)}})

    def gpu(self, name: str, ts: float, dur: float, stream: int, cat: str = "kernel") -> None:
        """A kernel (or copy, set) on `stream`, launched 1 us before it starts by the training thread."""
        self.correlation += 1
        launch = {"kernel": "cudaLaunchKernel", "gpu_memcpy": "cudaMemcpyAsync", "gpu_memset": "cudaMemsetAsync"}[cat]
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": launch, "pid": HOST, "tid": MAIN, "ts": ts - 1,
                            "dur": 0.5, "args": {"correlation": self.correlation, "External id": len(self.events)}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": GPU, "tid": stream, "ts": ts, "dur": dur,
                            "args": {"device": 0, "stream": stream, "correlation": self.correlation,
                                     "External id": len(self.events)}})

    def done(self) -> dict[str, Any]:
        return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": self.world},
                "traceEvents": self.events}


GEMM = "ampere_sgemm_128x64_tn"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def rank0(world: int = 2) -> dict[str, Any]:
    """Two steps, 0-100 and 100-200; a kernel on stream 13 ends at 220, after the second step."""
    t = _Trace(0, world)
    t.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"{STEP}4", "pid": GPU, "tid": 7, "ts": 5,
                     "dur": 145})  # the GPU's copy of a step: not a step of the host's, not its training thread
    t.host(f"{STEP}4", 0, 100)
    t.host(f"{STEP}5", 100, 100)
    t.host(DATA, 0, 30)
    t.host(DATA, 100, 15)
    t.host("aten::mm", 17, 3, cat="cpu_op")  # the host's operators: not GPU compute
    t.host("nccl:all_reduce", 65, 5)  # the host's record of the collective: not GPU communication
    t.gpu("Memcpy HtoD (Pinned -> Device)", 10, 15, 7, cat="gpu_memcpy")
    t.gpu(GEMM, 20, 40, 7)
    t.gpu("void at::native::vectorized_elementwise_kernel<4>", 40, 40, 13)
    t.gpu(ALL_REDUCE, 70, 60, 20)
    t.gpu(GEMM, 110, 40, 7)
    t.gpu("Memset (Device)", 160, 5, 7, cat="gpu_memset")
    t.gpu("ncclKernel_Broadcast_RING_LL_Sum_int8_t", 160, 40, 20)
    t.gpu("void at::native::reduce_kernel<512, 1>", 190, 30, 13)
    return t.done()


def rank1(world: int = 2) -> dict[str, Any]:
    """Two steps, 0-100 and 100-200; one compute stream and one NCCL stream."""
    t = _Trace(1, world)
    t.host(f"{STEP}4", 0, 100)
    t.host(f"{STEP}5", 100, 100)
    t.host(DATA, 0, 20)
    t.host(DATA, 100, 5)
    t.gpu(GEMM, 10, 80, 7)
    t.gpu(ALL_REDUCE, 80, 40, 20)
    t.gpu(GEMM, 110, 60, 7)
    return t.done()


def one_rank() -> dict[str, Any]:
    """A 1-rank trial: no NCCL kernel. Two steps, 0-100 and 100-200; two compute streams."""
    t = _Trace(0, 1)
    t.host(f"{STEP}4", 0, 100)
    t.host(f"{STEP}5", 100, 100)
    t.host(DATA, 0, 20)
    t.host(DATA, 100, 30)
    t.gpu("Memcpy HtoD (Pinned -> Device)", 5, 10, 7, cat="gpu_memcpy")
    t.gpu(GEMM, 10, 80, 7)
    t.gpu(GEMM, 110, 60, 13)
    t.gpu("void at::native::vectorized_elementwise_kernel<4>", 150, 30, 7)
    return t.done()


def write(folder: Path, traces: list[dict[str, Any]]) -> list[Path]:
    """Each trace as `rank-<r>.pt.trace.json.gz` in `folder`, as the Tracer keeps them."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for trace in traces:
        path = folder / f"rank-{trace['distributedInfo']['rank']}.pt.trace.json.gz"
        with gzip.open(path, "wt") as f:
            json.dump(trace, f)
        paths.append(path)
    return paths
