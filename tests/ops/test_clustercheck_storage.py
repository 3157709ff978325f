"""A RayJob's storage_path must reach every Ray pod: a head-only volume (or the head's own disk) while worker
groups exist is caught at the worker group's mounts, an object store without credentials on a group at its env;
the team variant (cluster/team/kubernetes/) keeps it on the object store with the credentials on every pod."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeps.cli import main
from sweeps.ops.clustercheck_k8s import check_manifests
from sweeps.spec import parse_spec
from tests.helpers.team_manifests import HEAD, K8S, SHIPPED, TEAM, WORKER, found_checks, load_docs, one_doc


def _job_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(one_doc(docs, "ConfigMap")["data"]["sweep.yaml"])


def test_team_rayjob_keeps_storage_on_the_object_store_with_credentials_on_every_pod() -> None:
    docs = load_docs(TEAM / "kubernetes" / "rayjob.yaml")
    assert _job_spec(docs)["storage_path"].startswith("s3://")
    spec = parse_spec(one_doc(docs, "ConfigMap")["data"]["sweep.yaml"], "team rayjob.yaml ConfigMap")  # the whole spec
    assert spec.storage_path == "s3://team-bucket/sweeps" and spec.tracking.uri == "http://mlflow:5000"
    cluster = one_doc(docs, "RayJob")["spec"]["rayClusterSpec"]
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
    cluster = one_doc(load_docs(TEAM / "kubernetes" / "raycluster.yaml"), "RayCluster")["spec"]
    job = copy.deepcopy(one_doc(load_docs(TEAM / "kubernetes" / "rayjob.yaml"), "RayJob")["spec"]["rayClusterSpec"])
    head = job["headGroupSpec"]["template"]["spec"]
    del head["volumes"], head["containers"][0]["volumeMounts"]  # the spec's ConfigMap
    for spec in (cluster, job):
        for group in spec["workerGroupSpecs"]:
            group.pop("replicas")
    assert job == cluster


# (a) storage_path that a worker group cannot reach
def _drop_worker_mount(docs: list[dict[str, Any]]) -> None:
    c = one_doc(docs, "RayJob")["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "results"]


def test_head_only_volume_as_storage_path_is_caught() -> None:
    docs = load_docs(K8S / "rayjob.yaml")
    _drop_worker_mount(docs)
    findings = [f for f in check_manifests(docs) if f.check == "storage"]
    assert [(f.doc, f.path) for f in findings] == [("RayJob/gpu-sweep", f"{WORKER}.volumeMounts")]
    assert "/mnt/results/ray_results" in findings[0].message and "ReadWriteMany" in findings[0].message


@pytest.mark.parametrize("storage", ["/tmp/ray_results", "ray_results"])
def test_storage_on_the_heads_own_disk_is_caught(storage: str) -> None:
    docs = load_docs(K8S / "rayjob.yaml")
    config = one_doc(docs, "ConfigMap")
    config["data"]["sweep.yaml"] = config["data"]["sweep.yaml"].replace("/mnt/results/ray_results", storage)
    assert ("storage", f"{WORKER}.volumeMounts") in found_checks(docs)


def test_head_only_volume_without_worker_groups_passes() -> None:
    docs = load_docs(K8S / "rayjob.yaml")
    _drop_worker_mount(docs)
    one_doc(docs, "RayJob")["spec"]["rayClusterSpec"]["workerGroupSpecs"] = []
    assert not any(f.check == "storage" for f in check_manifests(docs))


@pytest.mark.parametrize("group", [HEAD, WORKER])
def test_object_store_without_credentials_on_a_group_is_caught(group: str) -> None:
    docs = load_docs(TEAM / "kubernetes" / "rayjob.yaml")
    cluster = one_doc(docs, "RayJob")["spec"]["rayClusterSpec"]
    g = cluster["headGroupSpec"] if group == HEAD else cluster["workerGroupSpecs"][0]
    c = g["template"]["spec"]["containers"][0]
    c["env"] = [e for e in c["env"] if not e["name"].startswith("AWS_")]
    assert found_checks(docs) == {("storage", f"{group}.env")}
    g["template"]["spec"]["serviceAccountName"] = "sweeps-s3"  # an IAM role for service accounts
    assert found_checks(docs) == set()


def test_cli_names_file_field_and_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster-check", *map(str, SHIPPED)]) == 0
    docs = load_docs(K8S / "rayjob.yaml")
    _drop_worker_mount(docs)
    bad = tmp_path / "head-only.yaml"
    bad.write_text(yaml.safe_dump_all(docs))
    capsys.readouterr()
    assert main(["cluster-check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}: 1 finding(s)" in out
    assert f"[storage] RayJob/gpu-sweep {WORKER}.volumeMounts: storage_path /mnt/results/ray_results" in out
