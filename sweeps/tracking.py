"""MLflow tracking, driver side: one parent run per sweep, one nested child run per trial.

Uses `MlflowClient` with explicit run ids (no global active run). Only clean metrics go to MLflow:
`group/name_unit` keys (the unit a suffix, e.g. `time/step_ms`, `throughput/samples_per_s`: MLflow 3 refuses
`(`, `)` and `%` in metric names) with finite numeric values; a string under such a key (`device/name`)
becomes a tag; nothing of Tune's noise.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from sweeps.store import TrackingUnavailable, check_reachable, open_store, refusals_said  # noqa: F401 - the first two re-exported
from trainables.contract import METRIC_KEY, is_metric
from trainables.storage import Storage, StorageError

logger = logging.getLogger(__name__)
_MAX_PARAM_LEN = 6000
_MAX_NOTE_LEN = 5000  # MLflow's tag values hold up to 8000 characters
NOTE_TAG = "mlflow.note.content"  # a run's or an experiment's description in the UI (markdown)
EXPERIMENT_NOTE_LEAD = "Latest sweep **"  # how an experiment description this module wrote begins
LAST_ANSWER_TAG = "sweeps.last_answer"  # an experiment's last answer that a sweep gave: "<sweep>\t<run id>\t<answer>"


def _versions() -> dict[str, str]:
    out = {"sweep.python": platform.python_version()}
    for pkg in ("ray", "torch", "optuna", "mlflow"):
        try:
            out[f"sweep.version.{pkg}"] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _artifact_location(uri: str, experiment: str) -> str | None:
    """For a sqlite store, keep artifacts next to the database (not in the cwd)."""
    parsed = urlparse(uri)
    if parsed.scheme != "sqlite":
        return None
    db = Path(uri.removeprefix("sqlite:///")).resolve()
    return (db.parent / "mlartifacts" / experiment).as_uri()


def child_runs(client: MlflowClient, experiment_id: str, parent_id: str) -> list[Any]:
    """A sweep's trial runs: the children of its parent run (each tagged `sweep.trial_id`)."""
    return list(client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'", max_results=50_000))


class SweepTracker:
    """Parent/child MLflow runs for one sweep. Child runs are keyed by Tune trial id.

    Per-trial calls never raise: when the store fails mid-sweep they are buffered, in order, and
    replayed on the next call that succeeds; what is still pending at the end is written to
    `pending_path` (and reported), so no result is dropped silently: a local file, or a file in the sweep's
    storage (`(Storage, key)`: a local folder or a URI, `trainables.storage`).
    """

    def __init__(self, uri: str, experiment: str, pending_path: Path | tuple[Storage, str] | None = None) -> None:
        self.uri = uri
        self.client = open_store(uri)  # checked, created under a lock where new: `sweeps.store`
        self.experiment = experiment
        with refusals_said(uri, f"to read or create the experiment {experiment!r}"):  # a team server's permissions
            self.experiment_id = self._experiment(experiment)
        self.parent_id: str | None = None
        self._children: dict[str, str] = {}
        self.pending: list[tuple[str, tuple[Any, ...]]] = []
        self.pending_path = (Storage(str(pending_path.parent)), pending_path.name) if isinstance(pending_path, Path) \
            else pending_path
        self.degraded_reason = ""
        self.sweep_name = ""

    def _do(self, method: str, *args: Any) -> None:
        """Run a per-trial tracking call now, or buffer it (and everything after it) on failure."""
        self.pending.append((method, args))
        self.flush()

    def flush(self) -> bool:
        while self.pending:
            method, args = self.pending[0]
            try:
                getattr(self, f"_{method}")(*args)
            except Exception as exc:  # noqa: BLE001 - any store failure: keep the call, retry later
                if not self.degraded_reason:
                    logger.warning("MLflow tracking failed (%s); buffering results and retrying", exc)
                self.degraded_reason = f"{type(exc).__name__}: {exc}"[:300]
                return False
            self.pending.pop(0)
        return True

    def dump_pending(self) -> Path | str | None:
        """Add the calls that never reached MLflow to a JSON-lines file; returns its path (its URI in a store)."""
        if not self.pending or self.pending_path is None:
            return None
        st, key = self.pending_path
        # a Storage argument (`log_files`) is written as its URI, any secret in it masked (`Storage.__str__`)
        st.append_text(key, "".join(json.dumps({"method": method, "args": args}, default=str) + "\n"
                                    for method, args in self.pending))
        return Path(st.uri(key)) if st.is_local else str(st.child(key))

    # The per-trial actions, one verb each. Each is buffered when the store fails (`_do`) and carried out by
    # its private twin (`_start_trial` for `start_trial`, ...), which talks to MLflow directly.
    def start_trial(self, trial_id: str, number: int, params: dict[str, Any]) -> None:
        """Open the trial's child run (or reopen it, for a resumed trial) and log its params."""
        self._do("start_trial", trial_id, number, params)

    def log_result(self, trial_id: str, result: dict[str, Any], step: int) -> None:
        """Log a report's metrics (numbers) and facts (text, as tags) at `step`; other entries are dropped."""
        clean = {k: v for k, v in result.items() if is_metric(k, v) or (isinstance(v, str) and METRIC_KEY.match(k))}
        self._do("log_result", trial_id, clean, step)

    def end_trial(self, trial_id: str, ok: bool, kind: str = "ok", reason: str = "",
                  tags: dict[str, str] | None = None) -> None:
        """Close the trial's run with its status, reason and tags."""
        self._do("end_trial", trial_id, ok, kind, reason, tags or {})

    def log_files(self, trial_id: str, folder: Storage, artifact_path: str) -> None:
        """Log a folder's files as the trial run's artifacts under `artifact_path` (e.g. its ranks' traces).

        The folder is in the sweep's storage (`trainables.storage`: local or a URI), fetched from there when the
        call is made (a buffered call: when replayed)."""
        self._do("log_files", trial_id, folder, artifact_path)

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        # MLflow's own mark of a model-training experiment; the 3.17 UI does not pick its view from it (checked),
        # so every URL this module prints carries TRAINING_VIEW as well.
        return str(self.client.create_experiment(name, artifact_location=_artifact_location(self.uri, name),
                                                 tags={"mlflow.experimentKind": "custom_model_development"}))

    def start_sweep(self, name: str, description: str, spec_text: str, tags: dict[str, str]) -> str:
        all_tags = {**_versions(), **tags, "sweep.name": name}
        sha = _git_sha()
        if sha:
            all_tags["sweep.git_sha"] = sha
        if description:
            all_tags[NOTE_TAG] = description
        with refusals_said(self.uri, f"to create runs in the experiment {self.experiment!r}"):  # READ, not EDIT
            run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        self.parent_id, self.sweep_name = run.info.run_id, name
        self.client.log_text(self.parent_id, spec_text, "spec.yaml")
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        self._describe_experiment(f"running since {started}; its answer replaces this line when it ends.")
        return self.parent_id

    def has_run(self, run_id: str) -> bool:
        """Whether the store holds the run, not deleted (False only when it says so)."""
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode

        try:
            return bool(self.client.get_run(run_id).info.lifecycle_stage != "deleted")
        except MlflowException as exc:
            if exc.error_code == ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
                return False
            raise

    def resume_sweep(self, parent_id: str) -> list[Any]:
        """Reattach to a sweep's parent run; returns its child runs (one per trial, by tag)."""
        parent = self.client.get_run(parent_id)
        self.parent_id, self.sweep_name = parent_id, parent.data.tags.get("sweep.name", parent.info.run_name or "")
        self.experiment_id = parent.info.experiment_id
        resumed = int(parent.data.tags.get("sweep.resumed", "0")) + 1
        self.client.set_tag(parent_id, "sweep.resumed", str(resumed))
        self.client.update_run(parent_id, status="RUNNING")
        children = child_runs(self.client, self.experiment_id, parent_id)
        for child in children:
            trial_id = child.data.tags.get("sweep.trial_id")
            if trial_id in self._children:
                logger.warning("two MLflow runs claim trial %s: %s and %s", trial_id, self._children[trial_id], child.info.run_id)
            elif trial_id:
                self._children[trial_id] = child.info.run_id
        return children

    def _start_trial(self, trial_id: str, number: int, params: dict[str, Any]) -> str:
        assert self.parent_id is not None, "start_sweep() first"
        run_id = self._children.get(trial_id)
        if run_id is None:
            run = self.client.create_run(
                self.experiment_id,
                run_name=f"trial-{number:03d}-{trial_id}",
                tags={"mlflow.parentRunId": self.parent_id, "sweep.trial_id": trial_id, "sweep.status": "running"},
            )
            run_id = self._children[trial_id] = run.info.run_id
        else:  # a resumed sweep restarts an unfinished trial (or a replayed call): same run, no duplicate
            self.client.set_tag(run_id, "sweep.status", "running")
            if "sweep.failure_reason" in self.client.get_run(run_id).data.tags:  # why it was interrupted
                self.client.delete_tag(run_id, "sweep.failure_reason")
            self.client.update_run(run_id, status="RUNNING")
        # Idempotent: MLflow accepts a param logged again with the same value.
        self.client.log_batch(run_id, params=[Param(k, str(v)[:_MAX_PARAM_LEN]) for k, v in params.items()])
        return run_id

    def run_id(self, trial_id: str) -> str | None:
        return self._children.get(trial_id)

    def _log_result(self, trial_id: str, result: dict[str, Any], step: int) -> None:
        run_id = self._children[trial_id]
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in result.items() if is_metric(k, v)]
        # String facts the loop reports (device/*, gpu/clock_reasons) become tags.
        tags = [RunTag(k, v) for k, v in result.items() if isinstance(v, str) and METRIC_KEY.match(k)]
        if metrics or tags:
            self.client.log_batch(run_id, metrics=metrics, tags=tags)

    def _log_files(self, trial_id: str, folder: Storage, artifact_path: str) -> None:
        try:
            if not folder.exists():  # gone (a re-run call after the sweep cleaned up): nothing left to log
                return
            with folder.fetched("") as local:  # now, not when the call was made: a buffered call's copy would be gone
                self.client.log_artifacts(self._children[trial_id], str(local), artifact_path)
        except StorageError as exc:  # the sweep's storage, not MLflow: said, and the calls after it go on
            logger.warning("could not log %s of trial %s to MLflow: %s", artifact_path, trial_id, exc)

    def _end_trial(self, trial_id: str, ok: bool, kind: str = "ok", reason: str = "",
                   tags: dict[str, str] | None = None) -> None:
        run_id = self._children[trial_id]
        for key, value in (tags or {}).items():
            self.client.set_tag(run_id, key, value[:_MAX_PARAM_LEN])
        self.client.set_tag(run_id, "sweep.status", kind)
        if reason:
            self.client.set_tag(run_id, "sweep.failure_reason", reason[:_MAX_PARAM_LEN])
        self.client.set_terminated(run_id, "FINISHED" if ok else "KILLED" if kind == "interrupted" else "FAILED")

    def end_sweep(self, status: str, metrics: dict[str, float], tags: dict[str, str],
                  unsaid: tuple[str, ...] = ()) -> None:
        """Close the parent run with its metrics, tags and status.

        FINISHED; KILLED when the sweep stopped early and can be resumed; FAILED when it ended and no trial
        finished. `unsaid`: tags this driver's conclusion does not hold, removed where an earlier driver of the
        sweep set them (a resumed sweep that finished is no longer "interrupted")."""
        assert self.parent_id is not None
        now = int(time.time() * 1000)
        self.client.log_batch(
            self.parent_id,
            metrics=[Metric(k, v, now, 0) for k, v in metrics.items() if is_metric(k, v)],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        if unsaid:
            held = self.client.get_run(self.parent_id).data.tags
            for key in unsaid:
                if key in held and key not in tags:
                    self.client.delete_tag(self.parent_id, key)
        self.client.set_terminated(self.parent_id, status)

    def set_note(self, markdown: str, answered: bool = True) -> None:
        """Set the parent run's description in the UI (MLflow's `mlflow.note.content` tag, markdown).

        Its first paragraph (the answer) also becomes the experiment's latest news (`experiment_note`); a sweep
        that gave no answer (`answered` False: no trial finished) is news too, but the experiment's last answer
        stays beside it."""
        assert self.parent_id is not None
        self.client.set_tag(self.parent_id, NOTE_TAG, markdown[:_MAX_NOTE_LEN])
        self._describe_experiment(markdown.split("\n\n", 1)[0], answered=answered)

    def _describe_experiment(self, news: str, answered: bool = False) -> None:
        """Write the experiment's description unless someone else wrote it (one that `experiment_note` did
        not make is the user's own, kept). An `answered` sweep's news becomes the experiment's last answer; any
        other news (a sweep running, or one that ended with no answer) keeps the last answer beside it. It is not
        worth failing a sweep over (the store may let this user log runs but not edit the experiment)."""
        from mlflow.exceptions import MlflowException

        assert self.parent_id is not None
        try:
            tags = self.client.get_experiment(self.experiment_id).tags
            current = tags.get(NOTE_TAG, "")
            if current.strip() and not current.startswith(EXPERIMENT_NOTE_LEAD):
                return
            if answered:
                self.client.set_experiment_tag(self.experiment_id, LAST_ANSWER_TAG,
                                               f"{self.sweep_name}\t{self.parent_id}\t{news}"[:_MAX_PARAM_LEN])
                last = None
            else:
                sweep, run, answer = (tags.get(LAST_ANSWER_TAG, "").split("\t", 2) + ["", "", ""])[:3]
                last = (sweep, answer, run) if answer else None
            note = experiment_note(self.sweep_name, news, self.parent_id, last)
            self.client.set_experiment_tag(self.experiment_id, NOTE_TAG, note)
        except MlflowException as exc:
            logger.warning("could not set the description of experiment %s: %s", self.experiment_id, exc)


def experiment_note(sweep: str, news: str, parent_run_id: str, last: tuple[str, str, str] | None = None) -> str:
    """Write the experiment's description: the latest sweep's news first.

    The UI shows an experiment's description folded to its first line above the runs table, and its first words
    in the experiments list. When that news is not an answer, the `last` one an earlier sweep gave follows (its
    sweep, answer, parent run); then what the experiment holds and how to read it, the same for every sweep."""
    before = f"Last answer, sweep **{last[0]}** (parent run `{last[2]}`): {last[1]}\n\n" if last else ""
    text = (f"{EXPERIMENT_NOTE_LEAD}{sweep}**: {news}\n\n{before}"
            "This experiment holds the sweeps of the `sweeps` service: one parent run per sweep, named after it, "
            "whose description is that sweep's answer and whose `report/summary.html` artifact is its full report; "
            "under it, one child run per trial (`trial-NNN-<id>`: the configuration as params, the measurements as "
            "metrics; expand the parent's row to list them). In a terminal: `sweeps report <sweep name>`. "
            f"The latest sweep's parent run: `{parent_run_id}`.")
    return text[:_MAX_NOTE_LEN]


def experiment_of(uri: str, run_id: str) -> str | None:
    """The experiment id of a run, or None when the store cannot say (it went away after the sweep)."""
    from mlflow.exceptions import MlflowException

    try:
        return str(MlflowClient(tracking_uri=uri).get_run(run_id).info.experiment_id)
    except MlflowException as exc:
        logger.warning("could not read run %s from %s: %s", run_id, uri, exc)
        return None


# MLflow 3.17's UI opens its GenAI view (an experiment's "Overview" of traces, a run under "Evaluations")
# unless the hash route's query says otherwise; it reads this before the browser's stored choice.
TRAINING_VIEW = "workflowType=machine_learning"


def _ui(base: str, route: str) -> str:
    """`base`'s UI at a hash route, in the Model training view."""
    return f"{base.rstrip('/')}/#/{route}{'&' if '?' in route else '?'}{TRAINING_VIEW}"


def experiments_url(base: str) -> str:
    """The list of experiments in the MLflow 3 UI served at `base`."""
    return _ui(base, "experiments")


def experiment_url(base: str, experiment_id: str) -> str:
    """An experiment's runs table (one row per sweep, its trials nested) in the UI served at `base`."""
    return _ui(base, f"experiments/{experiment_id}/runs")


def run_url(base: str, experiment_id: str, run_id: str, artifact: str = "") -> str:
    """A run's page in the MLflow 3 UI served at `base`; with `artifact`, that artifact in the run's viewer."""
    return _ui(base, f"experiments/{experiment_id}/runs/{run_id}" + (f"/artifacts/{artifact}" if artifact else ""))


def compare_url(base: str, experiment_id: str, run_ids: list[str]) -> str:
    """MLflow's compare view for these runs (the UI's own route: `#/compare-runs?runs=<JSON>&experiments=<JSON>`)."""
    runs, exps = json.dumps(run_ids, separators=(",", ":")), json.dumps([experiment_id])
    return _ui(base, f"compare-runs?runs={quote(runs, safe='')}&experiments={quote(exps, safe='')}")


def _local_store(uri: str, cwd: Path) -> str | None:
    """The `--backend-store-uri` for a local store as the user types it from `cwd` (a path under the cwd
    stays relative, anything else absolute); None for a store that is not local."""
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite" and uri.startswith("sqlite:///"):
        db = Path(os.path.normpath(cwd / uri.removeprefix("sqlite:///")))  # a relative path is from the cwd
        return f"sqlite:///{db.relative_to(cwd)}" if db.is_relative_to(cwd) else f"sqlite:///{db}"
    if parsed.scheme == "file" or (parsed.scheme == "" and not uri.startswith("databricks")):
        path = Path(os.path.normpath(cwd / (parsed.path if parsed.scheme == "file" else uri)))
        return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)
    return None


UI_PORT = 5000


def ui_hint(uri: str, cwd: str | None = None) -> str:
    """How to see the store in MLflow's UI: the server's address, or the command that serves a local store."""
    if uri.startswith(("http://", "https://")):
        return f"open {experiments_url(uri)}"
    here = Path(os.path.abspath(cwd or os.getcwd()))
    store = _local_store(uri, here)
    if store == "sqlite:///mlflow.db" and _is_this_repo(here):
        return f"make ui   (serves the UI on 127.0.0.1:{UI_PORT})"  # the URLs to open follow
    return f"{_mlflow_command(here)} ui --backend-store-uri {store or uri} --host 127.0.0.1 --port {UI_PORT}"


def _mlflow_command(here: Path) -> str:
    """`mlflow` when the shell finds it, else this interpreter's (a venv not activated), from `here`."""
    import shutil
    import sys

    if shutil.which("mlflow"):
        return "mlflow"
    own = Path(sys.executable).parent / "mlflow"
    return str(own.relative_to(here)) if own.is_relative_to(here) else str(own)


def _is_this_repo(path: Path) -> bool:
    makefile = path / "Makefile"
    return makefile.is_file() and "\nui:" in makefile.read_text() and (path / "sweeps" / "cli.py").is_file()


def ui_links(uri: str, experiment_id: str | None, parent_run_id: str, trial_run_ids: list[str],
             cwd: str | None = None) -> list[str]:
    """Write the last lines of a sweep: where its answer is in MLflow's UI.

    A tracking server's own URLs; for a local store, the command that serves it, then the URLs that server will
    have. Every URL opens the UI's Model training view (`TRAINING_VIEW`)."""
    served = uri.startswith(("http://", "https://"))
    base = uri if served else f"http://127.0.0.1:{UI_PORT}"
    lines = [f"MLflow: parent run {parent_run_id} in {uri}"]
    if not served:
        lines.append(f"Serve the UI:  {ui_hint(uri, cwd)}")
    if experiment_id is None:
        return [*lines, f"Open the UI:   {experiments_url(base)} (the parent run's experiment could not be read)"]
    then = "then open" if not served else "Open"
    lines.append(f"{then} the answer:   {run_url(base, experiment_id, parent_run_id)}")
    lines.append(f"The full report:    {run_url(base, experiment_id, parent_run_id, 'report/summary.html')}")
    if len(trial_run_ids) >= 2:
        lines.append(f"Compare the trials: {compare_url(base, experiment_id, trial_run_ids)}")
    lines.append(f"Every sweep here:   {experiment_url(base, experiment_id)}")
    return lines
