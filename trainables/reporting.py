"""Where the loop's reports go: Ray Train (see `ray_worker`), JSON lines, or a list in tests.

Every rank calls `report` equally often (Ray Train's report is a barrier); only rank 0's
reporters write anything.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Protocol

from trainables.contract import CHECKPOINT_FILE, money_metrics
from trainables.storage import Storage


class Reporter(Protocol):
    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        """Hand on one report; every rank calls this at the same points.

        `checkpoint_dir` (rank 0's; a sharded model's: every rank's, each with its own shard files) holds a
        checkpoint to keep, valid only during the call."""


class JsonlReporter:
    """Appends each report as one JSON line to a file (or stdout), rank 0 only."""

    def __init__(self, path: str | None, rank: int) -> None:
        self._path = path
        self._rank = rank

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        if self._rank != 0:
            return
        line = json.dumps(metrics, sort_keys=True)
        if self._path is None:
            print(line, file=sys.stdout, flush=True)
        else:
            with open(self._path, "a") as f:
                f.write(line + "\n")


class ListReporter:
    """Keeps every report in memory (tests, notebooks)."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.checkpoints: list[bytes] = []  # the checkpoint files handed over, in order

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        self.reports.append(dict(metrics))
        if checkpoint_dir is not None and Path(checkpoint_dir, CHECKPOINT_FILE).exists():  # rank 0's
            with open(f"{checkpoint_dir}/{CHECKPOINT_FILE}", "rb") as f:
                self.checkpoints.append(f.read())


class MultiReporter:
    def __init__(self, *reporters: Reporter) -> None:
        self._reporters = reporters

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        for r in self._reporters:
            r.report(metrics, checkpoint_dir)


class PricedReporter:
    """Adds the money figures (`contract.money_metrics`) to every report, from the trial's hourly price.

    Each report the loop hands on carries them, to Tune's searcher and to MLflow alike."""

    def __init__(self, reporter: Reporter, usd_per_hour: float) -> None:
        self._reporter, self._usd_per_hour = reporter, usd_per_hour

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        metrics.update(money_metrics(self._usd_per_hour, metrics))  # in place: the loop returns its final report
        self._reporter.report(metrics, checkpoint_dir)


def priced(reporter: Reporter, usd_per_hour: float) -> Reporter:
    return PricedReporter(reporter, usd_per_hour) if usd_per_hour > 0 else reporter


def keep_checkpoint(checkpoint_dir: str, directory: str | Path) -> str:
    """Copy the loop's checkpoint files into `directory`, a local folder or a URI; return where they went.

    From the node this rank runs on (`trainables.storage`), latest only, a crash mid-copy never leaving half a
    file: every file under `checkpoint_dir`, rank 0's `CHECKPOINT_FILE` and a sharded model's DCP files, which
    each rank copies from its own folder (their names differ by rank)."""
    where, source = Storage(str(directory)), Path(checkpoint_dir)
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        where.upload(path, path.relative_to(source).as_posix())
    return where.uri()
