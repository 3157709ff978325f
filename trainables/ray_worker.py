"""Entry point for one Ray Train worker: the shared loop with a Ray Train reporter.

Imports `ray.train` lazily (inside the function), never Ray Tune: the loop stays runnable
under plain `torchrun` on machines without Ray.
"""

from __future__ import annotations

import contextlib
from typing import Any

from trainables.contract import TrialConfig
from trainables.reporting import JsonlReporter, MultiReporter


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

    cfg = TrialConfig.from_dict(config)
    rank = ray.train.get_context().get_world_rank()
    reporter = MultiReporter(RayTrainReporter(), JsonlReporter(cfg.metrics_path, rank)) if cfg.metrics_path else RayTrainReporter()
    node = ray.get_runtime_context().get_node_id()
    device = ray.train.torch.get_device()
    checkpoint = ray.train.get_checkpoint()  # set when this run restarts after a crash
    with checkpoint.as_directory() if checkpoint is not None else contextlib.nullcontext(None) as path:
        train(cfg, reporter, device, facts={"device/ray_node_id": node}, resume_from=path)
