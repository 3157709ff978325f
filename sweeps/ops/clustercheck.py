"""`sweeps cluster-check FILE`: validate a Ray cluster-launcher YAML offline and flag exposures.

Kubernetes manifests (KubeRay `RayCluster`/`RayJob`, MLflow's Deployment and Service) have their own
checks in `sweeps.ops.clustercheck_k8s`; `check_file` tells the two apart. Launcher checks, each a finding
with the fix:
- schema: the file must validate against Ray's own `ray/autoscaler/ray-schema.json`;
- dashboard: no `--dashboard-host` other than loopback (reach it with `ray dashboard` / SSH);
- token auth: every `ray start` runs with `RAY_AUTH_MODE=token`, none with it disabled;
- mlflow: an MLflow server binds 127.0.0.1 and sets `--allowed-hosts`; on sqlite it runs one process
  (`--workers 1`); a basic-auth server gets its secret key from a secret store, no password is written in
  the file (`sweeps.ops.clustercheck_mlflow`);
- install: setup commands install this project at a pinned version (`==X` or `@tag`/`@sha`);
- shm: with Docker, `run_options` sizes `/dev/shm` (`--shm-size`) for dataloader workers.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from sweeps.ops.clustercheck_mlflow import EnvValue, Fixes, is_server, server_findings
from sweeps.ops.findings import Finding

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_PROJECT = "gpu-sweeps"


_KEYS = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
         "head_start_ray_commands", "worker_start_ray_commands")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)=(.*)$", re.S)
_FROM_STORE = "e.g. `export VAR=$(aws secretsmanager get-secret-value --secret-id ID --query SecretString " \
    "--output text)` in the same command, as cluster/team/aws.yaml does"


def _commands(config: dict[str, Any]) -> list[str]:
    return [c for _, c in _located_commands(config)]


def _located_commands(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, command) for every command, e.g. ("head_start_ray_commands[2]", "nohup mlflow server ...")."""
    return [(f"{k}[{i}]", str(c)) for k in _KEYS for i, c in enumerate(config.get(k) or [])]


def _mlflow_server_findings(at: str, command: str) -> list[Finding]:
    """The sqlite-workers and secrets findings of one command that starts `mlflow server`."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    env = {}
    for w in words:
        if m := _ASSIGN.match(w):
            literal = "$" not in m.group(2)
            env[m.group(1)] = EnvValue(m.group(2) if literal else None, "literal" if literal else "command", at)
    fixes = Fixes(secret=_FROM_STORE, env_at=at, args_at=at)
    return [Finding("mlflow", message, path=path) for path, message in server_findings(words, env, 1, fixes)]


def _schema_findings(config: dict[str, Any]) -> list[Finding]:
    import jsonschema
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    return [
        Finding("schema", f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}")
        for e in sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    ]


def check_config(config: Any) -> list[Finding]:
    """Every finding for one parsed cluster config (empty list: safe to use)."""
    if not isinstance(config, dict):
        return [Finding("schema", "the file must be a YAML mapping")]
    findings = _schema_findings(config)
    cmds = _commands(config)
    starts = [c for c in cmds if re.search(r"\bray start\b", c)]
    for c in starts:
        host = re.search(r"--dashboard-host[= ](\S+)", c)
        if host and host.group(1).strip("'\"") not in _LOOPBACK:
            findings.append(Finding("dashboard", f"dashboard bound to {host.group(1)}: anyone who reaches it can run "
                                    "code; use --dashboard-host=127.0.0.1 and `ray dashboard cluster.yaml`"))
        if "RAY_AUTH_MODE=token" not in c or re.search(r"RAY_AUTH_MODE=disabled", c):
            findings.append(Finding("token-auth", f"`{c.strip()[:80]}` runs without RAY_AUTH_MODE=token; "
                                    "prefix it with `export RAY_AUTH_MODE=token;` and mount ~/.ray/auth_token"))
    if not starts:
        findings.append(Finding("token-auth", "no `ray start` command found, so token auth cannot be checked; "
                                "set head/worker_start_ray_commands with RAY_AUTH_MODE=token"))
    for at, c in _located_commands(config):
        if re.search(r"\bmlflow (server|ui)\b", c):
            host = re.search(r"(?:--host|-h)[= ](\S+)", c)
            if host is None or host.group(1).strip("'\"") not in _LOOPBACK:
                findings.append(Finding("mlflow", "MLflow server not bound to 127.0.0.1; use --host 127.0.0.1 "
                                        "and an SSH port-forward"))
            if "--allowed-hosts" not in c:
                findings.append(Finding("mlflow", "MLflow server without --allowed-hosts (DNS rebinding); "
                                        "add --allowed-hosts localhost:5000,127.0.0.1:5000"))
            if is_server(c.split()):
                findings += _mlflow_server_findings(at, c)
    installs = [c for c in cmds if "pip install" in c and _PROJECT in c]
    pinned = re.compile(rf"{_PROJECT}(\s*==\s*\d|.*@(v?\d[\w.]*|[0-9a-f]{{7,40}})[\"']?(\s|$))")
    if not any(pinned.search(c) for c in installs):
        findings.append(Finding("install", f"setup_commands do not install {_PROJECT} at a pinned version; add e.g. "
                                f'pip install "{_PROJECT} @ git+https://github.com/your-org/{_PROJECT}@v0.1.0"'))
    docker = config.get("docker") or {}
    if docker.get("image") or docker.get("head_image") or docker.get("worker_image"):
        opts = " ".join(str(o) for o in (docker.get("run_options") or []))
        if "--shm-size" not in opts:
            findings.append(Finding("shm", "Docker without --shm-size: dataloader workers fail on Docker's 64 MB "
                                    "/dev/shm; add run_options: [--shm-size=32g]"))
    return findings


def check_file(path: str | Path) -> list[Finding]:
    """Every finding for a cluster-launcher YAML or a Kubernetes manifest (one or more documents)."""
    from sweeps.ops.clustercheck_k8s import check_manifests, is_manifest

    try:
        docs = list(yaml.safe_load_all(Path(path).read_text()))
    except (OSError, yaml.YAMLError) as exc:
        return [Finding("schema", f"cannot read {path}: {exc}")]
    if is_manifest(docs):
        return check_manifests(docs)
    if len(docs) > 1:
        return [Finding("schema", f"{path} holds {len(docs)} YAML documents; a cluster-launcher config is one, "
                        "and Kubernetes documents each need apiVersion and kind")]
    return check_config(docs[0] if docs else None)
