"""Opening the MLflow store (`sweeps.store`): concurrent first uses of one new sqlite file, and every
store that cannot be used failing at once in one line with exit 3 -- a read-only folder or file, a file
that is not a database, a damaged one, a half-created one, an unsupported `file://` store -- while a
reading command never creates a store."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sweeps.cli import main
from sweeps.exits import ExitCode, StoreUnusable
from sweeps.service.saved_state import job_banner
from sweeps.store import DATABASE_SCHEMES, absolute_uri, open_store
from tests.helpers.http_stub import serving


def _tables(db: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(db)) as con:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _open_in_a_process(uri: str, start: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    time.sleep(max(0.0, start - time.time()))  # every process opens the new file at the same moment
    try:
        open_store(uri).search_experiments()
        out.put("ok")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.put(f"{type(exc).__name__}: {exc}")


def test_processes_creating_one_new_store_at_once_wait_for_each_other(tmp_path: Path) -> None:
    """Without the lock, 2 of 3 processes failed in each of 4 tries here ("table latest_metrics already
    exists", "duplicate column name"), and one try left a file of 14 tables that nothing could open."""
    db = tmp_path / "mlflow.db"
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = time.time() + 6.0  # after the interpreters and MLflow have imported
    procs = [ctx.Process(target=_open_in_a_process, args=(f"sqlite:///{db}", start, out)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    said = [out.get(timeout=5) for _ in procs]
    assert said == ["ok"] * 3, said
    from mlflow.store.db.base_sql_model import Base

    assert set(Base.metadata.tables) <= _tables(db)  # fully created
    open_store(f"sqlite:///{db}", create=False).search_experiments()  # and usable


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """`folder` seen through a read-only bind mount (root), or with its write bits off (another user);
    skips where neither makes it read-only for this process."""
    view = folder.with_name(folder.name + "-ro")
    view.mkdir()
    mounted = False
    if os.geteuid() == 0:
        mounted = subprocess.run(["mount", "--bind", str(folder), str(view)], capture_output=True).returncode == 0 \
            and subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], capture_output=True).returncode == 0
        if not mounted:
            subprocess.run(["umount", str(view)], capture_output=True)
            pytest.skip("root here cannot make a read-only bind mount (no CAP_SYS_ADMIN), and root ignores file modes")
        target = view
    else:
        view.rmdir()
        folder.chmod(0o555)
        target = folder
    try:
        yield target
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(view)], check=True)  # lazily: MLflow keeps its store open
            view.rmdir()
        else:
            folder.chmod(0o755)


def test_a_new_store_in_a_read_only_folder_fails_at_once(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with read_only(tmp_path / "d") as ro:
        t0 = time.monotonic()
        with pytest.raises(StoreUnusable, match=f"cannot create the MLflow store {ro}/mlflow.db: {ro} is not a writable"):
            open_store(f"sqlite:///{ro / 'mlflow.db'}")
        assert time.monotonic() - t0 < 10  # MLflow's own engine retries took ~105 s
        assert not (ro / "mlflow.db").exists()


def test_a_read_only_store_refuses_a_sweep_but_serves_a_report(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d").mkdir()
    open_store(f"sqlite:///{tmp_path / 'd' / 'mlflow.db'}").search_experiments()
    with read_only(tmp_path / "d") as ro:
        uri = f"sqlite:///{ro / 'mlflow.db'}"
        with pytest.raises(StoreUnusable, match="is read-only here"):
            open_store(uri)
        open_store(uri, create=False).search_experiments()  # reading needs no write
        assert main(["report", "nothing-here", "--tracking-uri", uri]) == ExitCode.BAD_INPUT  # read, not found
    assert "no sweep named 'nothing-here'" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["garbage", "truncated", "half-created"])
def test_a_broken_store_says_what_is_wrong_in_one_line(tmp_path: Path, damage: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "mlflow.db"
    if damage == "garbage":
        db.write_bytes(os.urandom(5000))
        said = "is not a sqlite database"
    elif damage == "truncated":
        good = tmp_path / "good.db"
        client = open_store(f"sqlite:///{good}")
        for i in range(30):  # pages of runs past the cut
            client.create_run(client.create_experiment(f"e{i}"), tags={"x": "y" * 2000})
        db.write_bytes(good.read_bytes()[: good.stat().st_size // 3])
        said = "is damaged (database disk image is malformed)"
    else:
        _half_created(db)
        said = "was left half-created"
    capsys.readouterr()  # what making the good store printed
    assert main(["report", "x", "--tracking-uri", f"sqlite:///{db}"]) == ExitCode.STORE_UNUSABLE
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and said in err.splitlines()[-1], err  # (MLflow's own INFO lines above it)
    assert [line for line in err.splitlines() if not line.startswith("20")] == [err.splitlines()[-1]], err


def _half_created(db: Path) -> None:
    """What two processes creating one store at once left here (2026-11-26, MLflow 3.17: 14 tables): the
    first tables, migrations up to a8c4a736bde6, and the temporary table of the next one's batch copy."""
    import sqlalchemy
    from alembic import command
    from mlflow.store.db.utils import _get_alembic_config  # MLflow's own migration set-up (test only)
    from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    InitialBase.metadata.create_all(engine)
    config = _get_alembic_config(f"sqlite:///{db}")
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "a8c4a736bde6")
        connection.execute(sqlalchemy.text("CREATE TABLE _alembic_tmp_latest_metrics (x INTEGER)"))
    engine.dispose()


def test_reading_commands_never_create_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["report", "demo"]) == ExitCode.STORE_UNUSABLE  # the default: sqlite:///mlflow.db here
    assert "there is no MLflow store at" in capsys.readouterr().err
    assert main(["report", "demo", "--tracking-uri", "sqlite:///typo/mlflow.db"]) == ExitCode.STORE_UNUSABLE
    assert list(tmp_path.iterdir()) == []  # no mlflow.db, no typo/ folder


def test_a_file_store_is_refused_by_validate_and_by_every_command(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: f\ntrainable: {{name: mlp-tabular}}\nbudget: {{num_trials: 1, num_steps: 2}}\n"
                    f"tracking: {{uri: 'file://{tmp_path}/mlruns'}}\n")
    assert main(["validate", str(spec)]) == ExitCode.BAD_INPUT
    err = capsys.readouterr().err
    assert "tracking.uri: file://" in err and "MLFLOW_ALLOW_FILE_STORE=true" in err and "sqlite:///" in err
    assert main(["report", "x", "--tracking-uri", str(tmp_path / "mlruns")]) == ExitCode.STORE_UNUSABLE  # a bare path
    assert "MLflow file store" in capsys.readouterr().err
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the user's own choice
    assert main(["validate", str(spec)]) == ExitCode.OK


HOME = Path("/home/me/sweeps")  # $SWEEPS_HOME on the job's node


@pytest.mark.parametrize(("state_dir", "uri", "says", "never"), [
    # a relative storage_path and the default sqlite store: both made absolute under $SWEEPS_HOME
    (HOME / "ray_results" / "s", absolute_uri("sqlite:///mlflow.db", HOME),
     ["(/home/me/sweeps/ray_results/s) lives outside the job's temporary working copy, under $SWEEPS_HOME",
      "Its MLflow store is the sqlite file /home/me/sweeps/mlflow.db, there too"], []),
    # absolute paths elsewhere: where the spec put them, not $SWEEPS_HOME
    (Path("/shared/results/s"), "sqlite:////shared/mlflow.db",
     ["(/shared/results/s) lives outside the job's temporary working copy, where storage_path says",
      "Its MLflow store is the sqlite file /shared/mlflow.db, where tracking.uri says, on this node"], ["$SWEEPS_HOME"]),
    # a tracking server: not local, not on this node; a password in the URI is never printed
    (HOME / "ray_results" / "s", "https://bob:hunter2@mlflow.example.com",
     ["Its MLflow runs go to the tracking server at https://bob:***@mlflow.example.com", "nothing of them stays on this node"],
     ["local", "sqlite", "hunter2", "./mlruns"]),
    (HOME / "ray_results" / "s", "http://127.0.0.1:5000",
     ["Its MLflow runs go to the tracking server at http://127.0.0.1:5000"], ["local", "sqlite", "./mlruns"]),
    # a database without a server: runs there, a new experiment's artifacts in the job's working copy unless told
    (HOME / "ray_results" / "s", "postgresql://sweeps:s3cret@db.internal:5432/mlflow",
     ["Its MLflow runs go to the database at postgresql://sweeps:***@db.internal:5432/mlflow",
      "./mlruns in the job's temporary working copy", "create the experiment with an artifact location first"],
     ["local", "sqlite", "s3cret", "tracking server at"]),
], ids=["sqlite-under-home", "sqlite-elsewhere", "https-server", "http-server", "postgresql"])
def test_a_jobs_banner_says_where_each_kind_of_store_keeps_the_runs(state_dir: Path, uri: str, says: list[str],
                                                                  never: list[str]) -> None:
    banner = job_banner(state_dir, uri, HOME)
    assert banner.startswith("inside a Ray job: the sweep's state ("), banner
    store = banner[banner.index(". Its MLflow") + 2:]  # the store's sentences (the state's name $SWEEPS_HOME too)
    assert all(s in banner for s in says), banner
    assert not any(n in store for n in never) and "hunter2" not in banner and "s3cret" not in banner, banner


def test_a_database_without_a_server_is_refused_for_a_sweep_with_the_server_recipe(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A direct postgresql:// store would put a new experiment's artifacts in ./mlruns of the driver's working
    folder (a temporary one under `ray job submit`): refused in the spec, and from MLFLOW_TRACKING_URI."""
    from mlflow.store.db.db_types import DATABASE_ENGINES

    assert sorted(DATABASE_SCHEMES) == sorted(set(DATABASE_ENGINES) - {"sqlite"})  # MLflow's list, as this module has it
    spec = tmp_path / "s.yaml"
    body = f"name: d\ntrainable: {{name: mlp-tabular}}\nbudget: {{num_trials: 1, num_steps: 2}}\nstorage_path: {tmp_path}\n"
    spec.write_text(body + "tracking: {uri: 'postgresql://bob:s3cret@127.0.0.1:9/mlflow'}\n")
    assert main(["validate", str(spec)]) == ExitCode.BAD_INPUT
    err = capsys.readouterr().err
    assert "tracking.uri: postgresql://bob:***@127.0.0.1:9/mlflow is a database without an MLflow server" in err
    assert "`mlflow server --backend-store-uri <this URI> --artifacts-destination s3://BUCKET/PATH`" in err
    assert "s3cret" not in err

    spec.write_text(body)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "mysql+pymysql://bob:s3cret@127.0.0.1:9/mlflow")
    assert main(["run", str(spec)]) == ExitCode.STORE_UNUSABLE  # refused before any connection is tried
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: mysql+pymysql://bob:***@127.0.0.1:9/mlflow is a database "
                                               "without an MLflow server"), err


def test_a_missing_database_driver_is_named_with_its_package(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    for driver in ("psycopg", "psycopg2"):  # SQLAlchemy 2.1 opens postgresql:// with psycopg, 2.0 with psycopg2
        monkeypatch.setitem(sys.modules, driver, None)  # `import psycopg` now raises ModuleNotFoundError
    assert main(["report", "x", "--tracking-uri", "postgresql://bob:s3cret@127.0.0.1:9/mlflow"]) == ExitCode.STORE_UNUSABLE
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(r"^error: MLflow needs the Python package (psycopg\[binary\]|psycopg2-binary) to open "
                     r"postgresql://bob:\*\*\*@127.0.0.1:9/mlflow \(No module named 'psycopg2?'\): "
                     r"`pip install '(psycopg\[binary\]|psycopg2-binary)'`", line), line


def test_a_store_whose_schema_is_older_than_mlflow_names_mlflow_db_upgrade(
        tmp_path: Path, new_store: Callable[[Path], Path], capsys: pytest.CaptureFixture[str]) -> None:
    db = new_store(tmp_path / "mlflow.db")
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        con.execute("UPDATE alembic_version SET version_num = 'a8c4a736bde6'")  # what an older MLflow left
    said = f"needs its schema upgraded: take a backup, then run `mlflow db upgrade sqlite:///{db}`"
    with pytest.raises(StoreUnusable, match=re.escape(said)):
        open_store(f"sqlite:///{db}")
    assert main(["report", "x", "--tracking-uri", f"sqlite:///{db}"]) == ExitCode.STORE_UNUSABLE
    assert said in capsys.readouterr().err.strip().splitlines()[-1]


@contextlib.contextmanager
def _server_answering(status: int) -> Iterator[str]:
    """An HTTP server whose /health is fine and whose every other path answers `status` (a login's fate)."""
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            code = 200 if self.path == "/health" else status
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"OK" if code == 200 else b"You are not authenticated.")

        do_POST = do_GET  # noqa: N815 - MLflow searches with POST

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield url


@pytest.mark.parametrize(("status", "said"), [
    (401, "refused the login (HTTP 401); nothing was run (MLFLOW_TRACKING_USERNAME=bob, MLFLOW_TRACKING_PASSWORD "
          "is set, MLFLOW_TRACKING_TOKEN is not set): check MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"),
    (403, "accepts the login but does not allow it this call (HTTP 403); nothing was run (MLFLOW_TRACKING_USERNAME=bob"),
    (503, "answers its health check but failed the call (HTTP 503, retried); nothing was run (MLFLOW_TRACKING_USERNAME"),
])
def test_a_server_that_refuses_the_first_call_after_its_health_check_says_so_in_one_line(
        status: int, said: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """/health needs no login, so a server that answers it can still refuse every call: the first call that
    needs one is made when the store opens. (tests/e2e/test_team_mlflow.py does it against a real server.)"""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter2hunter2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with _server_answering(status) as uri, pytest.raises(StoreUnusable) as raised:
        open_store(uri)
    assert str(raised.value).startswith(f"the MLflow tracking server {uri} ") and said in str(raised.value)
    assert "hunter2" not in str(raised.value)
