"""What a sweep keeps in its storage to be resumed: `<storage_path>/<name>/sweep.json`.

`storage_path` is a local folder or a URI; every read and write there goes through `trainables.storage.Storage`
(`storage(spec)`).

It records the spec (its text and a hash of its validated form), the MLflow parent run and
the token that ties the sweep's searcher, stopper and callback together. Ray Tune keeps the
rest (trial states, the Optuna study) in the same folder. The trial -> MLflow run mapping is
not kept here but on the runs themselves (tag `sweep.trial_id` on each child of the parent).
From these and Tune's saved experiment state, `nothing_left` says whether a saved sweep has anything
left to run: one that already ended is not run again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from sweeps.exits import InputError, StorageProblem
from sweeps.results.outcome import OUT_OF_TIME, UNFINISHED, TrialRow
from sweeps.spec import SpecError, SweepSpec, parse_spec
from sweeps.store import shown_uri, sqlite_path
from trainables.storage import LockHeld, Storage, StorageError, is_uri
from trainables.storage_lease import Lease

STATE_FILE = "sweep.json"


class SweepExists(InputError):
    """Another sweep already lives under this name in the storage path."""


class SweepLocked(InputError):
    """Another process is running this sweep (it holds the sweep's lock)."""


def lock_key(spec: SweepSpec) -> str:
    """`<name>.lock` at the storage root: beside the sweep's folder, not in it (`--restart` moves the folder)."""
    return f"{spec.name}.lock"


@contextlib.contextmanager
def sweep_lock(spec: SweepSpec) -> Iterator[Lease | None]:
    """Hold the sweep's lock for as long as it runs.

    A second `run` or `resume` of it is refused at once (`SweepLocked`, naming the holder). On a local folder, from
    any process on a machine that shares its file locks: the operating system releases the lock when the holding
    process ends, however it ends; the file stays, holding the last holder's name. On a URI, from any machine: a
    lease (`trainables.storage_lease`), yielded, whose `lost` says if another process took it."""
    st = storage(spec)
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "command": " ".join(["sweeps", *sys.argv[1:]]) if sys.argv[1:] else "sweeps"}
    with ExitStack() as stack:
        try:
            lease = stack.enter_context(st.lock(lock_key(spec), holder))
        except LockHeld as held:
            expiry = (f"; its lease was renewed {held.age_s:.0f}s ago, and a driver killed outright frees it after "
                      f"{held.ttl_s:.0f}s" if held.age_s is not None and held.ttl_s is not None else "")
            raise SweepLocked(f"sweep {spec.name} is already running: {_holder(held.holder)}{expiry}. Wait for it to "
                              f"end, or stop it (Ctrl+C there, or kill -TERM its pid; it stays resumable) and then: "
                              f"{resume_command(spec)}; to run this spec beside it, give it another name") from None
        except StorageError as exc:
            raise StorageProblem(str(exc)) from None
        except OSError as exc:
            raise InputError(f"storage_path: cannot write {st} ({exc.strerror}); point storage_path at a "
                             "writable folder") from None
        yield lease


def _holder(h: dict[str, Any]) -> str:
    """Who holds the lock, as its holder wrote it."""
    if not h:
        return "another process holds its lock"
    return f"pid {h.get('pid')} on host {h.get('host')} since {h.get('since')} (`{h.get('command')}`)"


def spec_digest(spec: SweepSpec) -> str:
    """Hash the validated spec.

    Comments, formatting and where it is stored do not count, nor what its price file says now (the sweep keeps
    the prices it read: `SweepState.prices`)."""
    from_file = spec.cost is not None and spec.cost.price_file is not None
    exclude: dict[str, Any] = {"storage_path": True, **({"cost": {"prices"}} if from_file else {})}
    return hashlib.sha256(spec.model_dump_json(exclude=exclude).encode()).hexdigest()


_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # what Ray's job supervisor hands the job's driver


def in_uploaded_job() -> bool:
    """Tell whether this process is the driver of a `ray job submit --working-dir` job.

    Its working directory is then a temporary copy of the upload, which the next job does not see."""
    try:
        config = json.loads(os.environ.get(_JOB_CONFIG_ENV, "") or "{}")
    except ValueError:
        return False
    return bool(((config or {}).get("runtime_env") or {}).get("working_dir"))


def outputs_root() -> Path:
    """Return what the sweep's relative output paths (storage_path, a sqlite store) resolve against.

    The working directory; in a `ray job submit --working-dir` job, `$SWEEPS_HOME` (default `~/sweeps`) on the
    job's node instead, so that the sweep's state and store outlive the job, and what the upload carried
    (a local run's `ray_results/`, `mlflow.db`) never collides with them."""
    if not in_uploaded_job():
        return Path.cwd()
    return Path(os.environ.get("SWEEPS_HOME") or Path.home() / "sweeps").resolve()


def job_banner(state_dir: Storage | Path, uri: str, root: Path) -> str:
    """Say what a sweep says first inside a `ray job submit --working-dir` job: where its state and store live.

    The job's working directory is a temporary copy of the upload, so the banner names where the sweep's state
    and its MLflow store live. `uri` is the store as the sweep opens it (a relative sqlite path made absolute
    under `root`, the job's `outputs_root()`)."""
    home = f"$SWEEPS_HOME ({root}, default ~/sweeps) on this node"
    state_dir = _folder(state_dir)
    inside = state_dir.is_local and Path(state_dir.uri()).is_relative_to(root)
    where = "under " + home if inside else "where storage_path says, on this node" if state_dir.is_local else \
        "in that storage, and nothing of it stays on this node"
    said = f"inside a Ray job: the sweep's state ({state_dir}) lives outside the job's temporary working copy, {where}. "
    db = sqlite_path(uri)
    if db is not None:
        where = ("there too" if inside else f"under {home}") if db.is_relative_to(root) else \
            "where tracking.uri says, on this node"
        return said + (f"Its MLflow store is the sqlite file {db}, {where} (a new experiment's artifacts beside it, "
                       "in mlartifacts/)")
    scheme = urlparse(uri).scheme
    if scheme in ("http", "https"):
        return said + (f"Its MLflow runs go to the tracking server at {shown_uri(uri)}, which keeps them and, with its "
                       "default artifact proxying, their artifacts: nothing of them stays on this node")
    if scheme and scheme not in ("file", "databricks", "sqlite"):  # a database, e.g. postgresql:// or mysql://
        return said + (f"Its MLflow runs go to the database at {shown_uri(uri)}. Their artifacts go to the experiment's "
                       "artifact location; for an experiment this job creates, that is MLflow's default ./mlruns in "
                       "the job's temporary working copy, which the next job does not see: create the experiment "
                       "with an artifact location first, or log through a tracking server")
    return said + f"Its MLflow store is {shown_uri(uri)}"


def storage(spec_or_path: SweepSpec | str) -> Storage:
    """The storage a `storage_path` names: a URI, or a local folder (relative: under `outputs_root()`)."""
    path = spec_or_path if isinstance(spec_or_path, str) else spec_or_path.storage_path
    return Storage(path, base=outputs_root())


def same_spec(saved_text: str, spec: SweepSpec, prices: dict[str, Any] | None = None) -> bool:
    """Tell whether the spec a sweep saved is `spec`.

    Both are validated by this version (a version that adds a field with a default, or moves one, gives both the
    same form), comments, formatting and the storage path not counting. A saved spec this version refuses is
    not the same."""
    try:
        return spec_digest(parse_spec(saved_text, prices=prices)) == spec_digest(spec)
    except SpecError:
        return False


def _folder(where: Storage | Path) -> Storage:
    return where if isinstance(where, Storage) else Storage(str(where))


def experiment_dir(spec: SweepSpec) -> Storage:
    """The sweep's folder in its storage (printed as its path, or its URI with any secret masked)."""
    return storage(spec).child(spec.name)


def resume_command(spec: SweepSpec) -> str:
    where = storage(spec) if in_uploaded_job() and not is_uri(spec.storage_path) else spec.storage_path
    return f"sweeps resume {spec.name} --storage-path {where}"


@dataclass
class SweepState:
    spec_text: str
    token: str
    parent_run_id: str
    tracking_uri: str
    spec_sha256: str = ""
    prices: dict[str, Any] | None = None  # what the spec's price file said when the sweep started (`CostSpec.saved`)
    # each driver's run of the sweep: {"began": epoch s, "held_usd": what its groups and trials held, None until
    # it concluded (a driver killed outright leaves None: its cost is not known)}
    drivers: list[dict[str, Any]] = field(default_factory=list)

    def write(self, exp_dir: Storage | Path) -> None:
        """Into the sweep's folder (`experiment_dir`), whole: a kill never leaves half a file."""
        if not self.spec_sha256:
            self.spec_sha256 = spec_digest(parse_spec(self.spec_text, prices=self.prices))
        _folder(exp_dir).write_text(STATE_FILE, json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, exp_dir: Storage | Path) -> SweepState:
        return cls(**json.loads(_folder(exp_dir).read_text(STATE_FILE)))

    @classmethod
    def find(cls, spec: SweepSpec, spec_text: str, restart: bool = False,
             echo: Callable[[str], None] = print) -> SweepState | None:
        """The state of this sweep to resume, None to start afresh; SweepExists for a clash."""
        st, name = storage(spec), spec.name
        exp_dir = st.child(name)
        if not st.exists(name):
            return None
        if restart:
            aside = f"{name}.old-{time.strftime('%Y%m%d-%H%M%S')}"
            st.move(name, aside)
            echo(f"moved the earlier sweep {name} aside to {st.child(aside)}; starting afresh")
            return None
        how = (f"To continue that one: {resume_command(spec)}. "
               f"To start this one: rename it (name: {name}-2) or run it with --restart, which moves the old "
               f"one aside")
        if not st.exists(name, STATE_FILE):
            if st.exists(name, "tuner.pkl"):
                raise SweepExists(f"{exp_dir} holds a Ray Tune experiment that is not a sweep of this tool. "
                                  f"Rename the sweep (name: {name}-2) or run it with --restart")
            return None
        state = cls.read(exp_dir)
        if not same_spec(state.spec_text, spec, state.prices):
            raise SweepExists(f"a different sweep named {name!r} already exists in {exp_dir} (its spec differs). {how}.")
        from ray import tune

        if not tune.Tuner.can_restore(st.uri(name)):
            echo(f"the earlier run of {name} stopped before Ray Tune saved any state; starting it afresh")
            st.move(name, f"{name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
            return None
        return state


# Ray Tune's end states: a restored run starts neither again (`resume_errored=False`, `restart_errored=False`)
_TUNE_ENDED = ("TERMINATED", "ERROR")
CONCLUDED = ("FINISHED", "FAILED")  # a parent run its last driver concluded: with an answer, or with none


def why_ended(num_trials: int, parent_status: str, parent_tags: dict[str, str], rows: list[TrialRow],
              tune_statuses: list[str]) -> str:
    """Say why a saved sweep has nothing left to run; "" when a resume has work to do, or when that is not certain.

    A sweep ended when its last driver concluded it (its MLflow parent run FINISHED, or FAILED when no trial
    finished: neither stopped before
    its end nor killed while it ran), every trial ended (on its MLflow run and in Tune's saved state, which a
    resume restores), and Tune starts no new one: the budget's trials all ran, or the breaker stopped the
    sweep, or it ran out of configurations or of its time budget."""
    if parent_status not in CONCLUDED or parent_tags.get("sweep.interrupted"):
        return ""
    if any(r.status in UNFINISHED for r in rows) or any(s not in _TUNE_ENDED for s in tune_statuses):
        return ""
    ran = len(tune_statuses)
    if ran >= num_trials:
        return f"all {num_trials} trials of its budget ended"
    if parent_tags.get("sweep.stopped"):
        return f"it stopped early after {ran} of {num_trials} trials ({parent_tags['sweep.stopped']})"
    if parent_tags.get("sweep.exhausted"):
        return f"its space was exhausted after {ran} of {num_trials} trials"
    if any(r.status == "stopped" and r.reason.startswith(OUT_OF_TIME) for r in rows):
        return f"its time budget ran out after {ran} of {num_trials} trials"
    return ""  # e.g. a Ctrl+C between two trials: resume runs the rest


def nothing_left(spec: SweepSpec, state: SweepState, client: Any) -> str:
    """Return `why_ended` for a saved sweep, from its MLflow runs and Ray Tune's experiment state in its folder.

    `client` reads the MLflow runs. Starts nothing: no Ray, no write to MLflow."""
    from sweeps.results.report import rows_from_runs
    from sweeps.tracking import child_runs

    parent = client.get_run(state.parent_run_id)
    if parent.info.status not in CONCLUDED:  # the common case, a stopped sweep: nothing more to read
        return ""
    statuses = tune_statuses(storage(spec).uri(spec.name))
    if statuses is None:
        return ""
    rows = rows_from_runs(child_runs(client, parent.info.experiment_id, state.parent_run_id))
    return why_ended(spec.budget.num_trials, parent.info.status, parent.data.tags, rows, statuses)


def tune_statuses(exp_dir: str) -> list[str] | None:
    """Return the status of every trial in Ray Tune's saved experiment state; None when Tune saved none.

    PENDING, RUNNING, PAUSED, TERMINATED or ERROR, read through Tune's public `ExperimentAnalysis`."""
    from ray.tune import ExperimentAnalysis

    with analysis_quiet():
        try:
            return [str(t.status) for t in ExperimentAnalysis(exp_dir).trials]
        except ValueError:  # "No experiment snapshot file ... was found"
            return None


@contextlib.contextmanager
def analysis_quiet() -> Iterator[None]:
    """Keep Tune's `ExperimentAnalysis` from warning about trials without result files, while inside.

    A trial that failed at once has none, and on a URI no trial has them (`RayTune.tuner`): Tune's analysis at the
    end of every fit would warn "Failed to fetch metrics for N trial(s)", which is not news to the user."""
    quiet = logging.getLogger("ray.tune.analysis.experiment_analysis")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        quiet.setLevel(level)


def load_for_resume(storage_path: str, name: str) -> tuple[SweepSpec, str]:
    """The spec of sweep `name` saved under `storage_path`, for `sweeps resume`."""
    root = storage(storage_path)
    if not root.exists(name, STATE_FILE):
        found = [n for n in root.list() if root.exists(n, STATE_FILE)]
        raise SweepExists(f"no sweep named {name!r} in {root}"
                          + (f"; sweeps there: {', '.join(found)}" if found else "") + ". Check --storage-path")
    state = SweepState.read(root.child(name))
    spec = parse_spec(state.spec_text, f"{root.child(name, STATE_FILE)}", prices=state.prices)
    return spec.model_copy(update={"storage_path": root.uri()}), state.spec_text
