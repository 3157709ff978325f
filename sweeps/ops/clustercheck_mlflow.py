"""`sweeps cluster-check` for an `mlflow server` command line, shared by the launcher and Kubernetes checks.

One server, as a cluster file starts it (its words and the environment it starts in), gives these findings
(check `mlflow`), each with the field and the fix:
- sqlite with more than one process: `--workers N>1`, or no `--workers` (MLflow 3.17 starts 4 uvicorn
  workers, `MLFLOW_WORKERS` aside), or more than one replica. sqlite takes one writer: the others fail
  with "database is locked" while a sweep logs;
- a basic-auth server without `MLFLOW_FLASK_SERVER_SECRET_KEY` (it refuses to start, and replicas must
  share one key), or with that key or `MLFLOW_AUTH_ADMIN_PASSWORD` written in the file;
- a database password written in the file (`postgresql://user:PASSWORD@...`);
- a basic-auth server on a shared database whose users stay in the default `sqlite:///basic_auth.db`
  (no `MLFLOW_AUTH_CONFIG_PATH`): lost with the container, one user table per replica.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

DEFAULT_WORKERS = 4  # mlflow/server/__init__.py (3.17): `workers or 4` for uvicorn and gunicorn
DEFAULT_BACKEND = "sqlite:///mlflow.db"  # `mlflow server --help` (3.17): the backend store without a flag
_VAR = re.compile(r"^\$(?:\((\w+)\)|\{(\w+)\}|(\w+))$")  # $(VAR) (Kubernetes), ${VAR} and $VAR (shell)
_PASSWORD = re.compile(r"://[^/\s:@]+:([^@\s]+)@")
KEY, ADMIN, AUTH_CONFIG = "MLFLOW_FLASK_SERVER_SECRET_KEY", "MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_AUTH_CONFIG_PATH"


@dataclass(frozen=True)
class EnvValue:
    """One variable of a server's environment: its value when the file spells it out, and the field it is at."""

    value: str | None  # None: it comes from elsewhere (a Secret, a command's output)
    source: str  # "literal", "secret", "configmap", "command" or "other"
    path: str


@dataclass(frozen=True)
class Fixes:
    """How one platform takes a value from a secret store, for the findings' fixes."""

    secret: str  # e.g. "valueFrom: {secretKeyRef: ...}"
    env_at: str  # the field where a missing variable goes
    args_at: str  # the field holding the command line
    replicas_at: str = ""  # the replica count's field (Kubernetes workloads)


def is_server(words: list[str]) -> bool:
    """True when the words run `mlflow server` (or `mlflow ui`, the same server)."""
    return any(a.endswith("mlflow") and b in ("server", "ui") for a, b in zip(words, words[1:], strict=False))


def _server_words(words: list[str]) -> list[str]:
    """The words of the `mlflow server` command only (a shell line may chain others with && or ;)."""
    start = next(i for i, (a, b) in enumerate(zip(words, words[1:], strict=False))
                 if a.endswith("mlflow") and b in ("server", "ui"))
    out = []
    for w in words[start + 2:]:
        if w in ("&&", "||", ";", "|", "&") or w.startswith((">", "2>")):
            break
        out.append(w)
    return out


def _option(words: list[str], *names: str) -> str | None:
    for i, w in enumerate(words):
        for n in names:
            if w == n and i + 1 < len(words):
                return words[i + 1]
            if n.startswith("--") and w.startswith(n + "="):
                return w[len(n) + 1:]
    return None


def _resolve(raw: str | None, env: dict[str, EnvValue]) -> tuple[str | None, EnvValue | None]:
    """The value a flag ends up with, and the variable it came from (None when written in place)."""
    if raw is None:
        return None, None
    m = _VAR.match(raw.strip("'\""))
    if m is None:
        return raw, None
    var = env.get(next(g for g in m.groups() if g))
    return (var.value if var else None), var


def _as_int(value: str | None) -> int | None:
    try:
        return int(str(value).strip("'\""))
    except ValueError:
        return None


def server_findings(words: list[str], env: dict[str, EnvValue], replicas: int, fixes: Fixes,
                    env_from_secret: bool = False) -> list[tuple[str, str]]:
    """(field, message) for each problem of one `mlflow server` started with these words and environment."""
    words = _server_words(words)
    out: list[tuple[str, str]] = []
    raw = _option(words, "--backend-store-uri")
    backend, via = _resolve(raw, env) if raw is not None else (None, env.get("MLFLOW_BACKEND_STORE_URI"))
    if raw is None and via is not None:
        backend = via.value
    elif raw is None and not env_from_secret:
        backend = DEFAULT_BACKEND
    sqlite = backend is not None and backend.startswith("sqlite:")
    if backend and (m := _PASSWORD.search(backend)) and not m.group(1).startswith("$"):
        out.append((via.path if via else fixes.args_at, "a database password is written in the file: anyone who "
                    f"reads it (or the repository) can open the store; take the whole URI from a secret ({fixes.secret})"))
    raw_workers = _option(words, "--workers", "-w")
    if raw_workers is None and "MLFLOW_WORKERS" in env:
        raw_workers = env["MLFLOW_WORKERS"].value
    workers = 1 if any(w.startswith("--waitress-opts") for w in words) else (
        _as_int(raw_workers) if raw_workers is not None else DEFAULT_WORKERS)
    if sqlite and workers is not None and workers > 1:
        why = f"--workers {workers}" if raw_workers is not None else f"no --workers (MLflow 3.17 starts {workers})"
        out.append((fixes.args_at, f"MLflow on sqlite ({backend}) with {why}: sqlite takes one writer, so the other "
                    "processes fail with 'database is locked' while a sweep logs; add --workers 1, or put the store on "
                    "PostgreSQL (cluster/team/)"))
    if sqlite and replicas > 1:
        out.append((fixes.replicas_at or fixes.args_at, f"MLflow on sqlite ({backend}) with {replicas} replicas: "
                    "each has its own file (or they lock one); set replicas: 1, or put the store on PostgreSQL "
                    "(cluster/team/)"))
    app = _option(words, "--app-name")
    if app is None or app.strip("'\"") != "basic-auth":
        return out
    out += _secret_findings(env, fixes, env_from_secret)
    if not sqlite and AUTH_CONFIG not in env and not env_from_secret:
        out.append((fixes.env_at, f"no {AUTH_CONFIG}: the users and permissions stay in sqlite:///basic_auth.db in the "
                    "server's working folder, lost with it and one table per replica; set it to an auth config whose "
                    f"database_uri is on PostgreSQL (a file from a secret: it holds a password; {fixes.secret})"))
    return out


def _secret_findings(env: dict[str, EnvValue], fixes: Fixes, env_from_secret: bool) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    key = env.get(KEY)
    if key is None and not env_from_secret:
        out.append((fixes.env_at, f"a basic-auth server without {KEY} refuses to start (MLflow 3.17), and every "
                    f"replica must share one key for its CSRF tokens; set it from a secret ({fixes.secret})"))
    for name, var in ((KEY, key), (ADMIN, env.get(ADMIN))):
        if var is not None and var.source in ("literal", "configmap"):
            where = "written in the file" if var.source == "literal" else "in a ConfigMap, which is not secret"
            out.append((var.path, f"{name} is {where}: anyone who reads it can forge the server's logins; take it "
                        f"from a secret ({fixes.secret})"))
    return out


def container_env(c: dict[str, Any], at: str) -> tuple[dict[str, EnvValue], bool]:
    """A container's variables (by name) and whether `envFrom` brings a whole Secret."""
    env = {}
    for j, e in enumerate(c.get("env") or []):
        if not isinstance(e, dict) or "name" not in e:
            continue
        ref = e.get("valueFrom") or {}
        source = "literal" if "value" in e else "secret" if "secretKeyRef" in ref else (
            "configmap" if "configMapKeyRef" in ref else "other")
        path = f"{at}.env[{j}].value" if source == "literal" else f"{at}.env[{j}].valueFrom"
        env[str(e["name"])] = EnvValue(str(e["value"]) if source == "literal" else None, source, path)
    from_secret = any(isinstance(x, dict) and "secretRef" in x for x in c.get("envFrom") or [])
    return env, from_secret
