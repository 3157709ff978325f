"""Opening the MLflow tracking store: checked first, created under a lock, failing in one line.

MLflow opens a store lazily, at its first call, and a sqlite store it has not seen is created and
migrated then (65 tables, alembic). Two processes doing that to one new file at once race: one
fails ("table latest_metrics already exists") and the file can be left half-created, unusable
afterwards. A read-only folder fails only after MLflow's engine retries (~105 s), a garbage file
deep in a traceback. So every command opens its store here:

- a server (`http(s)://`) must answer its health check within seconds, and then its first call that
  needs a login (the health check needs none): a refused login names MLflow's credential variables;
- a database without a server (`postgresql://`, `mysql://`, `mssql://`) is refused for writing: the
  artifacts of an experiment created there would go to `./mlruns` of whichever process created it
  (`database_uri_problem`); a reading command may open it, and a missing driver package or a schema
  that needs `mlflow db upgrade` is said in one line;
- a `file://` store (or a bare path, which MLflow reads as one) is refused unless
  `MLFLOW_ALLOW_FILE_STORE=true`: MLflow 3 keeps it in maintenance mode;
- a sqlite file is checked before MLflow sees it (its folder writable, its header SQLite's, its pages
  sound), then opened -- created and migrated where new -- while this process holds a lock file
  beside it (`<db>.lock`, released by the OS when the process dies), so concurrent first uses wait
  for one another;
- a reading command (`create=False`) never creates a store: no file, no store.

Every problem is a `StoreUnusable` whose message says the cause and the fix in one line.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from sweeps.exits import StoreUnusable

logger = logging.getLogger(__name__)

SQLITE_HEADER = b"SQLite format 3\x00"
DEFAULT_URI = "sqlite:///mlflow.db"
# MLflow's database engines other than sqlite (mlflow.store.db.db_types.DATABASE_ENGINES, checked by a test),
# and the package each driver module of theirs comes from.
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
LOGIN_VARS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")  # MLflow's own
_DRIVER_PACKAGES = {"psycopg": "psycopg[binary]", "psycopg2": "psycopg2-binary", "pymysql": "PyMySQL",
                    "MySQLdb": "mysqlclient", "pymssql": "pymssql", "pyodbc": "pyodbc"}


class TrackingUnavailable(StoreUnusable):
    """The MLflow tracking server does not answer when the command starts."""


# Bounded HTTP behaviour for a remote store (MLflow's defaults retry for minutes); a user's own
# MLFLOW_HTTP_* settings win.
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "15", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                  "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, before anything runs, when an MLflow server does not answer."""
    if not uri.startswith(("http://", "https://")):
        return
    import requests

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=timeout_s).raise_for_status()
    except requests.RequestException as exc:
        raise TrackingUnavailable(
            f"MLflow tracking server {shown_uri(uri)} is not reachable ({type(exc).__name__}); nothing was run. Start it "
            "(e.g. `mlflow server --host 127.0.0.1 --port 5000`; a server whose log says \"out-of-date database "
            "schema\" starts after `mlflow db upgrade <its --backend-store-uri>`), fix tracking.uri in the spec, or "
            "unset it to use the local sqlite:///mlflow.db"
        ) from None


def sqlite_path(uri: str) -> Path | None:
    """The file of a `sqlite:///` store (relative to the working directory where the URI is), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(os.path.abspath(uri.removeprefix("sqlite:///").split("?", 1)[0]))


def absolute_uri(uri: str, root: Path) -> str:
    """Return `uri` with a relative sqlite path made absolute against `root`; any other URI as given.

    MLflow would take the working directory."""
    db = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else None
    if db is None or db.startswith("/") or db.startswith(":memory:"):
        return uri
    return f"sqlite:///{(root / db).resolve()}"


def shown_uri(uri: str) -> str:
    """`uri` as it may be printed: a password in it (`postgresql://user:secret@host/db`) masked."""
    parsed = urlparse(uri)
    if parsed.password is None:
        return uri
    return parsed._replace(netloc=parsed.netloc.replace(f":{parsed.password}@", ":***@", 1)).geturl()


def file_store_problem(uri: str) -> str | None:
    """Say why MLflow 3 will not open `uri` as a store; None for any other store.

    A `file://` URI or a bare path is its file store, in maintenance mode (refused unless
    MLFLOW_ALLOW_FILE_STORE=true)."""
    scheme = urlparse(uri).scheme
    if (scheme not in ("file", "") or uri.startswith("databricks")) or os.environ.get(
            "MLFLOW_ALLOW_FILE_STORE", "").strip().lower() in ("true", "1"):
        return None
    return (f"{uri} is an MLflow file store, which MLflow 3 keeps in maintenance mode and refuses; use a sqlite "
            "store (e.g. sqlite:///mlflow.db) or a server, or set MLFLOW_ALLOW_FILE_STORE=true to use it anyway")


def database_uri_problem(uri: str) -> str | None:
    """Why a sweep does not write to `uri`: a database other than sqlite, without an MLflow server in front.

    MLflow would put the artifacts of an experiment it creates there (a sweep's report, figures, traces) in
    `./mlruns` of that process -- a temporary folder under `ray job submit`, a folder nobody else sees -- and
    every client would need the database's password. None for any other store."""
    if urlparse(uri).scheme.split("+", 1)[0] not in DATABASE_SCHEMES:
        return None
    return (f"{shown_uri(uri)} is a database without an MLflow server: the artifacts of an experiment created there "
            "(the report, figures, traces) would go to ./mlruns of the process that creates it (a temporary folder "
            "under `ray job submit`). Serve it: `mlflow db upgrade <this URI>`, then `mlflow server --backend-store-uri "
            "<this URI> --artifacts-destination s3://BUCKET/PATH`; set tracking.uri (or MLFLOW_TRACKING_URI) to the "
            "server's http:// address (docs/howto/team-mlflow.md)")


def open_store(uri: str, create: bool = True) -> Any:
    """Return an `MlflowClient` of the store at `uri`, opened and usable (see the module doc).

    `create=False` for a command that only reads: a sqlite file that does not exist is then refused, not
    created."""
    from mlflow.tracking import MlflowClient

    for key, value in _HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    check_reachable(uri)
    refused = file_store_problem(uri) or (database_uri_problem(uri) if create else None)
    if refused:
        raise StoreUnusable(refused)
    db = sqlite_path(uri)
    if db is not None:
        check_sqlite(db, create)
    with creation_lock(db) if db is not None else contextlib.nullcontext():
        try:
            client = MlflowClient(tracking_uri=uri)
            # The first call that needs a login (a server's /health needs none); for sqlite it opens (creates,
            # migrates) the store now, under the lock.
            client.search_experiments(max_results=1)
        except Exception as exc:  # noqa: BLE001 - translated where known, else raised as it came
            problem = store_problem(uri, exc) or (sqlite_problem(db, exc) if db is not None else None)
            if problem is None:
                raise
            raise StoreUnusable(problem) from None
    return client


@contextlib.contextmanager
def refusals_said(uri: str, doing: str = "") -> Iterator[None]:
    """Inside: a store's known refusal (`store_problem`) of a call `doing` something is a `StoreUnusable`."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - translated where known, else raised as it came
        problem = store_problem(uri, exc, doing)
        if problem is None:
            raise
        raise StoreUnusable(problem) from None


def store_problem(uri: str, exc: BaseException, doing: str = "") -> str | None:
    """Return the one-line cause and fix for an error of a call to any store; None when it is none of these.

    `doing` is what the call did, said in a 403's line. The errors: a refused login, a server that fails its calls, a missing database driver, a schema that needs
    `mlflow db upgrade`."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        package = _DRIVER_PACKAGES.get(exc.name, exc.name)
        return (f"MLflow needs the Python package {package} to open {shown_uri(uri)} (No module named "
                f"{exc.name!r}): `pip install '{package}'` (or `pip install 'mlflow[db]'`, every database's driver) "
                "where the sweep runs")
    status = _http_status(exc)
    if status in (401, 403) and uri.startswith(("http://", "https://")):
        return login_problem(uri, status, doing)
    failed = re.search(r"too many (5\d\d) error responses", str(exc))  # urllib3's words, after MLflow's retries
    if failed:
        return (f"the MLflow tracking server {shown_uri(uri)} answers its health check but failed the call (HTTP "
                f"{failed.group(1)}, retried); nothing was run ({_login_vars()}): the server's log says why (e.g. its "
                "database is down; a basic-auth server that caches logins fails a token this way: use "
                "MLFLOW_TRACKING_USERNAME/PASSWORD)")
    if "out-of-date database schema" in str(exc):
        shown = shown_uri(uri)
        return (f"the MLflow store {shown} was made by an older MLflow and needs its schema upgraded: take a "
                f"backup, then run `mlflow db upgrade {shown}` (one process, before any server starts on it)")
    return None


def login_problem(uri: str, status: int, doing: str = "") -> str:
    """Say what a server's refusal means, and which of MLflow's credential variables this process has.

    HTTP 401: who are you; 403: not allowed."""
    said = _login_vars()
    if status == 403:
        return (f"the MLflow tracking server {shown_uri(uri)} accepts the login but does not allow it "
                f"{doing or 'this call'} (HTTP 403); nothing was run ({said}): ask the server's admin (or the "
                "experiment's owner) for permission, or set tracking.experiment to an experiment of your own")
    if not any(os.environ.get(name) for name in LOGIN_VARS):
        fix = "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"
    else:
        fix = ("check MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) with the "
               "server's admin")
    return (f"the MLflow tracking server {shown_uri(uri)} refused the login (HTTP 401); nothing was run ({said}): "
            f"{fix}, in the environment of the process that runs the sweep (a Ray job's: the head's, or the job's "
            "runtime_env)")


def _login_vars() -> str:
    """Which of MLflow's login variables this process has (the user's name; never a secret)."""
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    return ", ".join([f"MLFLOW_TRACKING_USERNAME={user}" if user else "MLFLOW_TRACKING_USERNAME is not set",
                      *(f"{name} is {'set' if os.environ.get(name) else 'not set'}" for name in LOGIN_VARS[1:])])


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status of a server's refusal, as MLflow's REST client raises it (None for anything else)."""
    from mlflow.exceptions import MlflowException

    return exc.get_http_status_code() if isinstance(exc, MlflowException) else None


def check_sqlite(db: Path, create: bool) -> None:
    """What can be known of a sqlite store before MLflow opens it (each a `StoreUnusable`)."""
    if not db.exists():
        if not create:
            raise StoreUnusable(f"there is no MLflow store at {db} (nothing was tracked there): check "
                                "--tracking-uri, or run the command where the sweep ran")
        folder = next((p for p in db.parents if p.exists()), None)
        if folder is None or not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            raise StoreUnusable(f"cannot create the MLflow store {db}: {folder} is not a writable folder; point "
                                "tracking.uri (or --tracking-uri) at a writable place, e.g. sqlite:////tmp/mlflow.db")
        return
    if db.is_dir():
        raise StoreUnusable(f"the MLflow store {db} is a folder, not a sqlite file; point tracking.uri at a file")
    try:
        with open(db, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise StoreUnusable(f"cannot read the MLflow store {db} ({exc.strerror}); fix its permissions") from None
    if head and head != SQLITE_HEADER:
        raise StoreUnusable(f"{db} is not a sqlite database (its first bytes are not SQLite's): point "
                            "tracking.uri at the right file, or move this one aside to start a new store there")
    if head:
        damage = _damage(db)
        if damage:
            raise StoreUnusable(f"the MLflow store {db} is damaged ({damage}): restore it from a copy, or move it "
                                f"aside (mv {db} {db}.broken) and start a new store there; the sweeps' own folders "
                                "(storage_path) are kept, but their MLflow runs are in the damaged file")
    if create and not (os.access(db, os.W_OK) and os.access(db.parent, os.W_OK | os.X_OK)):
        raise StoreUnusable(f"the MLflow store {db} is read-only here (a sweep writes to it; sqlite also needs its "
                            "folder writable for its journal): fix the permissions, or use another store")


def _damage(db: Path) -> str:
    """sqlite's own word on the file's soundness ("" when sound): `PRAGMA quick_check`, read-only."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as con:
            rows = con.execute("PRAGMA quick_check(1)").fetchall()
    except sqlite3.DatabaseError as exc:
        return str(exc)
    return "" if rows == [("ok",)] else str(rows[0][0] if rows else "quick_check said nothing")


@contextlib.contextmanager
def creation_lock(db: Path) -> Iterator[None]:
    """Hold `<db>.lock` exclusively while this process opens (creates, migrates) the store.

    Another process opening it at once waits here. Without a writable folder (a read-only store) no lock is
    taken: nothing can be created there either."""
    path = db.with_name(db.name + ".lock")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race a waiting process)


def sqlite_problem(db: Path, exc: BaseException) -> str | None:
    """Return the one-line cause and fix for an error MLflow raised opening the sqlite store `db`.

    None when it is not a known store problem."""
    text = f"{exc} {exc.__cause__ or ''}"
    if "readonly database" in text or "read-only file system" in text.lower():
        return (f"the MLflow store {db} is read-only here (a sweep writes to it; sqlite also needs its folder "
                "writable): fix the permissions, or use another store")
    if "not a database" in text or "malformed" in text:
        return (f"the MLflow store {db} is damaged ({'not a database' if 'not a database' in text else 'malformed'}): "
                f"restore it from a copy, or move it aside (mv {db} {db}.broken) and start a new store there")
    if "already exists" in text or "alembic" in text.lower():
        runs = _count_runs(db)
        keep = ("it holds no runs: remove it (rm " + str(db) + ") and run again" if not runs else
                f"it holds {runs} run(s): keep a copy, then try `mlflow db upgrade sqlite:///{db}`, or move it aside "
                "and start a new store")
        return (f"the MLflow store {db} was left half-created (two processes created it at once, before this "
                f"version locked its creation): {keep}")
    if "unable to open database file" in text:
        return f"cannot open the MLflow store {db}: is its folder writable and on a local disk?"
    return None


def _count_runs(db: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            return int(con.execute("SELECT count(*) FROM runs").fetchone()[0])
    except sqlite3.DatabaseError:
        return 0
