"""Entry point for one Ray Train worker: the shared loop with a Ray Train reporter.

Imports `ray.train` lazily (inside the function), never Ray Tune: the loop stays runnable
under plain `torchrun` on machines without Ray.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable
from typing import Any

from trainables.contract import TrialConfig
from trainables.reporting import JsonlReporter, MultiReporter

# What Ray's exits carry: `ray._raylet.raise_sys_exit_with_custom_error_message` raises `SystemExit` with it
# (tests/loop/test_ray_worker.py fails loudly when Ray stops doing so).
RAY_EXIT_ATTR = "ray_terminate_msg"


class _QuietRayExit:
    """`sys.unraisablehook` of a Ray process (a trial's actor, a rank): an exit Ray raised where Python cannot raise (a weakref
    callback, `__del__`) is left out; anything else goes to the hook it replaced."""

    def __init__(self, previous: Callable[[Any], object]) -> None:
        self.previous = previous

    def __call__(self, unraisable: Any) -> None:
        # The raylet may signal again (its SIGKILL follows): a second SIGTERM must not re-enter Ray's handler
        # here, whose SystemExit this hook would print. No logging: its lock is a window for that signal.
        try:
            if not _rays_exit(unraisable.exc_value):
                self.previous(unraisable)
                return
        except SystemExit as exc:  # Ray's handler ran again inside this hook
            if not _rays_exit(exc):
                raise
        with contextlib.suppress(ValueError):  # not the main thread: Ray's handler does not run there
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # from now on a SIGTERM ends the process without a word


def _rays_exit(exc: BaseException | None) -> bool:
    return isinstance(exc, SystemExit) and hasattr(exc, RAY_EXIT_ATTR)


def quiet_ray_exit() -> None:
    """Keep Ray's ending of this process (a trial's actor, or a Ray Train rank) out of the sweep's output.

    Tune ends a trial's actor by removing its placement group; the raylet then sends the process SIGTERM
    (SIGKILL 200 ms later), and Ray's handler raises `SystemExit(1)` in the main thread at its next Python
    instruction. Where that is inside a weakref callback (a collected `WeakSet` member's `_remove`), Python
    cannot raise it: it prints "Exception ignored in ... SystemExit: 1" with a traceback to the worker's stderr,
    which Ray forwards to the driver's console, while the process ends all the same (ray-project/ray#13487).
    Idempotent."""
    if not isinstance(sys.unraisablehook, _QuietRayExit):
        sys.unraisablehook = _QuietRayExit(sys.unraisablehook)


class RayTrainReporter:
    """`ray.train.report` from every rank (it is a barrier); Tune sees rank 0's dict."""

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        import ray.train

        # Ray copies the checkpoint into the run's storage before returning (the loop then
        # deletes its temp dir); CheckpointConfig(num_to_keep) bounds how many stay on disk.
        checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        ray.train.report(metrics, checkpoint=checkpoint)


def train_worker(config: dict[str, Any]) -> None:
    import ray
    import ray.train
    import ray.train.torch

    from trainables.loop import train

    quiet_ray_exit()  # Ray Train's placement group removed at the run's end: this rank's SIGTERM prints nothing
    cfg = TrialConfig.from_dict(config)
    rank = ray.train.get_context().get_world_rank()
    reporter = MultiReporter(RayTrainReporter(), JsonlReporter(cfg.metrics_path, rank)) if cfg.metrics_path else RayTrainReporter()
    node = ray.get_runtime_context().get_node_id()
    device = ray.train.torch.get_device()
    checkpoint = ray.train.get_checkpoint()  # set when this run restarts after a crash
    with checkpoint.as_directory() if checkpoint is not None else contextlib.nullcontext(None) as path:
        train(cfg, reporter, device, facts={"device/ray_node_id": node}, resume_from=path)
