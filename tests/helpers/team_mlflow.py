"""A team's MLflow on loopback, for tests: PostgreSQL 15, an S3 server (moto), and `mlflow server` in front of
both with basic auth and proxied artifacts -- the deployment docs/howto/team-mlflow.md describes.

Each piece is a process of its own on a free port, started here and stopped here by its own process id
(never by a name): the postmaster (its pid from `postmaster.pid`), `moto_server`, and `mlflow server` with
the workers below it. PostgreSQL refuses to run as root, so under root it runs as the `postgres` user
(`runuser`), in a temporary folder handed to that user.

    with team_mlflow() as team:
        env = {"MLFLOW_TRACKING_URI": team.uri, "MLFLOW_TRACKING_USERNAME": team.username,
               "MLFLOW_TRACKING_PASSWORD": team.password}
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

VENV_BIN = Path(sys.executable).parent
DB_USER = "mlflow"
DATABASES = ("mlflow", "mlflow_auth")  # the tracking tables; the basic-auth app's users and permissions
BUCKET = "team-mlflow"
# moto accepts any key; the server's boto3 needs some. Only the server's environment holds them.
S3_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass(frozen=True)
class TeamMlflow:
    uri: str  # what a client sets as MLFLOW_TRACKING_URI
    username: str
    password: str
    database_uri: str  # postgresql://... of the tracking tables (for a test's own queries)
    s3_endpoint: str  # http://127.0.0.1:PORT of the bucket that holds the artifacts
    bucket: str
    root: Path  # the servers' logs and data
    admin: tuple[str, str]  # the server's admin login

    def client_env(self) -> dict[str, str]:
        """MLflow's own variables for a client of this server, and nothing else (no object-store key)."""
        return {"MLFLOW_TRACKING_URI": self.uri, "MLFLOW_TRACKING_USERNAME": self.username,
                "MLFLOW_TRACKING_PASSWORD": self.password}


def missing() -> str | None:
    """Why this machine cannot start a team MLflow (a skip reason), or None."""
    for tool in ("initdb", "pg_ctl"):
        if shutil.which(tool) is None:
            return f"PostgreSQL's {tool} is not on PATH (the team-MLflow tests need PostgreSQL 15)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL cannot run as root"
    from sqlalchemy.dialects import postgresql

    # the server's driver for postgresql:// (SQLAlchemy 2.1: psycopg; 2.0: psycopg2), the test's own queries' driver
    for module in (postgresql.dialect.driver, "psycopg2", "moto", "boto3", "flask_wtf"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install -e '.[dev]')"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise RuntimeError(f"{what} did not start within {timeout_s:.0f} s; its log ends:\n{tail}")


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 15) -> None:
    """SIGTERM to `proc` and every process below it (listed before, by pid), SIGKILL to what outlives the wait."""
    if proc.poll() is not None:
        return
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        family = []
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(family, timeout=timeout_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    proc.wait(timeout=timeout_s)


def _run(cmd: list[str], **kwargs: Any) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")


def _as_postgres(root: Path) -> list[str]:
    """The command prefix that runs PostgreSQL's tools as a user it accepts (root: the `postgres` user)."""
    if os.geteuid() != 0:
        return []
    shutil.chown(root, "postgres", "postgres")
    return ["runuser", "-u", "postgres", "--"]


@contextlib.contextmanager
def postgres(root: Path) -> Iterator[str]:
    """A PostgreSQL server on 127.0.0.1 with a user who owns the `DATABASES`; yields `postgresql://user:pw@host:port`
    (a database's name goes after it)."""
    import psycopg2

    root.mkdir(mode=0o700)
    as_pg = _as_postgres(root)
    super_pw, user_pw, port = secrets.token_hex(8), secrets.token_hex(8), free_port()
    (root / "pw").write_text(super_pw)
    if as_pg:
        shutil.chown(root / "pw", "postgres", "postgres")
    data, log = root / "data", root / "postgres.log"
    _run([*as_pg, "initdb", "-D", str(data), "-U", "postgres", f"--pwfile={root / 'pw'}", "--auth-local=peer",
          "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync"])
    _run([*as_pg, "pg_ctl", "-D", str(data), "-l", str(log), "-w", "-t", "60", "start",
          "-o", f"-k {root} -p {port} -h 127.0.0.1 -c fsync=off"])
    pid = int((data / "postmaster.pid").read_text().split()[0])
    try:
        with contextlib.closing(psycopg2.connect(host="127.0.0.1", port=port, user="postgres", password=super_pw,
                                                 dbname="postgres")) as con:
            con.autocommit = True
            with con.cursor() as cur:
                cur.execute(f"CREATE USER {DB_USER} PASSWORD %s", (user_pw,))
                for name in DATABASES:
                    cur.execute(f"CREATE DATABASE {name} OWNER {DB_USER}")
        yield f"postgresql://{DB_USER}:{user_pw}@127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)  # the postmaster's "fast" shutdown
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).wait(timeout=30)


@contextlib.contextmanager
def s3_server(root: Path, bucket: str) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 with `bucket`; yields its endpoint URL."""
    import boto3

    port = free_port()
    log = root / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(VENV_BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        _wait_for("moto_server", lambda: _answers(f"{endpoint}/moto-api/"), proc, log, 60)
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        _stop(proc)


def _answers(url: str, auth: tuple[str, str] | None = None) -> bool:
    import requests

    try:
        return requests.get(url, timeout=2, auth=auth).status_code == 200
    except requests.RequestException:
        return False


def server_env(root: Path, s3_endpoint: str, auth_database_uri: str, password: str) -> dict[str, str]:
    """The tracking server's environment: its object-store endpoint and keys, the basic-auth app's secrets
    and its config file, whose user database is on PostgreSQL too (its default is a sqlite file in the
    server's working folder: lost with a pod, one per replica)."""
    ini = root / "basic_auth.ini"
    ini.write_text("[mlflow]\ndefault_permission = READ\n"
                   f"database_uri = {auth_database_uri}\nadmin_username = admin\n"
                   "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                   # each request checks its password (PBKDF2, ~1 s a call on this loaded machine) unless cached
                   "auth_cache_ttl_seconds = 300\n")
    return {**os.environ, **S3_KEYS, "MLFLOW_S3_ENDPOINT_URL": s3_endpoint, "MLFLOW_AUTH_CONFIG_PATH": str(ini),
            "MLFLOW_AUTH_ADMIN_PASSWORD": password, "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
            "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


@contextlib.contextmanager
def mlflow_server(root: Path, database_uri: str, artifacts: str, env: dict[str, str]) -> Iterator[str]:
    """One `mlflow server` with basic auth over `database_uri` (upgraded: `db_upgrade`), its artifacts proxied
    to `artifacts`; yields its http:// URI once it answers."""
    mlflow = [sys.executable, "-m", "mlflow"]
    port = free_port()
    log = root / "mlflow-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*mlflow, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                                 "--backend-store-uri", database_uri, "--artifacts-destination", artifacts,
                                 "--app-name", "basic-auth"], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root)
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait_for("mlflow server", lambda: _answers(f"{uri}/health"), proc, log, 120)
        yield uri
    finally:
        _stop(proc)


@contextlib.contextmanager
def db_upgrade(root: Path, database_uri: str) -> Iterator[Callable[[], None]]:
    """`mlflow db upgrade database_uri`, as the how-to runs it before a server starts, in the background; yields
    a function that waits for it (and raises, with its log, if it failed)."""
    log = root / "db-upgrade.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "db", "upgrade", database_uri], stdout=out,
                                stderr=subprocess.STDOUT, cwd=root, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})

    def finished() -> None:
        if proc.wait(timeout=300) != 0:
            raise RuntimeError(f"mlflow db upgrade failed; its log ends:\n{log.read_text(errors='replace')[-3000:]}")

    try:
        yield finished
    finally:
        _stop(proc)


def add_user(uri: str, admin: tuple[str, str], username: str, password: str) -> None:
    """A team member's login (not an admin: the server's default permission applies to others' experiments)."""
    import requests

    requests.post(f"{uri}/api/2.0/mlflow/users/create", json={"username": username, "password": password},
                  auth=admin, timeout=30).raise_for_status()


@contextlib.contextmanager
def team_mlflow() -> Iterator[TeamMlflow]:
    """PostgreSQL, an S3 bucket and a basic-auth `mlflow server` over both, and a user of it (not its admin);
    all stopped and removed after."""
    root = Path(tempfile.mkdtemp(prefix="team-mlflow-", dir="/tmp"))  # short: PostgreSQL's socket lives in it
    root.chmod(0o711)  # the postgres user passes through to its own folder
    password = secrets.token_urlsafe(16)  # the admin's: at least 12 characters
    try:
        with postgres(root / "pg") as server, db_upgrade(root, f"{server}/{DATABASES[0]}") as upgraded, \
                s3_server(root, BUCKET) as endpoint:  # the S3 server starts while the tables are made
            database_uri = f"{server}/{DATABASES[0]}"
            upgraded()
            env = server_env(root, endpoint, f"{server}/{DATABASES[1]}", password)
            with mlflow_server(root, database_uri, f"s3://{BUCKET}/artifacts", env) as uri:
                user, user_password = "alice", secrets.token_urlsafe(16)
                add_user(uri, ("admin", password), user, user_password)
                yield TeamMlflow(uri, user, user_password, database_uri, endpoint, BUCKET, root, ("admin", password))
    finally:
        shutil.rmtree(root, ignore_errors=True)
