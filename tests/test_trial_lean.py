"""Ray Train's default callbacks, less Ray Data's when a run has no datasets (`sweeps.trial`): this fails
loudly when Ray stops making that callback or renames the private method our trainer overrides."""

from __future__ import annotations

import inspect
from typing import Any

import ray.train
from ray.train.torch import TorchTrainer

from sweeps.trial import _lean_torch_trainer


def _noop(config: dict[str, Any]) -> None:
    pass


def _names(trainer: Any) -> list[str]:
    return [type(c).__name__ for c in trainer._create_default_callbacks()]


def test_a_run_without_datasets_starts_without_ray_datas_callback_and_keeps_every_other() -> None:
    # fit() builds the controller's callbacks with the method our trainer overrides
    assert "self._create_default_callbacks()" in inspect.getsource(TorchTrainer.fit)
    scaling = ray.train.ScalingConfig(num_workers=2)
    stock = _names(TorchTrainer(_noop, scaling_config=scaling))
    assert "DatasetsCallback" in stock, stock  # Ray still makes it (else the override has nothing to do)
    lean = _names(_lean_torch_trainer()(_noop, scaling_config=scaling))
    assert lean == [n for n in stock if n != "DatasetsCallback"]
    assert "PlacementGroupCleanerCallback" in lean  # kept: it frees a dead controller's placement group


def test_a_run_given_datasets_keeps_ray_datas_callback() -> None:
    scaling = ray.train.ScalingConfig(num_workers=2)
    trainer = _lean_torch_trainer()(_noop, scaling_config=scaling, datasets={"train": lambda: None})
    assert "DatasetsCallback" in _names(trainer)
