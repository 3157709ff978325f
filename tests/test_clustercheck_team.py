"""The team variant (cluster/team/) passes `sweeps cluster-check`; each unsafe variant of what it fixes is caught:
a head-only volume as storage_path, an object store without credentials on a group, sqlite with more than one
MLflow process or replica, a basic-auth server whose key is missing or not from a secret, a password in the file."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeps.cli import main
from sweeps.ops.clustercheck import check_config, check_file
from sweeps.ops.clustercheck_k8s import check_manifests

REPO = Path(__file__).resolve().parents[1]
TEAM = REPO / "cluster" / "team"
K8S = REPO / "cluster" / "kubernetes"
SHIPPED = sorted([*TEAM.glob("*.yaml"), *(TEAM / "kubernetes").glob("*.yaml")])
HEAD = "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0]"
WORKER = "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0]"
SERVER = "spec.template.spec.containers[0]"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def _found(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(f.check, f.path) for f in check_manifests(docs)}


def test_the_team_variant_has_its_files() -> None:
    assert {p.relative_to(TEAM).as_posix() for p in SHIPPED} == {
        "aws.yaml", "kubernetes/mlflow.yaml", "kubernetes/raycluster.yaml", "kubernetes/rayjob.yaml"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.relative_to(TEAM).as_posix())
def test_shipped_team_file_passes(path: Path) -> None:
    assert check_file(path) == []


def _job_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(_one(docs, "ConfigMap")["data"]["sweep.yaml"])


def test_team_rayjob_keeps_storage_on_the_object_store_with_credentials_on_every_pod() -> None:
    docs = _docs(TEAM / "kubernetes" / "rayjob.yaml")
    assert _job_spec(docs)["storage_path"].startswith("s3://")
    cluster = _one(docs, "RayJob")["spec"]["rayClusterSpec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert "secretKeyRef" in env[name]["valueFrom"], name
        assert not any("persistentVolumeClaim" in v for v in pod.get("volumes", []))
    head = {e["name"]: e for e in cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        assert "secretKeyRef" in head[name]["valueFrom"], name


def test_team_raycluster_is_the_rayjobs_cluster() -> None:
    cluster = _one(_docs(TEAM / "kubernetes" / "raycluster.yaml"), "RayCluster")["spec"]
    job = copy.deepcopy(_one(_docs(TEAM / "kubernetes" / "rayjob.yaml"), "RayJob")["spec"]["rayClusterSpec"])
    head = job["headGroupSpec"]["template"]["spec"]
    del head["volumes"], head["containers"][0]["volumeMounts"]  # the spec's ConfigMap
    for spec in (cluster, job):
        for group in spec["workerGroupSpecs"]:
            group.pop("replicas")
    assert job == cluster


def test_team_server_migrates_before_one_server_starts() -> None:
    deployment = _one(_docs(TEAM / "kubernetes" / "mlflow.yaml"), "Deployment")
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
    pod = _one(_docs(TEAM / "kubernetes" / "mlflow.yaml"), "Deployment")["spec"]["template"]["spec"]
    images = {c["image"] for key in ("initContainers", "containers") for c in pod[key]}
    assert images == {f"ghcr.io/your-org/mlflow-team:{version}"}


# (a) storage_path that a worker group cannot reach
def _drop_worker_mount(docs: list[dict[str, Any]]) -> None:
    c = _one(docs, "RayJob")["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "results"]


def test_head_only_volume_as_storage_path_is_caught() -> None:
    docs = _docs(K8S / "rayjob.yaml")
    _drop_worker_mount(docs)
    findings = [f for f in check_manifests(docs) if f.check == "storage"]
    assert [(f.doc, f.path) for f in findings] == [("RayJob/gpu-sweep", f"{WORKER}.volumeMounts")]
    assert "/mnt/results/ray_results" in findings[0].message and "ReadWriteMany" in findings[0].message


@pytest.mark.parametrize("storage", ["/tmp/ray_results", "ray_results"])
def test_storage_on_the_heads_own_disk_is_caught(storage: str) -> None:
    docs = _docs(K8S / "rayjob.yaml")
    config = _one(docs, "ConfigMap")
    config["data"]["sweep.yaml"] = config["data"]["sweep.yaml"].replace("/mnt/results/ray_results", storage)
    assert ("storage", f"{WORKER}.volumeMounts") in _found(docs)


def test_head_only_volume_without_worker_groups_passes() -> None:
    docs = _docs(K8S / "rayjob.yaml")
    _drop_worker_mount(docs)
    _one(docs, "RayJob")["spec"]["rayClusterSpec"]["workerGroupSpecs"] = []
    assert not any(f.check == "storage" for f in check_manifests(docs))


@pytest.mark.parametrize("group", [HEAD, WORKER])
def test_object_store_without_credentials_on_a_group_is_caught(group: str) -> None:
    docs = _docs(TEAM / "kubernetes" / "rayjob.yaml")
    cluster = _one(docs, "RayJob")["spec"]["rayClusterSpec"]
    g = cluster["headGroupSpec"] if group == HEAD else cluster["workerGroupSpecs"][0]
    c = g["template"]["spec"]["containers"][0]
    c["env"] = [e for e in c["env"] if not e["name"].startswith("AWS_")]
    assert _found(docs) == {("storage", f"{group}.env")}
    g["template"]["spec"]["serviceAccountName"] = "sweeps-s3"  # an IAM role for service accounts
    assert _found(docs) == set()


# (b) sqlite with more than one MLflow process or replica; (c) secrets
def _server(docs: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
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
    "sqlite-replicas": (K8S / "mlflow.yaml", lambda d: _one(d, "Deployment")["spec"].update(replicas=2),
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
                                lambda d: _one(d, "Deployment")["spec"].update(replicas=2), "spec.replicas"),
}


@pytest.mark.parametrize("variant", sorted(BAD_SERVER))
def test_unsafe_mlflow_server_is_caught_at_its_field(variant: str) -> None:
    path, mutate, field = BAD_SERVER[variant]
    docs = _docs(path)
    mutate(docs)
    assert ("mlflow", field) in _found(docs), _found(docs)


def test_postgres_server_may_run_several_workers_and_replicas_with_a_job_upgrade() -> None:
    docs = _docs(TEAM / "kubernetes" / "mlflow.yaml")
    _args(_server(docs), "--workers", "--workers=4")
    _one(docs, "Deployment")["spec"]["template"]["spec"].pop("initContainers")
    _one(docs, "Deployment")["spec"]["replicas"] = 3
    assert _found(docs) == set()


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


def test_cli_names_file_field_and_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster-check", *map(str, SHIPPED)]) == 0
    docs = _docs(K8S / "rayjob.yaml")
    _drop_worker_mount(docs)
    bad = tmp_path / "head-only.yaml"
    bad.write_text(yaml.safe_dump_all(docs))
    capsys.readouterr()
    assert main(["cluster-check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}: 1 finding(s)" in out
    assert f"[storage] RayJob/gpu-sweep {WORKER}.volumeMounts: storage_path /mnt/results/ray_results" in out
