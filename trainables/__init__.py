"""The worker side: the per-worker DDP+AMP loop, the components it is built from, and the workloads.

`loop` is the one training loop; its components own their state (`length`, `window`, `checkpoint`,
`evaluate`, `precision`, `telemetry`, `loader`, `build`, `instruments` and the rest). `contract`, `knobs` and
`metrics` are what the service reads (torch-free). `ray_worker` and `train_functions` run the loop under Ray
Train, `launch` under plain `torchrun`; `doctor_checks` measures what a node can do. The workloads live in
`workloads`, looked up by name (`registry`).

Never imports Ray Tune."""

from trainables.contract import PRECISIONS, TrialConfig
from trainables.loop_errors import DivergedError, UnsupportedError, WorkloadError

__all__ = ["PRECISIONS", "TrialConfig", "DivergedError", "UnsupportedError", "WorkloadError", "Workload", "BuildContext"]


def __getattr__(name: str) -> object:
    # Lazy: `Workload` imports torch, and the service imports this package without it.
    if name in ("Workload", "BuildContext"):
        from trainables.workloads import base

        return getattr(base, name)
    raise AttributeError(name)
