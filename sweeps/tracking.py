"""MLflow tracking, driver side: one parent run per sweep, one nested child run per trial.

Uses `MlflowClient` with explicit run ids (no global active run). Only clean metrics go
to MLflow: `group/name(unit)` keys with finite numeric values; nothing of Tune's noise.
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from trainables.contract import METRIC_KEY, is_metric

logger = logging.getLogger(__name__)
_MAX_PARAM_LEN = 6000


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


class SweepTracker:
    """Parent/child MLflow runs for one sweep. Child runs are keyed by Tune trial id."""

    def __init__(self, uri: str, experiment: str) -> None:
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = self._experiment(experiment)
        self.parent_id: str | None = None
        self._children: dict[str, str] = {}

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        # The experiment kind makes MLflow 3's UI open the training-runs view, not the GenAI one.
        return str(self.client.create_experiment(name, artifact_location=_artifact_location(self.uri, name),
                                                 tags={"mlflow.experimentKind": "custom_model_development"}))

    def start_sweep(self, name: str, description: str, spec_text: str, tags: dict[str, str]) -> str:
        all_tags = {**_versions(), **tags, "sweep.name": name}
        sha = _git_sha()
        if sha:
            all_tags["sweep.git_sha"] = sha
        if description:
            all_tags["mlflow.note.content"] = description
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        self.parent_id = run.info.run_id
        self.client.log_text(self.parent_id, spec_text, "spec.yaml")
        return self.parent_id

    def start_trial(self, trial_id: str, number: int, params: dict[str, Any]) -> str:
        assert self.parent_id is not None, "start_sweep() first"
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"trial-{number:03d}-{trial_id}",
            tags={"mlflow.parentRunId": self.parent_id, "sweep.trial_id": trial_id, "sweep.status": "running"},
        )
        self._children[trial_id] = run.info.run_id
        self.client.log_batch(
            run.info.run_id, params=[Param(k, str(v)[:_MAX_PARAM_LEN]) for k, v in params.items()]
        )
        return run.info.run_id

    def run_id(self, trial_id: str) -> str | None:
        return self._children.get(trial_id)

    def log_result(self, trial_id: str, result: dict[str, Any], step: int) -> None:
        run_id = self._children[trial_id]
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in result.items() if is_metric(k, v)]
        # String facts the loop reports (device/*, gpu/clock_reasons) become tags.
        tags = [RunTag(k, v) for k, v in result.items() if isinstance(v, str) and METRIC_KEY.match(k)]
        if metrics or tags:
            self.client.log_batch(run_id, metrics=metrics, tags=tags)

    def end_trial(self, trial_id: str, ok: bool, kind: str = "ok", reason: str = "", tags: dict[str, str] | None = None) -> None:
        run_id = self._children[trial_id]
        for key, value in (tags or {}).items():
            self.client.set_tag(run_id, key, value[:_MAX_PARAM_LEN])
        self.client.set_tag(run_id, "sweep.status", kind)
        if reason:
            self.client.set_tag(run_id, "sweep.failure_reason", reason[:_MAX_PARAM_LEN])
        self.client.set_terminated(run_id, "FINISHED" if ok else "FAILED")

    def end_sweep(self, ok: bool, metrics: dict[str, float], tags: dict[str, str]) -> None:
        assert self.parent_id is not None
        now = int(time.time() * 1000)
        self.client.log_batch(
            self.parent_id,
            metrics=[Metric(k, v, now, 0) for k, v in metrics.items() if is_metric(k, v)],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        self.client.set_terminated(self.parent_id, "FINISHED" if ok else "FAILED")


def ui_hint(uri: str) -> str:
    if uri.startswith("sqlite:///") and os.path.abspath(uri.removeprefix("sqlite:///")) == os.path.abspath("mlflow.db"):
        return "make ui   (then open http://127.0.0.1:5000)"
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1"
