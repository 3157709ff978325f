"""Workloads and the per-worker DDP+AMP loop. Never imports Ray Tune."""

from trainables.contract import PRECISIONS, TrialConfig
from trainables.loop_errors import DivergedError, UnsupportedError, WorkloadError

__all__ = ["PRECISIONS", "TrialConfig", "DivergedError", "UnsupportedError", "WorkloadError", "Workload", "BuildContext"]


def __getattr__(name: str) -> object:
    # Lazy: `Workload` imports torch, and the service imports this package without it.
    if name in ("Workload", "BuildContext"):
        from trainables.workloads import base

        return getattr(base, name)
    raise AttributeError(name)
