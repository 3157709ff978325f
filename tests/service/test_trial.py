"""Ray Train's default callbacks, less Ray Data's when a run has no datasets and less the placement-group
cleaner where the cluster has no State API (`sweeps.service.trial`): this fails loudly when Ray stops making
those callbacks or renames the private method our trainer overrides. And a cold trial's halt, asked through the
queue its Train run reports to Tune through (a private attribute of Ray's `TuneReportCallback`)."""

from __future__ import annotations

import inspect
import threading
from pathlib import Path
from typing import Any

import pytest
import ray.train
from ray.train.torch import TorchTrainer

from sweeps.service import trial
from sweeps.service.trial import _lean_torch_trainer


def _noop(config: dict[str, Any]) -> None:
    pass


def _names(trainer: Any) -> list[str]:
    return [type(c).__name__ for c in trainer._create_default_callbacks()]


def test_a_run_without_datasets_starts_without_ray_datas_callback_and_keeps_every_other(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trial, "state_api_served", lambda: True)  # a cluster with a dashboard
    # fit() builds the controller's callbacks with the method our trainer overrides
    assert "self._create_default_callbacks()" in inspect.getsource(TorchTrainer.fit)
    scaling = ray.train.ScalingConfig(num_workers=2)
    stock = _names(TorchTrainer(_noop, scaling_config=scaling))
    assert "DatasetsCallback" in stock, stock  # Ray still makes it (else the override has nothing to do)
    lean = _names(_lean_torch_trainer()(_noop, scaling_config=scaling))
    assert lean == [n for n in stock if n != "DatasetsCallback"]
    assert "PlacementGroupCleanerCallback" in lean  # kept: with the State API it frees a dead controller's placement group


def test_without_a_state_api_the_placement_group_cleaner_is_left_out_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trial, "state_api_served", lambda: False)
    scaling = ray.train.ScalingConfig(num_workers=2)
    stock = _names(TorchTrainer(_noop, scaling_config=scaling))
    assert "PlacementGroupCleanerCallback" in stock, stock
    lean = _names(_lean_torch_trainer()(_noop, scaling_config=scaling))
    assert lean == [n for n in stock if n not in ("DatasetsCallback", "PlacementGroupCleanerCallback")]
    given_data = _names(_lean_torch_trainer()(_noop, scaling_config=scaling, datasets={"train": lambda: None}))
    assert given_data == [n for n in stock if n != "PlacementGroupCleanerCallback"]


def test_a_run_given_datasets_keeps_ray_datas_callback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trial, "state_api_served", lambda: True)
    scaling = ray.train.ScalingConfig(num_workers=2)
    trainer = _lean_torch_trainer()(_noop, scaling_config=scaling, datasets={"train": lambda: None})
    assert _names(trainer) == _names(TorchTrainer(_noop, scaling_config=scaling))


@pytest.mark.ray
def test_a_cluster_without_a_state_api_runs_no_cleaner(small_sweep: tuple) -> None:
    from ray._private.state import state

    # The session's cluster has no dashboard (its address is in the GCS all the same, but nothing answers;
    # the pytest process is on its head node)
    assert not trial.state_api_served()
    # the small sweep's warm group ran (and every Train run in this cluster before it) without a cleaner
    classes = [a["ActorClassName"] for a in state.actor_table(None).values()]
    assert "RayTrainWorker" in classes and "PlacementGroupCleaner" not in classes, sorted(set(classes))


def test_every_run_gets_the_sweeps_train_settings_on_a_cluster_too_and_a_users_own_value_wins(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Inside `ray job submit` the job's runtime env is the user's: the process that starts a Train run sets
    # what it lacks, and Ray hands that process's values to the run's controller
    from ray.train.v2._internal.constants import get_env_vars_to_propagate

    from sweeps.service.resources import TRAIN_RUN_ENV
    from sweeps.service.trial import Ranks, _torch_trainer
    from sweeps.spec import ScalingSpec

    for key in TRAIN_RUN_ENV:  # unset for the call, and unset again after the test (what it sets does not leak)
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    monkeypatch.setenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "1")  # the user's choice
    _torch_trainer(_noop, {}, Ranks(ScalingSpec(), 2, 1.0, 60.0), "run", str(tmp_path), [])
    handed_on = get_env_vars_to_propagate()
    assert handed_on["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.5"  # reports taken every 0.5 s, not Ray's 2
    assert handed_on["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "1"


def test_the_coordinator_a_sweep_starts_first_is_the_one_every_run_s_controller_asks() -> None:
    # sweeps.service.trial.start_train_coordinator starts this actor before the first run, because the
    # controller waits at most 5 s for its answer and logs a traceback after (a cold start on a busy machine)
    from ray.data._internal.cluster_autoscaler import default_autoscaling_coordinator as coordinator
    from ray.train.v2._internal.execution.scaling_policy import autoscaling_coordinator_client as client

    asks = inspect.getsource(client.TrainAutoscalingCoordinatorClient._autoscaling_coordinator.func)
    assert "get_or_create_autoscaling_coordinator()" in asks, asks
    assert client.get_or_create_autoscaling_coordinator is coordinator.get_or_create_autoscaling_coordinator
    assert client.AUTOSCALING_REQUESTS_GET_TIMEOUT_S == 5  # the wait a cold coordinator outlasted
    assert 'get_if_exists=True' in inspect.getsource(coordinator.get_or_create_autoscaling_coordinator)
    assert "get_or_create_autoscaling_coordinator" in inspect.getsource(trial.start_train_coordinator)


_BASE = """\
name: c
trainable: {{name: mlp-tabular}}
space: {{compile: {compile}}}
budget: {{num_trials: 2, num_steps: 10, num_warmup_steps: {warmup}}}
telemetry: {{trace_steps: {trace}}}
"""


@pytest.mark.parametrize(("compile_", "warmup", "trace", "loads"), [
    ("false", 5, 2, True),  # the demo's: every trial traces 2 warm-up steps, the profiler loads the compiler
    ("false", 3, 2, False),  # warm-up too short to trace (a trace needs num_warmup_steps >= 4 here)
    ("false", 5, 0, False),  # tracing off
    ("{type: categorical, choices: [false, true]}", 5, 0, True),  # some trials compile
])
def test_a_warm_group_imports_the_compiler_at_its_start_only_where_its_trials_will_load_it(
        compile_: str, warmup: int, trace: int, loads: bool) -> None:
    from sweeps.spec import parse_spec

    spec = parse_spec(_BASE.format(compile=compile_, warmup=warmup, trace=trace))
    assert trial.loads_compiler(spec) is loads


def _halts_beside_a_train_report(config: dict[str, Any]) -> None:
    """A cold trial whose Train run failed with a full disk: its last report still waits in Tune's queue when
    the trial's own thread asks the driver to halt."""
    from ray.tune.integration.ray_train import TuneReportCallback

    to_tune = TuneReportCallback()
    to_tune.after_report(None, [{"progress/steps": 5}], None)  # what the Train run's controller does on a report
    trial._ask_to_halt("disk_full: test", trial.halt_reporter(to_tune))


def test_a_cold_trials_halt_asked_beside_its_train_runs_last_report_reaches_the_driver(
        ray_cluster: None, tmp_path: Path) -> None:
    # Asked by `tune.report` from the trial's thread, Tune's session could hang for good: its main thread, moving
    # the Train report into its one-slot result queue, found the slot taken by the ask (Ray 2.60; `halt_reporter`).
    # Before the fix this test hung (a script of these lines too, 2026-11-28), and test_loop_faults' cold sweep
    # hung in its disk-full halt once here (it had passed in the clean clone's run an hour before).
    from ray import tune

    tuner = tune.Tuner(_halts_beside_a_train_report, param_space={"i": tune.grid_search([0, 1, 2, 3])},
                       tune_config=tune.TuneConfig(max_concurrent_trials=1),
                       run_config=tune.RunConfig(storage_path=str(tmp_path), name="halts", verbose=0,
                                                 stop=lambda trial_id, result: bool(result.get(trial.HALT_KEY))))
    out: dict[str, Any] = {}
    fit = threading.Thread(target=lambda: out.update(results=tuner.fit()), daemon=True)
    fit.start()
    fit.join(timeout=150)  # ~12 s for the 4 trials alone here
    assert "results" in out, "a trial's halt hung Tune's session"
    assert [r.metrics.get(trial.HALT_KEY) for r in out["results"]] == ["disk_full: test"] * 4  # each ask arrived


def test_a_cold_trial_asks_through_its_train_runs_queue_and_a_warm_one_by_tune_report() -> None:
    from ray import tune

    class Queue:
        def __init__(self) -> None:
            self.items: list[dict[str, Any]] = []

        def put(self, item: dict[str, Any]) -> None:
            self.items.append(item)

    class Callback:  # what TuneReportCallback holds (the attribute the test above reads from Ray's own)
        _training_actor_item_queue = Queue()

    assert trial.halt_reporter(None) is tune.report  # a warm group's trial: its thread is Tune's only producer
    trial.halt_reporter(Callback())({trial.HALT_KEY: "disk_full: x"})
    assert Callback._training_actor_item_queue.items == [{trial.HALT_KEY: "disk_full: x"}]
