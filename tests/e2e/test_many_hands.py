"""Many hands on one machine, for real: `sweeps run` processes started side by side in one fresh folder,
the same sweep started twice, and the machine refusing what Ray needs (a read-only HOME, a stale
cluster address, a read-only TMPDIR). Each ends with one clear line and its documented exit code;
nothing is lost, no process or temporary folder is left behind (the session's leak check, conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeps.exits import ExitCode
from tests.test_store import read_only

pytestmark = pytest.mark.ray

SMALL = """\
name: {name}
trainable: {{name: mlp-tabular, params: {{num_train_rows: 512}}}}
space: {{batch_size: {{type: categorical, choices: [16, 32]}}}}
search: {{algorithm: grid}}
budget: {{num_trials: 2, num_steps: {steps}, num_warmup_steps: 2, max_window_s: {window}}}
scaling: {{num_workers: 1}}
telemetry: {{period_s: 0}}
"""


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temp folder of the test's own (Ray's socket paths are length-limited): TMPDIR of the
    processes the test starts, so that what they leave there is seen."""
    path = Path(tempfile.mkdtemp(prefix="mh", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _sweeps(args: list[str], cwd: Path, tmp: Path, **env: str) -> subprocess.Popen[str]:
    full = {k: v for k, v in {**os.environ, "TMPDIR": str(tmp), **env}.items() if v != ""}  # "": unset it
    full.pop("RAY_ADDRESS", None)
    return subprocess.Popen([sys.executable, "-m", "sweeps", *args], cwd=cwd, env=full, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_two_sweeps_at_once_share_a_new_store_and_a_second_run_of_one_is_refused(tmp_path: Path,
                                                                                  short_tmp: Path) -> None:
    """Both start in the same new folder (each creating mlflow.db: MLflow's migrations raced there
    before) on local Ray instances of their own; while the first runs, `sweeps run` of its spec is
    refused at once with exit 2, naming the holder."""
    for name in ("alpha", "beta"):  # sampled: each trial measures what else used the machine (issue 51)
        (tmp_path / f"{name}.yaml").write_text(SMALL.format(name=name, steps=100_000, window=4).replace(
            "period_s: 0}", "period_s: 0.5}"))
    runs = {name: _sweeps(["run", f"{name}.yaml"], tmp_path, short_tmp) for name in ("alpha", "beta")}
    lock = tmp_path / "ray_results" / "alpha.lock"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (lock.exists() and lock.read_text()):
        time.sleep(0.2)
    holder = json.loads(lock.read_text())
    t0 = time.monotonic()
    again = subprocess.run([sys.executable, "-m", "sweeps", "run", "alpha.yaml"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, env={**os.environ, "TMPDIR": str(short_tmp)})
    refused_in = time.monotonic() - t0
    held_meanwhile = runs["alpha"].poll() is None  # refused while alpha ran: not after waiting for its lock
    outs = {name: p.communicate(timeout=400) for name, p in runs.items()}
    for name, p in runs.items():
        assert p.returncode == ExitCode.OK, (name, outs[name][0][-3000:], outs[name][1][-3000:])
        said = "".join(outs[name])
        assert "Traceback" not in said and "multiple active Ray instances" not in said, (name, said[-3000:])
    assert again.returncode == ExitCode.BAD_INPUT and held_meanwhile, (refused_in, again.stdout[-2000:], again.stderr[-2000:])
    assert "Ray instance" not in again.stdout + again.stderr, again.stderr[-2000:]  # refused before Ray started
    err = again.stderr.strip().splitlines()
    assert err[-1].startswith("error: sweep alpha is already running: pid ") and f"pid {holder['pid']}" in err[-1], err
    assert "sweeps resume alpha" in err[-1]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    trials = []
    for name in ("alpha", "beta"):
        runs_of = client.search_runs([client.get_experiment_by_name(name).experiment_id])
        parents = [r for r in runs_of if "mlflow.parentRunId" not in r.data.tags]
        assert len(parents) == 1 and len(runs_of) == 3, [(r.info.run_name, r.data.tags.get("sweep.status")) for r in runs_of]
        trials += [r for r in runs_of if "mlflow.parentRunId" in r.data.tags]
    # side by side on 2 cores: every trial measured what else ran, and the other sweep's trials showed as such
    assert all("contention/cpu_other_cores" in r.data.metrics for r in trials), [r.data.metrics for r in trials]
    shared = [r.data.tags["sweep.contended"] for r in trials if "sweep.contended" in r.data.tags]
    assert shared and all(s.startswith("other processes kept") for s in shared), shared
    left = [p.name for p in short_tmp.iterdir() if p.name != "ray"]  # Ray's own session folders stay, as always
    assert not [n for n in left if n.startswith(("sweep-report-", "sweep-spec-", "tmp"))], left


def test_a_name_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(SMALL.format(name='"abc\\n"', steps=2, window=1))
    done = subprocess.run([sys.executable, "-m", "sweeps", "validate", "s.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == ExitCode.BAD_INPUT and "name: must be 1-64 letters" in done.stderr, done.stderr


@pytest.mark.parametrize("case", ["read-only HOME", "stale cluster address", "read-only TMPDIR", "missing token file"])
def test_what_ray_needs_refused_ends_in_one_line_and_exit_5(tmp_path: Path, short_tmp: Path, case: str) -> None:
    (tmp_path / "s.yaml").write_text(SMALL.format(name="env", steps=10, window=1))
    (tmp_path / "d").mkdir()
    env: dict[str, str] = {}
    with read_only(tmp_path / "d") as ro:
        if case == "read-only HOME":  # Ray writes its auth token under ~/.ray
            env = {"HOME": str(ro), "RAY_AUTH_TOKEN_PATH": ""}
            said = f"HOME ({ro}) is not writable"
        elif case == "stale cluster address":  # what a head that died leaves: ray.init() retried it for minutes
            (short_tmp / "ray").mkdir()
            (short_tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:9")
            env = {"RAY_TMPDIR": str(short_tmp)}
            said = "the Ray cluster at 127.0.0.1:9"
        elif case == "missing token file":  # was "AuthenticationError ... (an unexpected error; its traceback ...)"
            env = {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "no-token")}
            said = (f"Ray refused this process's credentials (RAY_AUTH_TOKEN_PATH is set but file cannot be opened or "
                    f"is empty: {tmp_path / 'no-token'}): put the cluster's token in {tmp_path / 'no-token'}")
        else:
            env = {"TMPDIR": str(ro)}
            said = "Ray could not start: OSError: [Errno 30] Read-only file system"
        t0 = time.monotonic()
        p = _sweeps(["run", "s.yaml"], tmp_path, short_tmp, **env)
        out, err = p.communicate(timeout=180)
        took = time.monotonic() - t0
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert p.returncode == ExitCode.ENVIRONMENT and len(lines) == 1 and said in lines[0], (out[-2000:], err[-3000:])
    assert "Traceback" not in err and took < 90, (took, err[-3000:])
    if case == "stale cluster address":
        assert "RAY_ADDRESS=local" in lines[0] and "ray_current_cluster" in lines[0]
    if case == "read-only HOME":
        assert "RAY_AUTH_TOKEN_PATH" in lines[0] and "RAY_AUTH_MODE=disabled" in lines[0]


def test_where_ray_keeps_the_last_cluster_address_is_where_ray_init_reads_it(short_tmp: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The one private access of sweeps.service.connect (Ray has no public name for the file): fails loudly when
    Ray moves it."""
    from ray._private.services import get_ray_address_from_environment

    from sweeps.service.connect import ray_address, ray_address_file

    monkeypatch.setenv("RAY_TMPDIR", str(short_tmp))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address_file() == str(short_tmp / "ray" / "ray_current_cluster")
    assert ray_address() == (None, "no running cluster found")
    (short_tmp / "ray").mkdir()
    Path(ray_address_file()).write_text("127.0.0.1:9")
    assert ray_address()[0] == get_ray_address_from_environment(None, None) == "127.0.0.1:9"
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert ray_address() == (None, "RAY_ADDRESS=local")
