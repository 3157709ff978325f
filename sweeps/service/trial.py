"""What runs inside one Tune trial: a Ray Train `TorchTrainer` of the shared loop.

Kept apart from `sweeps.service.runner` so that a trial's actor imports only Ray Tune, the spec and the
failure rules, not MLflow, Optuna or the report code (about 1 s less per trial on 2 vCPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ray import tune

from sweeps.search.trials import first_shape, max_loader_workers, resolve_trial
from sweeps.service.failures import HALT_KINDS, TRANSIENT_KINDS, TrialFailure, classify
from sweeps.service.resources import TRAIN_RUN_ENV
from sweeps.spec import ScalingSpec, SweepSpec
from trainables.contract import CHECKPOINT_FILE, FINAL, TrialConfig
from trainables.ray_worker import quiet_ray_exit
from trainables.storage import Storage

logger = logging.getLogger(__name__)

# A trial's report that asks the driver to halt the sweep (a string: Tune keeps it, MLflow does not).
HALT_KEY = "sweep_halt"
_HALT_WAIT_S = 300.0
_HALT_EVERY_S = 0.25


def _ask_to_halt(why: str, report: Callable[[dict[str, Any]], None] = tune.report) -> None:
    """Ask the driver to halt the sweep, and keep asking until it stops this trial (at most
    `_HALT_WAIT_S`). Each ask is a report: Tune's next request for a result is answered, so its actor
    is free to take the stop, and the stop ends this thread (Tune's session exits it at its next
    report, or the actor's end does). A trial that waited outside a report held its actor busy until
    Tune's force cleanup killed it, 10 s later. `report`: how this thread reports (`halt_reporter`)."""
    deadline = time.monotonic() + _HALT_WAIT_S
    while time.monotonic() < deadline:
        report({HALT_KEY: why})
        time.sleep(_HALT_EVERY_S)


def halt_reporter(to_tune: Any) -> Callable[[dict[str, Any]], None]:
    """Return how a trial's own thread asks to halt: `tune.report` in a warm group (`to_tune` None).

    A cold trial's Train run reports to Tune through `to_tune`, its `TuneReportCallback`: the ask goes into
    that callback's queue, never by `tune.report`. Tune's function-trainable session (Ray 2.60) moves each
    item of the queue into its one-slot result queue from the actor's main thread; a `tune.report` of this
    thread meanwhile could take the slot first and pass the lock the main thread had just let go, and the
    main thread then waited forever to put the item it held (a cold sweep halted by a full disk hung so:
    both threads in `Queue.put`). One producer into the result queue: the put waits only on the main
    thread. Ray has no public handle on that queue: the callback's private attribute, read here only
    (tests/service/test_trial.py fails loudly when Ray renames it)."""
    if to_tune is None:
        return tune.report
    queue = to_tune._training_actor_item_queue
    return lambda metrics: queue.put(metrics)


# Ray Train's default callbacks a sweep's run can do without, found by class name: no public way to
# leave one out exists (`DataParallelTrainer._create_default_callbacks` is private), and
# tests/service/test_trial.py fails loudly when Ray no longer makes them.
# - Ray Data's, for a run without datasets: a DatasetManager actor (one more Python process) and Ray
#   Data's context sent to every rank, ~0.6 s of each group's ~6.2 s start-up on 2 cores
#   (benchmarks/train_startup.py). Our ranks read their own files.
_DATASETS_CALLBACK = "DatasetsCallback"
# - The placement-group cleaner, on a cluster without Ray's State API (no dashboard): a detached actor
#   that asks the State API every second whether the run's controller lives, to free the run's
#   placement group if it died. Without that API every ask fails ("Failed to query Ray Train Controller
#   actor state", a warning a second), so it frees nothing and, after a controller that died, never
#   exits; meanwhile it costs each run one more Python process (~1.5 s of CPU) and its start and stop
#   (the run waits on both). With a dashboard it works, and stays.
_CLEANER_CALLBACK = "PlacementGroupCleanerCallback"


def without_callbacks(callbacks: list[Any], names: set[str]) -> list[Any]:
    """Ray Train's default `callbacks` less those whose class is named in `names`."""
    return [c for c in callbacks if type(c).__name__ not in names]


_STATE_API: dict[str, bool] = {}  # GCS address -> whether its State API answers (definite answers only)


def state_api_served() -> bool:
    """Tell whether Ray Train's placement-group cleaner could work on the cluster this process is connected to.

    That is whether anything answers at the State API address its dashboard registered in the GCS (where the
    cleaner's queries go; `include_dashboard=False` still registers one). False only where that is certain:
    a refused connection — for a loopback address only from the head node, where the dashboard and the
    cleaner run. Anything else (no address yet, a timeout, a worker node) keeps Ray's default, unremembered."""
    import ray

    if not ray.is_initialized() or os.environ.get("RAY_API_SERVER_ADDRESS"):
        return True
    gcs = ray.get_runtime_context().gcs_address
    if gcs not in _STATE_API:
        answer = _state_api_answers()
        if answer is None:
            return True
        _STATE_API[gcs] = answer
    return _STATE_API[gcs]


def _state_api_answers() -> bool | None:
    import socket

    import ray
    from ray._common.constants import HEAD_NODE_RESOURCE_NAME  # where Ray Train places the cleaner
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    address = _internal_kv_get(ray_constants.DASHBOARD_ADDRESS, namespace=ray_constants.KV_NAMESPACE_DASHBOARD)
    if address is None:
        return None  # none registered (yet: a dashboard still starting registers later)
    host, _, port = address.decode().rpartition(":")
    if host in ("127.0.0.1", "localhost", "::1"):
        here = ray.get_runtime_context().get_node_id()
        node: dict[str, Any] = next((n for n in ray.nodes() if n["NodeID"] == here), {})
        if HEAD_NODE_RESOURCE_NAME not in node.get("Resources", {}):
            return None  # the dashboard's own node is another one: nothing to judge from here
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except ConnectionRefusedError:
        return False
    except (OSError, ValueError):
        return None
    return True


def start_train_coordinator(wait_s: float = 60.0) -> None:
    """Start Ray Train's autoscaling coordinator before the first run's controller asks it for resources.

    The coordinator is a detached actor, one per cluster. That controller waits at most 5 s for the answer and
    then logs a 20-line `GetTimeoutError` traceback ("safe to ignore ... CPU being overloaded"), which is what a
    cold coordinator on a busy 2-core machine takes (two sweeps starting at once, tests/e2e/test_many_hands.py).
    Started here (~0.4 s on an idle 2-core machine, the same start the first run would have made), every
    controller finds it answering. Best effort: a Ray without it, or one slower than `wait_s`, only logs
    what it logged before."""
    import ray

    try:  # the actor Ray Train's client makes (tests/service/test_trial.py fails when Ray changes that)
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )

        ray.get(get_or_create_autoscaling_coordinator().__ray_ready__.remote(), timeout=wait_s)
    except Exception as exc:  # noqa: BLE001  # never a reason to stop a sweep
        logger.info("Ray Train's autoscaling coordinator did not start (%s); runs start without it", exc)


@functools.cache
def _lean_torch_trainer() -> type:
    """`TorchTrainer` that starts without Ray Data's callback when it was given no datasets, and without
    the placement-group cleaner where the cluster has no State API for it to work with."""
    from ray.train.torch import TorchTrainer

    class LeanTorchTrainer(TorchTrainer):  # type: ignore[misc]  # Ray's classes are not annotated
        def _create_default_callbacks(self) -> list[Any]:
            # (mypy reads Train V1's TorchTrainer, which has no such method; Ray 2.60 runs V2's)
            callbacks = super()._create_default_callbacks()  # type: ignore[misc]
            unused = set() if self.datasets else {_DATASETS_CALLBACK}
            if not state_api_served():
                unused.add(_CLEANER_CALLBACK)
            return without_callbacks(callbacks, unused)

    return LeanTorchTrainer


@dataclass(frozen=True)
class Ranks:
    """A Train run's worker group: the spec's scaling, how many ranks, and what each reserves.

    It also says how long a collective may hang."""

    scaling: ScalingSpec
    num_workers: int
    cpus_per_rank: float  # the rank's own cores and its loader workers' share
    timeout_s: float  # the process group's timeout (a hung peer)
    accelerator_type: str = ""  # every rank on this type ("": any)

    def pinned(self) -> dict[str, Any]:
        """Return how Ray Train pins the ranks to the type.

        A GPU type by Ray's own accelerator type, a CPU node type by its nodes' label (`scaling.type_label`)."""
        if not self.accelerator_type:
            return {}
        if self.scaling.use_gpu:
            return {"accelerator_type": self.accelerator_type}
        return {"label_selector": {self.scaling.type_label: self.accelerator_type}}


def _torch_trainer(train_fn: Any, config: dict[str, Any], ranks: Ranks, name: str, storage_path: str,
                   callbacks: list[Any] | None = None) -> Any:
    import ray.train
    from ray.train.torch import TorchConfig

    # Ray Train hands these from this process to the run's controller (`get_env_vars_to_propagate`): a
    # local sweep's runtime env set them already, a job's may not have (sweeps.service.resources.TRAIN_RUN_ENV)
    for key, value in TRAIN_RUN_ENV.items():
        os.environ.setdefault(key, value)
    scaling = ranks.scaling
    return _lean_torch_trainer()(
        train_fn,
        train_loop_config=config,
        torch_config=TorchConfig(backend="nccl" if scaling.use_gpu else "gloo", timeout_s=int(max(ranks.timeout_s, 1))),
        scaling_config=ray.train.ScalingConfig(
            num_workers=ranks.num_workers,
            use_gpu=scaling.use_gpu,
            # the rank's own cores and its loader workers' share: loader processes run on cores that
            # would otherwise be counted free for another rank or trial (and bias the searched knob)
            resources_per_worker={"CPU": ranks.cpus_per_rank, "GPU": scaling.gpus_per_worker},
            **ranks.pinned(),
        ),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=storage_path,
            callbacks=callbacks or [],
            failure_config=ray.train.FailureConfig(max_failures=0),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1),  # disk use stays bounded
        ),
    )


def make_trainer(cfg: TrialConfig, scaling: ScalingSpec, name: str, storage_path: str, callbacks: list[Any],
                 workdir: str | None = None) -> Any:
    """Build a Ray Train `TorchTrainer` running the shared loop for one trial config.

    Every rank works in `workdir` (the sweep driver's working directory) where that is on its node, else in
    Ray's run folder."""
    from trainables.train_functions import WORKDIR, cold_worker

    ranks = Ranks(scaling, cfg.num_workers or scaling.num_workers, scaling.cpus_per_rank(cfg.num_dataloader_workers),
                  cfg.collective_timeout_s, cfg.accelerator_type)
    return _torch_trainer(cold_worker, {"trial": cfg.to_dict(), WORKDIR: workdir}, ranks, name, storage_path, callbacks)


def make_group_trainer(spec: SweepSpec, queue: Any, slot: int, name: str, storage_path: str,
                       group: tuple[str | None, tuple[int, str] | None] = (None, None)) -> Any:
    """Build a warm group: a `TorchTrainer` whose ranks serve the trials of one shape in `queue`.

    `group`: every rank's working directory, as `make_trainer`'s, and its shape: its number of ranks and
    accelerator type, default the spec's first. The ranks serve trials until the queue closes or asks for
    another shape. Each rank holds what the largest trial of the space needs (loader workers included) for
    as long as it lives."""
    from trainables.train_functions import COMPILER, WORKDIR, pool_worker

    workdir, shape = group
    size, kind = shape or first_shape(spec)
    # An idle group's ranks wait together, one short poll at a time: well inside the process-group
    # timeout, or a short budget.collective_timeout_s would end an idle group (rank 1 waits in a broadcast)
    poll_s = min(2.0, spec.budget.collective_timeout_s / 4)
    ranks = Ranks(spec.scaling, size, spec.scaling.cpus_per_rank(max_loader_workers(spec)),
                  spec.budget.collective_timeout_s, kind)
    return _torch_trainer(pool_worker, {"queue": queue, "slot": slot, "group": name, WORKDIR: workdir,
                                        "idle_poll_s": poll_s, "shape": (size, kind),
                                        COMPILER: loads_compiler(spec)}, ranks, name, storage_path)


def loads_compiler(spec: SweepSpec) -> bool:
    """Whether the sweep's trials load torch's compiler stack (~1.6 s of a core for each process to import it).

    A trace's profiler (`telemetry.trace_steps`, where warm-up is long enough for it) and `compile` do. A warm group
    then imports it at its start, so that its first trial does not pay it, nor the ETA take it for every trial's."""
    from sweeps.spec.params import param_values

    steps = spec.telemetry.trace_steps
    compiles = spec.space.param("compile")
    return (steps > 0 and spec.budget.num_warmup_steps >= steps + 2) or (
        compiles is not None and any(bool(v) for v in param_values(compiles)))


class WarmFailure(Exception):
    """A trial's failure as its warm group reported it (per rank), with its last checkpoint."""

    def __init__(self, failures: dict[Any, BaseException], checkpoint: str | None) -> None:
        super().__init__("; ".join(f"rank {r}: {type(e).__name__}: {e}" for r, e in failures.items()))
        self.worker_failures = {r: e for r, e in failures.items() if r is not None}  # what classify() reads
        self.cause = next((e for r, e in failures.items() if r is None), None)
        self.checkpoint = checkpoint


def warm_reports(pool: Any, trial_id: str, cfg: TrialConfig, checkpoint_dir: str,
                 resume_from: str | None) -> Iterator[dict[str, Any]]:
    """Hand a trial to a warm group and yield its reports until the final one.

    A failure raises `WarmFailure` (with the last checkpoint the trial kept); a closed pool ends them early."""
    import ray

    ray.get(pool.submit.remote(trial_id, cfg.to_dict(), resume_from, checkpoint_dir))
    seen, checkpoint = 0, resume_from
    while True:
        events = ray.get(pool.events.remote(trial_id, seen, 5.0))
        if events is None:  # the sweep is ending (stopped at once): Tune no longer waits for this trial
            logger.info("the sweep's warm worker pool closed before trial %s ended", trial_id)
            return
        for event in events:
            seen += 1
            if "failed" in event:
                raise WarmFailure(event["failed"], checkpoint)
            checkpoint = event.get("checkpoint", checkpoint)
            yield event["metrics"]
            if event["metrics"].get(FINAL) == 1:
                return


def _run_warm(pool: Any, trial_id: str, cfg: TrialConfig, checkpoint_dir: str, resume_from: str | None) -> None:
    """Pass a warm group's reports for the trial to Tune until the final one."""
    import ray

    finished = False
    try:
        for metrics in warm_reports(pool, trial_id, cfg, checkpoint_dir, resume_from):
            tune.report(metrics)
            finished = metrics.get(FINAL) == 1
    finally:
        if not finished:  # Tune stopped this trial (or it failed): its group stops at its next report
            ray.get(pool.cancel.remote(trial_id))


def trace_dir(storage_path: str, name: str) -> str:
    """Return where a trial's ranks keep their traces: beside its checkpoints, in the sweep's storage.

    A path or a URI: each rank uploads its own from the node it ran on (`trainables.trace`)."""
    return Storage(storage_path).uri(name, "traces")


def run_trial(config: dict[str, Any], spec: SweepSpec, storage_path: str, pool: Any = None,
              workdir: str | None = None) -> None:
    """Run one Tune trial: the shared loop with the sampled config.

    It runs in a Ray Train run of its own, or (with `pool`, `scaling.reuse_workers`) in a warm group that serves
    trial after trial. `workdir`: the driver's working directory, every rank's own (a warm group has it from its
    pool)."""
    from ray.tune.integration.ray_train import TuneReportCallback

    quiet_ray_exit()  # this actor's end (Tune removes its placement group) prints no traceback
    trial_id = tune.get_context().get_trial_id()
    # Every attempt uses the same Train run name: Ray Train then hands a retried (or resumed) run
    # the last checkpoint the crashed attempt saved (budget.checkpoint_every_steps), if any.
    name = f"{spec.name}-{trial_id}"
    # each rank's trace goes beside the trial's checkpoints; the sweep logs it to the trial's run (`trace_dir`)
    cfg = dataclasses.replace(resolve_trial(spec, config), trace_dir=trace_dir(storage_path, name))
    over = True
    to_tune = TuneReportCallback() if pool is None else None  # a cold trial's Train run reports to Tune through it
    trials = Storage(storage_path)  # a local folder or a URI: the same from every node
    warm_checkpoint = trials.uri(name, "checkpoint_warm")  # rank 0 uploads it from its node (`QueueReporter`)
    # A trial run again after a halt, a killed driver or on another node continues from the checkpoint it kept
    # (cold mode: Ray Train finds it under the same run name).
    resume_from = warm_checkpoint if trials.exists(name, "checkpoint_warm", CHECKPOINT_FILE) else None
    try:
        for attempt in range(spec.budget.max_retries + 1):
            try:
                if pool is not None:
                    _run_warm(pool, trial_id, cfg, warm_checkpoint, resume_from)
                else:
                    make_trainer(cfg, spec.scaling, name, storage_path, [to_tune], workdir).fit()
                return
            except Exception as exc:  # noqa: BLE001 - every failure is classified; only transient ones retried
                kind, reason = classify(exc)
                resume_from = getattr(exc, "checkpoint", None)
                if kind in HALT_KINDS:
                    # Not this configuration's fault, and the next trial would hit it too: ask the driver
                    # to halt the sweep; it stops this trial unfinished, to run again on resume.
                    over = False
                    _ask_to_halt(f"{kind}: {reason}", halt_reporter(to_tune))
                    over = True  # the driver did not halt (it cannot outside its main thread): fail
                if kind not in TRANSIENT_KINDS or attempt == spec.budget.max_retries:
                    raise TrialFailure(kind, reason) from None
                logger.warning("trial %s attempt %d: %s (%s); retrying", trial_id, attempt + 1, kind, reason)
    finally:  # the trial is over: its checkpoints go (a halted or killed sweep keeps them for resume)
        with contextlib.suppress(OSError):  # a store that does not answer now: what is left costs space, no result
            for kept in trials.list(name, "checkpoint_*") if over else ():
                trials.delete(name, kept)
