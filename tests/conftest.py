"""Shared fixtures. Ray tests share one local cluster (2 CPUs, own temp dir, own token)."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.reap import TAG, started_here

REPO = Path(__file__).resolve().parents[1]

# Before anything imports Ray: the auth token lives in a temp dir, never in $HOME/.ray.
_AUTH_DIR = tempfile.mkdtemp(prefix="sweeps-auth-")
_TOKEN = Path(_AUTH_DIR) / "token"
_TOKEN.write_text(secrets.token_hex(32))
os.environ["RAY_AUTH_TOKEN_PATH"] = str(_TOKEN)
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.pop("RAY_ADDRESS", None)
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# The sweep's quick speed-of-light figures are cached per user: here once per test session, not in $HOME.
os.environ["XDG_CACHE_HOME"] = os.path.join(_AUTH_DIR, "cache")
# Every Ray node a test starts (ray.init, `ray start`, ray.cluster_utils) inherits these; `make test` is bound by
# its 2 cores (benchmarks/suite_cpu.py, results.jsonl line 126), and neither is work a test asks for:
# - no workers pre-started for the first driver (one per CPU of the node it connects to, ~1 CPU-s each, never
#   used: a sweep's actors carry their own runtime env); most of a run's 62 unused "IDLE" workers (109 CPU-s)
#   are started some other way (not found which) and still are;
# - the log monitor looks for new log files every 0.5 s, not every 0.1 s (its glob grows with every worker
#   a session cluster has had: 120 CPU-s of a run); a new log file's first lines reach a driver up to 0.5 s later.
for _name, _value in (("RAY_prestart_worker_first_driver", "0"), ("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")):
    os.environ.setdefault(_name, _value)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_AUTH_DIR, ignore_errors=True)


# pid -> the test after which that Ray process was first seen: a leak names the test that left it.
_FIRST_SEEN: dict[int, str] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield
    now = _ray_processes()  # ~10 ms a test
    for pid in [p for p in _FIRST_SEEN if p not in now]:  # gone: a later process with its pid is another
        del _FIRST_SEEN[pid]
    for pid in now:
        _FIRST_SEEN.setdefault(pid, item.nodeid)


_RAY_MARKS = ("raylet", "gcs_server", "ray::", "default_worker.py", "dashboard/agent.py", "log_monitor.py",
              "runtime_env/agent", "ray/autoscaler", "dashboard.py")


# `make test` runs two pytest processes at once (pytest-xdist, see pytest_collection_modifyitems): each
# checks only the Ray processes it started, which inherit this tag through their environment.
os.environ[TAG] = str(os.getpid())


def _ray_processes() -> dict[int, str]:
    import psutil

    found = {}
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.Error, TypeError):
            continue
        if p.info["status"] != psutil.STATUS_ZOMBIE and any(m in cmd for m in _RAY_MARKS) and started_here(p):
            found[p.info["pid"]] = cmd[:120]
    return found


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` runs two pytest processes (`-n 2 --dist loadgroup`): a serial run left the 2 cores idle
    about a third of its time (Ray and torch start-ups, timeouts, polls). The tests on a session Ray cluster
    run in lanes, one after another on one cluster as in a serial run; every other test (unit tests, and
    those that start their own clusters, torchrun groups or Ray heads) goes to whichever process is free."""
    for item in items:
        if "ray_cluster" in item.fixturenames:
            lane = "ray_faults" if item.path.name in _OWN_CLUSTER else "ray_cluster"
            item.add_marker(pytest.mark.xdist_group(lane))
            item.add_marker(pytest.mark.ray)  # `make test-fast` (-m "not ray") leaves every Ray test out


# The fault and resume sweeps (they crash a rank, hang a peer, fill a disk, kill the driver) take their own
# session cluster, in the other process. One lane of all of them was the run's longest path (472 s of a
# 482 s run, the other process idle at the end); two took 314 s and 233 s of a 473 s run (docs/benchmarks.md).
_OWN_CLUSTER = frozenset({"test_loop_faults.py", "test_resume.py"})


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist groups by a suffix it writes into each grouped test's id; pytest 9.2 ignores that
    write (pytest-xdist issue 1386) and the groups would silently split, each process starting its own
    cluster and shared sweeps: say so before any test runs."""
    if config.getoption("dist", "no") == "loadgroup" and tuple(map(int, pytest.__version__.split(".")[:2])) >= (9, 2):
        raise pytest.UsageError(f"pytest {pytest.__version__} drops pytest-xdist's --dist loadgroup groups "
                                "(pytest-xdist issue 1386): install pytest<9.2, as pyproject.toml's dev extra does")


def _home_ray() -> dict[str, float]:
    home = Path.home() / ".ray"
    return {str(p): p.stat().st_mtime for p in home.rglob("*")} if home.exists() else {}


@pytest.fixture(scope="session", autouse=True)
def leaves_nothing_behind() -> Iterator[None]:
    """After every test: no Ray process the tests started is left running, nothing was written to
    $HOME/.ray, and no torch.distributed process group is left open in this process."""
    before, home_before = _ray_processes(), _home_ray()
    yield
    import time

    deadline = time.monotonic() + 60  # Ray reaps its workers asynchronously after shutdown
    while (leaked := {p: c for p, c in _ray_processes().items() if p not in before}) and time.monotonic() < deadline:
        time.sleep(0.5)
    named = {p: f"{c.strip()} (first seen after {_FIRST_SEEN.get(p, 'the last test')})" for p, c in leaked.items()}
    assert not leaked, f"Ray processes left behind by the tests: {named}"
    assert _home_ray() == home_before, "the tests wrote to $HOME/.ray (point RAY_AUTH_TOKEN_PATH and temp dirs elsewhere)"
    import torch.distributed as dist

    assert not (dist.is_available() and dist.is_initialized()), "a test left a torch.distributed process group open"


@pytest.fixture(scope="session")
def auth_token_path() -> Path:
    return _TOKEN


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A real local Ray cluster for the session, stopped through its own handle."""
    import ray

    from sweeps.service.resources import LEAN_TRAIN_ENV  # what `sweeps run` uses on a local cluster
    from tests.helpers.reap import ray_node_pids, reap, tree

    temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths are length-limited
    # Workers can import test-only trainables (tests.helpers.faulty) from the repo, as a job's working dir would.
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp_dir, object_store_memory=200 * 1024**2,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), **LEAN_TRAIN_ENV}})
    try:
        yield
    finally:
        ours = tree(ray_node_pids())  # this cluster's nodes and the workers below them, listed while alive
        ray.shutdown()
        reap(ours, 30, "the session's Ray cluster")
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def new_store(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], Path]:
    """`new_store(path)` puts an empty MLflow sqlite store at `path` and returns it: a copy of one made
    once per session, since MLflow builds a new store's tables by running its migrations (~1 s each)."""
    template = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    from mlflow.tracking import MlflowClient

    MlflowClient(f"sqlite:///{template}").search_experiments()  # creates the tables

    def copy(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, path)
        return path

    return copy


SMALL_SWEEP = """\
name: test-sweep
description: two precisions, one unsupported on CPU
trainable: {{name: mlp-tabular, params: {{num_train_rows: 2048}}}}
space:
  batch_size: {{type: categorical, choices: [32, 64]}}
  precision: {{type: categorical, choices: ["32", "tf32"]}}
  lr: {{type: float, low: 1.0e-3, high: 1.0e-2, log: true}}
  num_dataloader_workers: 0
  pin_memory: false
objective:  # two objectives and a bound: the result is a Pareto front of the feasible trials
  metric: [throughput/samples_per_s, loss/val]
  mode: [max, min]
  constraints: [{{metric: loss/val, max: 1000.0}}]
budget: {{num_trials: 3, num_steps: 30, num_warmup_steps: 4, report_interval_s: 0.01}}
scaling: {{num_workers: 2, cpus_per_worker: 1}}
telemetry: {{period_s: 0.05}}
tracking: {{uri: "sqlite:///{db}", experiment: test-exp}}
storage_path: {storage}
seed: 3
"""


@pytest.fixture(scope="session")
def small_sweep(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory, new_store: Callable[[Path], Path]) -> tuple:
    """One real 3-trial sweep (Tuner + OptunaSearch + TorchTrainer per trial + MLflow store),
    shared by the tests that read its results; returns (outcome, tracking uri, progress lines)."""
    from sweeps.service.runner import run_sweep
    from sweeps.spec import parse_spec

    tmp = tmp_path_factory.mktemp("small-sweep")
    text = SMALL_SWEEP.format(db=new_store(tmp / "mlflow.db"), storage=tmp / "results")
    lines: list[str] = []
    outcome = run_sweep(parse_spec(text), text, echo=lines.append)
    return outcome, f"sqlite:///{tmp / 'mlflow.db'}", lines


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated datasets are cached once per session."""
    return tmp_path_factory.mktemp("datasets")
