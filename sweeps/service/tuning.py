"""The sweep's Ray and Tune, as its controller (`sweeps.service.controller.SweepController`) asks for them.

Tune's settings, the warm pool and its queue, the wait watcher, the memory probe, and Tune's tuner over the
trial driver (`sweeps.service.trial.run_trial`) with the sweep's searcher, scheduler, stopper and callback.

Kept apart from the controller's bookkeeping, which runs without a Ray cluster (tests/service/test_controller.py
gives it a fake `RayTune`)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import ray
from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

from sweeps.search.live_state import SearchState
from sweeps.search.searcher import make_scheduler, make_searcher
from sweeps.service.breaker import BreakerStopper
from sweeps.service.pool import Shape, WarmPool
from sweeps.service.resources import DRIVER_RESOURCES
from sweeps.service.trial import run_trial
from sweeps.service.waits import PoolStarts, RayCluster, WaitWatcher, free_for_sweep
from sweeps.spec import SweepSpec
from trainables.storage import Storage

# Tune hands the next trial to the finished trial's actor (same resources: always here) instead of
# starting a new process: ~1 s less per trial on 2 vCPU (benchmarks/sweep_overhead.py). The Train
# controller and workers are still new for every trial.
REUSE_TRIAL_ACTORS = True
# Tune saves its experiment state (trials, searcher) every 10 s or more by default; a driver
# killed in between forgets the trials it started since. Small sweeps' state is tiny: save often.
_STATE_PERIOD_S = "2"


class PoolQueue:
    """The warm pool's queue actor (`sweeps.service.pool.TrialQueue`), called as the controller calls it."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def cancel(self, trial_id: str) -> None:
        """Tune ended the trial: a warm group still running (or queueing) it stops (not waited for)."""
        self.actor.cancel.remote(trial_id)

    def span(self, trial_id: str) -> tuple[float | None, float | None]:
        began, ended = ray.get(self.actor.span.remote(trial_id), timeout=10)
        return began, ended

    def group_starts(self) -> list[tuple[Shape, float, str]]:
        return list(ray.get(self.actor.group_starts.remote(), timeout=10))


class RayTune:
    """One sweep run's Ray and Tune: started by `start`, ended by `join`."""

    def __init__(self, spec: SweepSpec, storage: Storage, token: str) -> None:
        """`storage`: the root of the sweep's storage (`storage_path`: a local folder or a URI)."""
        self.spec, self.storage, self.token = spec, storage, token
        self.pool: WarmPool | None = None
        self.queue: PoolQueue | None = None  # the warm pool's queue, when the sweep has one
        self.waits: WaitWatcher | None = None  # what the sweep waits for while other work holds its resources
        self.lives: list[tuple[Shape, float, bool]] = []  # each warm group's shape, seconds held, ended (`join`)
        self.workdir = ""

    def start(self, echo: Callable[[str], None]) -> None:
        """Tune's settings, then the warm pool (with `scaling.reuse_workers`) and the wait watcher."""
        for key, value in (("TUNE_GLOBAL_CHECKPOINT_S", _STATE_PERIOD_S),
                           # progress reports carry throughput but not validation loss, which only the final report
                           # has: Tune would otherwise refuse the first report of a sweep whose objective is loss/val
                           ("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1"),
                           # not TensorBoard's result files (MLflow is the record; importing tensorboardX cost the
                           # first trial's result ~1 s here); CSV and JSON only on a local storage path (`tuner`)
                           ("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")):
            os.environ.setdefault(key, value)
        # Every rank works here, as under torchrun: the user's relative paths resolve as they do for them
        # (inside `ray job submit`, this is the job's working directory).
        self.workdir = os.getcwd()
        if self.spec.scaling.reuse_workers:
            self.pool = WarmPool(self.spec, self.trials_dir, self.token, self.workdir)
            self.queue = PoolQueue(self.pool.queue)
        self.waits = WaitWatcher(self.spec, echo, RayCluster(),
                                 PoolStarts(self.pool.queue) if self.pool is not None else None).start()

    @property
    def trials_dir(self) -> str:
        """Where the trials keep their checkpoints and traces: a path or a URI (Ray Train's storage_path)."""
        return self.storage.uri(self.spec.name, "trials")

    def cluster(self) -> dict[str, float]:
        """The cluster's resources."""
        return dict(ray.cluster_resources())

    def free(self) -> dict[str, float] | None:
        """What the cluster has free for the sweep (None before the wait watcher starts)."""
        return free_for_sweep(self.waits.cluster) if self.waits is not None else None

    def tuner(self, callback: tune.Callback, restore: bool) -> tune.Tuner:
        """Return Tune's tuner, restored or new.

        Restored: the searcher's state, the finished trials; new: with the sweep's searcher, scheduler, stopper
        and `callback`."""
        spec = self.spec
        trainable = tune.with_resources(
            tune.with_parameters(run_trial, spec=spec, storage_path=self.trials_dir,
                                 pool=self.pool.queue if self.pool is not None else None, workdir=self.workdir),
            DRIVER_RESOURCES)
        if restore:
            return tune.Tuner.restore(self.storage.uri(spec.name), trainable=trainable, resume_unfinished=True,
                                      resume_errored=False)
        storage_path, filesystem = self.storage.ray_storage()
        # Tune's result files in each trial's folder (CSV and JSON, which its ResultGrid reads; MLflow is the
        # sweep's record) stay where the storage is a local folder. On a URI, Tune uploads its whole experiment
        # folder at every state save (every _STATE_PERIOD_S): these files were 2 of every 3 requests the demo made
        # to its object store (benchmarks/storage_cost.py), so they are not written there.
        files = [CSVLoggerCallback(), JsonLoggerCallback()] if self.storage.is_local else []
        return tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(search_alg=make_searcher(spec), scheduler=make_scheduler(spec),
                                        num_samples=spec.budget.num_trials,
                                        max_concurrent_trials=spec.budget.max_concurrent_trials,
                                        time_budget_s=spec.budget.time_budget_s, reuse_actors=REUSE_TRIAL_ACTORS),
            run_config=tune.RunConfig(name=spec.name, storage_path=storage_path, storage_filesystem=filesystem, verbose=0,
                                      callbacks=[callback, *files],
                                      stop=BreakerStopper()),
        )

    def first_group_s(self, timeout_s: float = 120.0) -> float | None:
        """Return what the pool's first warm group took to start, less what it waited for resources.

        Those are resources other work held. It waits for the group at most `timeout_s` beyond such a wait, and no
        longer than budget.max_queue_s allows; None without a pool or in time."""
        if self.pool is None:
            return None
        t0 = time.monotonic()
        while not (self.waits is not None and self.waits.over):
            starts = ray.get(self.pool.queue.wait_started.remote(2.0))
            if starts:
                return float(starts[0][1])
            if time.monotonic() - t0 > timeout_s + (self.waits.waited_s if self.waits is not None else 0.0):
                break
        return None

    def probe(self, search: SearchState, echo: Callable[[str], None]) -> dict[str, str] | None:
        """Run the memory probe (`search.probe_batch_size`) in the warm groups before the search.

        None where it does not run (no pool, not asked for, or the sweep already waited past budget.max_queue_s)."""
        waited_out = self.waits is not None and self.waits.over  # budget.max_queue_s: Tune's first step halts
        if self.pool is None or not self.spec.search.probe_batch_size or waited_out:
            return None
        from sweeps.service.probe import probe_frontier

        return probe_frontier(self.spec, self.pool.queue, search, echo)

    def join(self, stopped: bool) -> list[tuple[Shape, float, str]] | None:
        """Close the warm pool and wait for its groups, less long when the sweep was `stopped`.

        Returns each group that started (`WarmPool.join`), None without a pool."""
        if self.pool is None:
            return None
        groups = self.pool.join(timeout_s=10.0 if stopped else 30.0)
        self.lives = self.pool.lives
        return groups


def interrupt_tune() -> bool:
    """End the Tune run as Ctrl+C does; False where nobody listens.

    Tune saves its state with the running trials unfinished, and `Tuner.restore` runs them again. Tune listens for SIGINT only when it runs in the main
    thread, where it replaces Python's default handler; anywhere else (or with the default handler
    still in place) there is nobody to tell, and the caller stops the trials another way."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) in (signal.default_int_handler, signal.SIG_DFL, signal.SIG_IGN, None):
        return False
    signal.raise_signal(signal.SIGINT)
    return True
