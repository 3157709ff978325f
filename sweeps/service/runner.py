"""Run a sweep: the table of contents, from the sweep's lock to its report.

The sweep's lock, its saved state (new or resumed), the MLflow store, the Ray cluster and the signals, then
the sweep's controller (`sweeps.service.controller`): the warm pool, the memory probe, Ray Tune with the
sweep's searcher, scheduler, stopper and callback over the trial driver, and at the end the outcome, the
parent run and the report."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import ray

from sweeps.exits import StorageProblem
from sweeps.results.outcome import SweepOutcome
from sweeps.results.report import load_outcome
from sweeps.service.connect import connect_ray, sigterm_as_sigint
from sweeps.service.controller import SweepController
from sweeps.service.failures import tracebacks_to
from sweeps.service.progress import TERMINAL
from sweeps.service.resources import local_runtime_env, refuse_if_never_fits, refuse_missing_types
from sweeps.service.saved_state import (
    SweepExists,
    SweepState,
    experiment_dir,
    in_uploaded_job,
    job_banner,
    nothing_left,
    outputs_root,
    storage,
    sweep_lock,
)
from sweeps.service.shared_storage import refuse_unshared_storage
from sweeps.service.trial import start_train_coordinator
from sweeps.spec import SpecError, SweepSpec, parse_spec
from sweeps.store import absolute_uri
from sweeps.tracking import SweepTracker
from trainables.storage import Storage, StorageError

TRACEBACKS_FILE = "trial-tracebacks.log"  # beside sweep.json: Ray Tune's traceback of each failed trial
PENDING_FILE = "mlflow-pending.jsonl"  # beside sweep.json: the tracking calls MLflow never took


def echo_stdout(line: str) -> None:
    TERMINAL(line)  # one line per event; on a terminal also a live status line (sweeps.service.progress)


def run_sweep(spec: SweepSpec, spec_text: str, echo: Callable[[str], None] = echo_stdout,
              restart: bool = False) -> SweepOutcome:
    """Run the sweep on the Ray cluster `ray.init()` finds (or a new local one).

    A sweep of the same name and spec already in `storage_path` is resumed; one that already ended
    (`nothing_left`) is left alone: its outcome is read back from MLflow (`from_store`), and Ray does not start.
    Another spec under that name is refused (`SweepExists`); `restart` moves the old one aside and starts afresh.
    The sweep's lock is held throughout: a second run of it refuses at once (`SweepLocked`). A `storage_path` URI
    that cannot be reached or written fails first, before Ray starts (`StorageProblem`)."""
    uri = spec.tracking.resolved_uri()
    st = storage(spec)
    if in_uploaded_job():  # the job's working directory is a temporary copy of the upload
        uri = absolute_uri(uri, outputs_root())
        echo(job_banner(experiment_dir(spec), uri, outputs_root()))
    try:
        if not st.is_local:  # a local folder is made and checked by the lock, as before
            st.check_writable()
        return _locked(spec, spec_text, echo, restart, uri, st)
    except StorageError as exc:  # one line naming the URI (and the credentials variables where they are the cause)
        raise StorageProblem(str(exc)) from None


def _locked(spec: SweepSpec, spec_text: str, echo: Callable[[str], None], restart: bool, uri: str,
            st: Storage) -> SweepOutcome:
    """`run_sweep` under the sweep's lock."""
    with sweep_lock(spec) as lease:
        state = SweepState.find(spec, spec_text, restart=restart, echo=echo)
        if state is not None and state.prices is not None and spec.cost is not None and spec.cost.saved() != state.prices:
            echo(f"cost.price_file ({spec.cost.price_file}) says other prices than when this sweep started; the "
                 "sweep keeps the prices it started with, so that its trials compare (start a new sweep for the new ones)")
            spec = parse_spec(spec_text, prices=state.prices).model_copy(update={"storage_path": spec.storage_path})
        # Before Ray starts: a dead MLflow server or an unusable store fails here, in seconds (sweeps.store).
        tracker = SweepTracker(uri, spec.tracking.experiment or spec.name, (st, f"{spec.name}/{PENDING_FILE}"))
        if state is not None and not tracker.has_run(state.parent_run_id):
            # e.g. its mlflow.db was deleted to start afresh: resuming would fail at the first trial
            raise SweepExists(f"the sweep {spec.name} in {experiment_dir(spec)} was tracked as MLflow run "
                              f"{state.parent_run_id} at {uri}, which that store no longer "
                              "has (was it deleted, or tracking.uri changed?). Run the sweep with --restart to start it "
                              "afresh (the old folder is moved aside), or point tracking.uri at the store that has it")
        if state is not None and (ended := nothing_left(spec, state, tracker.client)):
            # before Ray starts: nothing runs again, and MLflow keeps the answer the sweep gave when it ended
            echo(f"sweep {spec.name} already ended ({ended}): nothing to do, so nothing ran and its MLflow runs are "
                 f"untouched; its answer as stored follows (`sweeps run --restart` runs the spec afresh)")
            os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # as `sweeps report`: one small file
            return load_outcome(tracker.client, state.parent_run_id)
        started_ray = connect_ray(local_runtime_env, echo)
        try:
            with sigterm_as_sigint():  # after ray.init, whose own SIGTERM handler aborts the process
                if started_ray:  # this machine is the whole cluster: no autoscaler will bring more
                    refuse_if_never_fits(spec, ray.cluster_resources())
                elif st.is_local:  # a cluster's nodes may share no disk: every one must see the sweep's storage
                    refuse_unshared_storage(Path(st.uri()))
                try:  # every accelerator type the trials are pinned to, on some node
                    refuse_missing_types(spec, ray.nodes())
                except SpecError as exc:
                    if started_ray:
                        raise
                    # a cluster's autoscaler may add such a node when a trial asks for it (Ray >= 2.50 scales up
                    # for label selectors): said, not refused
                    echo(f"WARNING: {exc.problems[0].message}; its trials wait until the autoscaler adds one")
                start_train_coordinator()
                with tracebacks_to(st, f"{spec.name}/{TRACEBACKS_FILE}") as moved:  # one line a failed trial
                    try:
                        return SweepController(spec, spec_text, echo, state, tracker, lease=lease).run()
                    finally:
                        if moved.written:
                            echo(f"Ray Tune's traceback of each failed trial ({moved.written}): {moved.shown}")
        finally:
            if started_ray:
                ray.shutdown()
