"""The samplers' readers on their own (`trainables/sampler.py`): the CPU reader's counters with a fake process."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from trainables.sampler import CpuReader


class _Child:
    def __init__(self, pid: int, seconds: float) -> None:
        self.pid, self.seconds = pid, seconds

    def cpu_times(self) -> Any:
        return SimpleNamespace(user=self.seconds, system=0.0)


class _Proc:
    """This process: its own seconds, and its reaped children's (`children_*`), as the kernel keeps them."""

    def __init__(self) -> None:
        self.own, self.reaped = 10.0, 100.0  # 100 s of children reaped before the reader started (a warm group)

    def cpu_times(self) -> Any:
        return SimpleNamespace(user=self.own, system=0.0, children_user=self.reaped, children_system=0.0)


def test_a_loader_worker_that_ends_and_is_reaped_is_counted_once() -> None:
    """Its seconds move from the live children to `children_*` when its parent waits for it; counting both
    (as the reader once did) read a rank's own CPU high and so the node's other work low: contention hidden."""
    reader = CpuReader()
    proc, worker = _Proc(), _Child(4242, 5.0)
    reader.proc = proc  # type: ignore[assignment]
    node = SimpleNamespace(user=500.0, system=0.0)
    reader._psutil = SimpleNamespace(cpu_times=lambda: node, cpu_count=lambda: 2, Error=OSError)  # type: ignore[assignment]
    first = reader._counters([worker])["own_cpu_s"]
    assert first == 10.0 + 100.0 + 5.0
    worker.seconds = 8.0  # it works 3 s more, then ends: gone, not yet reaped
    reader._counters([worker])
    gone = reader._counters([])["own_cpu_s"]
    assert gone == 10.0 + 100.0 + 8.0  # kept while unreaped: the counter never goes back
    proc.reaped += 8.0  # its parent waits for it: the kernel adds its whole time to children_*
    reaped = reader._counters([])["own_cpu_s"]
    assert reaped == 10.0 + 100.0 + 8.0, reaped  # once, not 10 + 108 + 8
