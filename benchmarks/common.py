"""Helpers shared by the benchmarks: run the loop in a fresh process, take medians, record."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results.jsonl"


def run_loop(args: list[str], nproc: int = 1, timeout_s: float = 600) -> dict[str, Any]:
    """Run `trainables.launch` (under torchrun when nproc > 1) and return its final report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "metrics.jsonl"
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1 else []
        cmd = [sys.executable, *launcher, "-m", "trainables.launch", *args, "--metrics-path", str(out)]
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        return dict(json.loads(out.read_text().splitlines()[-1]))


def run_plain(script: str, args: list[str], nproc: int = 2, timeout_s: float = 600) -> dict[str, Any]:
    """Run a plain reference loop (`plain_ddp.py`, `plain_fsdp.py`) under torchrun; return the JSON rank 0 wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(REPO / "benchmarks" / script), *args, "--out", str(out)]
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        return dict(json.loads(out.read_text()))


def summary(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def machine() -> dict[str, Any]:
    """What produced a row: CPU, memory, GPU (or none), library versions and the code's commit."""
    from importlib.metadata import PackageNotFoundError, version

    import psutil
    import torch

    from trainables.devinfo import cpu_isa_flags, cpu_model

    versions = {}
    for pkg in ("torch", "ray", "optuna", "mlflow"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    sha = os.environ.get("GIT_SHA", "")  # said by whoever copied the tree (its .git may be absent or stale)
    if not sha:
        try:
            sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                 text=True).stdout.strip()
        except OSError:  # no git on this machine
            sha = ""
    return {"cpu": cpu_model(), "isa": cpu_isa_flags(), "cores": os.cpu_count(), "python": platform.python_version(),
            "memory_gib": round(psutil.virtual_memory().total / 1024**3, 1),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
            "versions": versions, "git_sha": sha}


def record(name: str, command: str, rows: list[dict[str, Any]]) -> None:
    append_entry(make_entry(name, command, rows))


def table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(fmt, rows)])


class TrialTimes:
    """Each trial's wall time (Tune start -> end), read from a sweep's progress lines: pass `echo`."""

    _START = re.compile(r"^\[trial (\d+)/\d+\] \S+ started")
    _END = re.compile(r"^\[trial (\d+)/\d+\] ")

    def __init__(self) -> None:
        self.starts: dict[int, float] = {}
        self.walls: dict[int, float] = {}

    def echo(self, line: str) -> None:
        now = time.monotonic()
        if m := self._START.match(line):
            self.starts[int(m.group(1))] = now
        elif (m := self._END.match(line)) and int(m.group(1)) in self.starts:
            self.walls[int(m.group(1))] = now - self.starts[int(m.group(1))]


def make_entry(name: str, command: str, rows: list[dict[str, Any]], machine_info: dict[str, Any] | None = None,
               date: str | None = None, **extra: Any) -> dict[str, Any]:
    """A results.jsonl entry like `record` writes; `machine_info` and `date` default to this machine and today
    (pass them for figures recorded from another machine's run), `extra` adds keys (e.g. a stage, provenance)."""
    return {"benchmark": name, "date": date or dt.date.today().isoformat(), "command": command,
            "machine": machine_info if machine_info is not None else machine(), **extra, "rows": rows}


def append_entry(entry: dict[str, Any], path: Path = RESULTS) -> int:
    """Append one entry to results.jsonl (or `path`); returns its 1-based line number."""
    with open(path, "a+") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        f.seek(0)
        return sum(1 for _ in f)
