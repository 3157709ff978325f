"""What runs inside one Tune trial: a Ray Train `TorchTrainer` of the shared loop.

Kept apart from `sweeps.runner` so that a trial's actor imports only Ray Tune, the spec and the
failure rules, not MLflow, Optuna or the report code (about 1 s less per trial on 2 vCPU).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

from ray import tune

from sweeps.failures import HALT_KINDS, TRANSIENT_KINDS, TrialFailure, classify
from sweeps.space import resolve_trial
from sweeps.spec import ScalingSpec, SweepSpec
from trainables.contract import TrialConfig

logger = logging.getLogger(__name__)

# A trial's report that asks the driver to halt the sweep (a string: Tune keeps it, MLflow does not).
HALT_KEY = "sweep_halt"
_HALT_WAIT_S = 300.0


def make_trainer(cfg: TrialConfig, scaling: ScalingSpec, name: str, storage_path: str, callbacks: list[Any]) -> Any:
    """A Ray Train `TorchTrainer` running the shared loop for one trial config."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from trainables.ray_worker import train_worker

    return TorchTrainer(
        train_worker,
        train_loop_config=cfg.to_dict(),
        torch_config=TorchConfig(backend="nccl" if scaling.use_gpu else "gloo", timeout_s=int(max(cfg.collective_timeout_s, 1))),
        scaling_config=ray.train.ScalingConfig(
            num_workers=scaling.num_workers,
            use_gpu=scaling.use_gpu,
            # the rank's own cores and its loader workers' share: loader processes run on cores that
            # would otherwise be counted free for another rank or trial (and bias the searched knob)
            resources_per_worker={"CPU": scaling.cpus_per_rank(cfg.num_dataloader_workers), "GPU": scaling.gpus_per_worker},
            accelerator_type=scaling.accelerator_type,
        ),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=storage_path,
            callbacks=callbacks,
            failure_config=ray.train.FailureConfig(max_failures=0),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1),  # disk use stays bounded
        ),
    )


def run_trial(config: dict[str, Any], spec: SweepSpec, storage_path: str) -> None:
    """One Tune trial: a Ray Train run of the shared loop with the sampled config."""
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = tune.get_context().get_trial_id()
    cfg = resolve_trial(spec, config)
    # Every attempt uses the same Train run name: Ray Train then hands a retried (or resumed) run
    # the last checkpoint the crashed attempt saved (budget.checkpoint_every_steps), if any.
    name = f"{spec.name}-{trial_id}"
    over = True
    try:
        for attempt in range(spec.budget.max_retries + 1):
            trainer = make_trainer(cfg, spec.scaling, name, storage_path, callbacks=[TuneReportCallback()])
            try:
                trainer.fit()
                return
            except Exception as exc:  # noqa: BLE001 - every failure is classified; only transient ones retried
                kind, reason = classify(exc)
                if kind in HALT_KINDS:
                    # Not this configuration's fault, and the next trial would hit it too: ask the driver
                    # to halt the sweep; it stops this trial unfinished, to run again on resume.
                    over = False
                    tune.report({HALT_KEY: f"{kind}: {reason}"})
                    time.sleep(_HALT_WAIT_S)
                    over = True  # the driver did not halt (it cannot outside its main thread): fail
                if kind not in TRANSIENT_KINDS or attempt == spec.budget.max_retries:
                    raise TrialFailure(kind, reason) from None
                logger.warning("trial %s attempt %d: %s (%s); retrying", trial_id, attempt + 1, kind, reason)
    finally:  # the trial is over: its checkpoints go (a halted or killed sweep keeps them for resume)
        for path in Path(storage_path, name).glob("checkpoint_*") if over else ():
            shutil.rmtree(path, ignore_errors=True)
