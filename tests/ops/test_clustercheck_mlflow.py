"""The team variant (cluster/team/) passes `sweeps cluster-check`, and the MLflow server checks catch each unsafe
variant at its field: sqlite with more than one process or replica (no --workers: MLflow 3.17 starts 4), a
basic-auth server whose key is missing or not from a secret, a password written in the file."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeps.ops.clustercheck import check_config, check_file
from tests.helpers.team_manifests import K8S, REPO, SERVER, SHIPPED, TEAM, found_checks, load_docs, one_doc


def test_the_team_variant_has_its_files() -> None:
    assert {p.relative_to(TEAM).as_posix() for p in SHIPPED} == {
        "aws.yaml", "kubernetes/mlflow.yaml", "kubernetes/raycluster.yaml", "kubernetes/rayjob.yaml"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.relative_to(TEAM).as_posix())
def test_shipped_team_file_passes(path: Path) -> None:
    assert check_file(path) == []


def test_team_server_migrates_before_one_server_starts() -> None:
    deployment = one_doc(load_docs(TEAM / "kubernetes" / "mlflow.yaml"), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"][:3] == ["mlflow", "db", "upgrade"] and deployment["spec"]["replicas"] == 1
    args = " ".join(pod["containers"][0]["args"])
    assert "--app-name=basic-auth" in args and "--artifacts-destination=s3://" in args
    assert "--backend-store-uri=$(MLFLOW_BACKEND_STORE_URI)" in args


def test_mlflow_image_has_the_server_packages() -> None:
    text = (TEAM / "kubernetes" / "Dockerfile.mlflow").read_text()
    assert re.search(r'"mlflow\[db,auth\]==\$\{MLFLOW_VERSION\}" boto3 psycopg2-binary', text)
    version = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))["MLFLOW_VERSION"]
    pod = one_doc(load_docs(TEAM / "kubernetes" / "mlflow.yaml"), "Deployment")["spec"]["template"]["spec"]
    images = {c["image"] for key in ("initContainers", "containers") for c in pod[key]}
    assert images == {f"ghcr.io/your-org/mlflow-team:{version}"}


# (b) sqlite with more than one MLflow process or replica; (c) secrets
def _server(docs: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = one_doc(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return container


def _args(c: dict[str, Any], drop: str, *add: str) -> None:
    c["args"] = [a for a in c["args"] if not a.startswith(drop)] + list(add)


def _env(c: dict[str, Any], name: str, **value: Any) -> None:
    c["env"] = [e for e in c["env"] if e["name"] != name] + ([{"name": name, **value}] if value else [])


Mutation = Callable[[list[dict[str, Any]]], Any]
BAD_SERVER: dict[str, tuple[Path, Mutation, str]] = {
    "sqlite-no-workers": (K8S / "mlflow.yaml", lambda d: _args(_server(d), "--workers"), f"{SERVER}.args"),
    "sqlite-workers-2": (K8S / "mlflow.yaml", lambda d: _args(_server(d), "--workers", "--workers=2"),
                         f"{SERVER}.args"),
    "sqlite-mlflow-workers-env": (K8S / "mlflow.yaml", lambda d: (_args(_server(d), "--workers"), _server(d).update(
        env=[{"name": "MLFLOW_WORKERS", "value": "3"}])), f"{SERVER}.args"),
    "sqlite-replicas": (K8S / "mlflow.yaml", lambda d: one_doc(d, "Deployment")["spec"].update(replicas=2),
                        "spec.replicas"),
    "key-missing": (TEAM / "kubernetes" / "mlflow.yaml", lambda d: _env(_server(d), "MLFLOW_FLASK_SERVER_SECRET_KEY"),
                    f"{SERVER}.env"),
    "key-literal": (TEAM / "kubernetes" / "mlflow.yaml",
                    lambda d: _env(_server(d), "MLFLOW_FLASK_SERVER_SECRET_KEY", value="not-a-secret"),
                    f"{SERVER}.env[5].value"),
    "key-configmap": (TEAM / "kubernetes" / "mlflow.yaml", lambda d: _env(
        _server(d), "MLFLOW_FLASK_SERVER_SECRET_KEY", valueFrom={"configMapKeyRef": {"name": "c", "key": "k"}}),
                      f"{SERVER}.env[5].valueFrom"),
    "admin-password-literal": (TEAM / "kubernetes" / "mlflow.yaml", lambda d: _env(
        _server(d), "MLFLOW_AUTH_ADMIN_PASSWORD", value="twelve-chars-or-more"), f"{SERVER}.env[5].value"),
    "db-password-in-args": (TEAM / "kubernetes" / "mlflow.yaml", lambda d: _args(
        _server(d), "--backend-store-uri", "--backend-store-uri=postgresql://mlflow:hunter2@db:5432/mlflow"),
                            f"{SERVER}.args"),
    "auth-users-in-sqlite": (TEAM / "kubernetes" / "mlflow.yaml", lambda d: _env(_server(d), "MLFLOW_AUTH_CONFIG_PATH"),
                             f"{SERVER}.env"),
    "upgrade-in-two-replicas": (TEAM / "kubernetes" / "mlflow.yaml",
                                lambda d: one_doc(d, "Deployment")["spec"].update(replicas=2), "spec.replicas"),
}


@pytest.mark.parametrize("variant", sorted(BAD_SERVER))
def test_unsafe_mlflow_server_is_caught_at_its_field(variant: str) -> None:
    path, mutate, field = BAD_SERVER[variant]
    docs = load_docs(path)
    mutate(docs)
    assert ("mlflow", field) in found_checks(docs), found_checks(docs)


def test_postgres_server_may_run_several_workers_and_replicas_with_a_job_upgrade() -> None:
    docs = load_docs(TEAM / "kubernetes" / "mlflow.yaml")
    _args(_server(docs), "--workers", "--workers=4")
    one_doc(docs, "Deployment")["spec"]["template"]["spec"].pop("initContainers")
    one_doc(docs, "Deployment")["spec"]["replicas"] = 3
    assert found_checks(docs) == set()


# The launcher YAMLs: today's run one process on sqlite; the team's takes every secret from Secrets Manager.
def _head_commands(config: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    config = copy.deepcopy(config)
    config["head_start_ray_commands"] = [c.replace(old, new) for c in config["head_start_ray_commands"]]
    assert config["head_start_ray_commands"] != yaml.safe_load((TEAM / "aws.yaml").read_text())[
        "head_start_ray_commands"] or old == new
    return config


@pytest.mark.parametrize("name", ["aws.yaml", "gcp.yaml", "onprem.yaml"])
def test_launcher_sqlite_without_workers_1_is_caught(name: str) -> None:
    config = yaml.safe_load((REPO / "cluster" / name).read_text())
    config["head_start_ray_commands"] = [c.replace(" --workers 1", "") for c in config["head_start_ray_commands"]]
    (finding,) = [f for f in check_config(config) if f.check == "mlflow"]
    assert finding.path.startswith("head_start_ray_commands[") and "MLflow 3.17 starts 4" in finding.message


LAUNCHER: dict[str, tuple[str, str]] = {
    "key-missing": ("MLFLOW_FLASK_SERVER_SECRET_KEY=", "UNRELATED="),
    "key-literal": ("MLFLOW_FLASK_SERVER_SECRET_KEY=$(aws secretsmanager get-secret-value --secret-id "
                    "gpu-sweeps/mlflow-flask-key --query SecretString --output text)",
                    "MLFLOW_FLASK_SERVER_SECRET_KEY=written-here"),
    "db-password": ('--backend-store-uri "$MLFLOW_BACKEND_STORE_URI"',
                    "--backend-store-uri postgresql://mlflow:hunter2@db.internal:5432/mlflow"),
}


@pytest.mark.parametrize("variant", sorted(LAUNCHER))
def test_unsafe_team_launcher_server_is_caught(variant: str) -> None:
    old, new = LAUNCHER[variant]
    config = _head_commands(yaml.safe_load((TEAM / "aws.yaml").read_text()), old, new)
    assert [f.path for f in check_config(config) if f.check == "mlflow"] == ["head_start_ray_commands[2]"]
