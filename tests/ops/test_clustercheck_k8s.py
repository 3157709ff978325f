"""Kubernetes manifests: the shipped ones pass `sweeps cluster-check`, every unsafe variant is caught at its
field path, and the runbook's commands point at the files and objects that exist. No GPU or Kubernetes
cluster is needed: the manifests are parsed and checked offline."""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeps.cli import main
from sweeps.ops.clustercheck import check_file
from sweeps.ops.clustercheck_k8s import check_manifests, is_manifest
from sweeps.spec import CategoricalParam, parse_spec

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "cluster" / "kubernetes"
MANIFESTS = sorted(K8S.glob("*.yaml"))
RAY = version("ray")
GPU = "nvidia.com/gpu"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def test_there_are_manifests() -> None:
    assert {p.name for p in MANIFESTS} == {"storage.yaml", "mlflow.yaml", "raycluster.yaml", "rayjob.yaml"}
    assert all(is_manifest(_docs(p.name)) for p in MANIFESTS)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_shipped_manifest_passes(path: Path) -> None:
    assert check_file(path) == []


# Each variant breaks one rule of raycluster.yaml; the finding must name this check and field path.
W0 = "spec.workerGroupSpecs[0]"
W0C = f"{W0}.template.spec.containers[0]"
HEAD = "spec.headGroupSpec"


def _worker(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["workerGroupSpecs"][0]


def _wc(doc: dict[str, Any]) -> dict[str, Any]:
    return _worker(doc)["template"]["spec"]["containers"][0]


def _hc(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]


Mutation = Callable[[dict[str, Any]], Any]
BAD_CLUSTER: dict[str, tuple[Mutation, str, str]] = {
    "no-auth": (lambda d: d["spec"].pop("authOptions"), "token-auth", "spec.authOptions"),
    "auth-disabled": (lambda d: d["spec"]["authOptions"].update(mode="disabled"), "token-auth",
                      "spec.authOptions.mode"),
    "auth-env-off": (lambda d: _wc(d).update(env=[{"name": "RAY_AUTH_MODE", "value": "disabled"}]), "token-auth",
                     f"{W0C}.env[0].value"),
    "ray-version": (lambda d: d["spec"].update(rayVersion="2.59.0"), "ray-version", "spec.rayVersion"),
    "ray-image-version": (lambda d: _wc(d).update(image="rayproject/ray:2.59.0-py311-gpu"), "ray-version",
                          f"{W0C}.image"),
    "gpu-limit-vs-num-gpus": (lambda d: _wc(d)["resources"]["limits"].update({GPU: "4"}), "gpu",
                              f"{W0C}.resources.limits.{GPU}"),
    "gpu-request-vs-limit": (lambda d: _wc(d)["resources"]["requests"].update({GPU: "4"}), "gpu",
                             f"{W0C}.resources.requests.{GPU}"),
    "gpu-request-no-limit": (lambda d: _wc(d)["resources"]["limits"].pop(GPU), "gpu",
                             f"{W0C}.resources.limits.{GPU}"),
    "gpu-no-num-gpus": (lambda d: _worker(d)["rayStartParams"].pop("num-gpus"), "gpu",
                        f"{W0}.rayStartParams.num-gpus"),
    "shm-missing": (lambda d: _wc(d).update(volumeMounts=[]), "shm", f"{W0C}.volumeMounts"),
    "shm-on-disk": (lambda d: _worker(d)["template"]["spec"]["volumes"][0].update(emptyDir={}), "shm",
                    f"{W0}.template.spec.volumes[0].emptyDir.medium"),
    "shm-unsized": (lambda d: _worker(d)["template"]["spec"]["volumes"][0]["emptyDir"].pop("sizeLimit"), "shm",
                    f"{W0}.template.spec.volumes[0].emptyDir.sizeLimit"),
    "head-loadbalancer": (lambda d: d["spec"]["headGroupSpec"].update(serviceType="LoadBalancer"), "exposure",
                          f"{HEAD}.serviceType"),
    "head-nodeport": (lambda d: d["spec"]["headGroupSpec"].update(headService={"spec": {"type": "NodePort"}}),
                      "exposure", f"{HEAD}.headService.spec.type"),
    "head-ingress": (lambda d: d["spec"]["headGroupSpec"].update(enableIngress=True), "exposure",
                     f"{HEAD}.enableIngress"),
    "host-port": (lambda d: _hc(d)["ports"][1].update(hostPort=8265), "exposure",
                  f"{HEAD}.template.spec.containers[0].ports[1].hostPort"),
    "image-latest": (lambda d: _wc(d).update(image="ghcr.io/your-org/gpu-sweeps:latest"), "image", f"{W0C}.image"),
    "image-untagged": (lambda d: _hc(d).update(image="registry:5000/your-org/gpu-sweeps"), "image",
                       f"{HEAD}.template.spec.containers[0].image"),
}


@pytest.mark.parametrize("variant", sorted(BAD_CLUSTER))
def test_bad_raycluster_is_caught_at_its_field(variant: str) -> None:
    mutate, check, path = BAD_CLUSTER[variant]
    doc = _one(_docs("raycluster.yaml"), "RayCluster")
    mutate(doc)
    found = {(f.check, f.path) for f in check_manifests([doc])}
    assert (check, path) in found, found
    assert all(f.doc == "RayCluster/gpu-sweeps" for f in check_manifests([doc]))


def test_image_pinned_by_digest_passes() -> None:
    doc = _one(_docs("raycluster.yaml"), "RayCluster")
    _wc(doc)["image"] = "ghcr.io/your-org/gpu-sweeps@sha256:" + "a" * 64
    assert check_manifests([doc]) == []


def test_bad_rayjob_is_caught_at_its_field() -> None:
    docs = _docs("rayjob.yaml")
    job = _one(docs, "RayJob")
    del job["spec"]["shutdownAfterJobFinishes"]
    job["spec"]["rayClusterSpec"]["authOptions"]["mode"] = "disabled"
    job["spec"]["submitterPodTemplate"] = {"spec": {"containers": [{"name": "submit", "image": "rayproject/ray"}]}}
    found = {(f.check, f.path) for f in check_manifests(docs)}
    assert found == {("rayjob", "spec.shutdownAfterJobFinishes"),
                     ("token-auth", "spec.rayClusterSpec.authOptions.mode"),
                     ("image", "spec.submitterPodTemplate.spec.containers[0].image")}


@pytest.mark.parametrize("service_type", ["LoadBalancer", "NodePort"])
def test_exposed_mlflow_is_caught(service_type: str) -> None:
    docs = _docs("mlflow.yaml")
    _one(docs, "Service")["spec"]["type"] = service_type
    container = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    container["args"] = [a for a in container["args"] if not a.startswith("--allowed-hosts")]
    container["image"] = "ghcr.io/mlflow/mlflow"
    found = {(f.doc, f.check, f.path) for f in check_manifests(docs)}
    at = "spec.template.spec.containers[0]"
    assert found == {("Service/mlflow", "exposure", "spec.type"), ("Deployment/mlflow", "mlflow", f"{at}.args"),
                     ("Deployment/mlflow", "image", f"{at}.image")}


def test_cli_prints_document_and_field_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster-check", *map(str, MANIFESTS)]) == 0
    doc = _one(_docs("raycluster.yaml"), "RayCluster")
    _wc(doc)["resources"]["limits"][GPU] = "4"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all([*_docs("storage.yaml"), doc]))
    capsys.readouterr()
    assert main(["cluster-check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"[gpu] RayCluster/gpu-sweeps {W0C}.resources.limits.nvidia.com/gpu: limits" in out


def test_rayjob_cluster_is_the_raycluster() -> None:
    """The two ways to run a sweep use the same cluster: only the RayJob's spec mount and start size differ."""
    cluster = copy.deepcopy(_one(_docs("raycluster.yaml"), "RayCluster")["spec"])
    job_cluster = copy.deepcopy(_one(_docs("rayjob.yaml"), "RayJob")["spec"]["rayClusterSpec"])
    head = job_cluster["headGroupSpec"]["template"]["spec"]
    head["volumes"] = [v for v in head["volumes"] if "configMap" not in v]
    mounts = head["containers"][0]["volumeMounts"]
    head["containers"][0]["volumeMounts"] = [m for m in mounts if m["name"] != "sweep-spec"]
    for spec in (cluster, job_cluster):
        for group in spec["workerGroupSpecs"]:
            group.pop("replicas")
    assert job_cluster == cluster


def test_rayjob_runs_the_spec_of_its_configmap() -> None:
    docs = _docs("rayjob.yaml")
    job, config = _one(docs, "RayJob")["spec"], _one(docs, "ConfigMap")
    head = job["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (volume,) = [v for v in head["volumes"] if v.get("configMap", {}).get("name") == config["metadata"]["name"]]
    (mount,) = [m for m in head["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    argv = shlex.split(job["entrypoint"])
    assert argv[:4] == ["python", "-m", "sweeps", "run"]
    spec_path = Path(argv[4])
    assert spec_path.parent == Path(mount["mountPath"]) and spec_path.name in config["data"]
    spec = parse_spec(config["data"][spec_path.name], "rayjob.yaml ConfigMap")
    assert spec.scaling.use_gpu and spec.tracking.uri == "http://mlflow:5000"
    results = [m["mountPath"] for m in head["containers"][0]["volumeMounts"] if m["name"] == "results"]
    assert Path(spec.storage_path).is_relative_to(results[0])
    # what a trial holds at once fits the worker pod, times the concurrent trials
    worker = job["rayClusterSpec"]["workerGroupSpecs"][0]
    limits = worker["template"]["spec"]["containers"][0]["resources"]["limits"]
    loaders = spec.space.held("num_dataloader_workers")
    assert isinstance(loaders, CategoricalParam)
    need = spec.scaling.per_trial(max(int(n) for n in loaders.choices))
    assert need["GPU"] * spec.budget.max_concurrent_trials <= int(limits[GPU])
    assert need["CPU"] * spec.budget.max_concurrent_trials <= int(limits["cpu"])


def test_dockerfile_builds_on_the_pinned_ray_gpu_image() -> None:
    text = (K8S / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
    (base,) = re.findall(r"^FROM (\S+)", text, re.M)
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
    assert re.fullmatch(rf"rayproject/ray:{re.escape(RAY)}-py3\d+-gpu", base), base
    for src in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, re.M):
        assert all((REPO / s).exists() for s in src.split()), src
    tag = args["RAY_VERSION"]
    images = {c["image"] for name in ("raycluster.yaml", "rayjob.yaml") for c in _containers(_docs(name))}
    assert images == {f"ghcr.io/your-org/gpu-sweeps:0.1.0-ray{tag}"}


def _containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The containers of every Ray group (head and workers) of the RayClusters and RayJobs in docs."""
    out = []
    for doc in docs:
        if doc["kind"] not in ("RayCluster", "RayJob"):
            continue
        spec = doc["spec"].get("rayClusterSpec", doc["spec"])
        for group in [spec.get("headGroupSpec"), *spec.get("workerGroupSpecs", [])]:
            if group:
                out += group["template"]["spec"]["containers"]
    return out


def _runbook() -> list[list[str]]:
    """The fenced bash commands of the Kubernetes part of cluster/README.md, one argv each."""
    text = (REPO / "cluster" / "README.md").read_text()
    section = text[text.index("## Sweeps on Kubernetes"):]
    lines = [ln for block in re.findall(r"```bash\n(.*?)```", section, re.S) for ln in block.splitlines()]
    return [shlex.split(ln, comments=True) for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def _objects() -> dict[tuple[str, str], Path]:
    return {(d["kind"], d["metadata"]["name"]): p for p in MANIFESTS for d in _docs(p.name)}


def test_runbook_applies_the_checked_manifests() -> None:
    cmds = _runbook()
    applied = [Path(c[3]) for c in cmds if c[:3] == ["kubectl", "apply", "-f"]]
    deleted = [Path(c[3]) for c in cmds if c[:3] == ["kubectl", "delete", "-f"]]
    assert sorted(REPO / p for p in applied) == MANIFESTS  # every manifest is applied, each once
    assert {REPO / p for p in deleted} == set(MANIFESTS) - {K8S / "storage.yaml"}  # the volumes stay
    (check,) = [c for c in cmds if c[1:2] == ["cluster-check"]]
    assert sorted(p for arg in check[2:] for p in REPO.glob(arg)) == MANIFESTS
    (build,) = [c for c in cmds if c[:2] == ["docker", "build"]]
    assert REPO / build[build.index("-f") + 1] == K8S / "Dockerfile"
    (push,) = [c for c in cmds if c[:2] == ["docker", "push"]]
    assert push[2] == build[build.index("-t") + 1] == _containers(_docs("raycluster.yaml"))[0]["image"]
    assert any(c[:2] == ["helm", "install"] and "kuberay/kuberay-operator" in c for c in cmds)


def test_runbook_names_objects_that_exist() -> None:
    cmds, objects = _runbook(), _objects()
    cluster = _one(_docs("raycluster.yaml"), "RayCluster")["metadata"]["name"]
    services = {f"{cluster}-head-svc"} | {name for kind, name in objects if kind == "Service"}
    forwards = [c[2] for c in cmds if c[:2] == ["kubectl", "port-forward"]]
    assert forwards and all(f.removeprefix("svc/") in services for f in forwards), forwards
    for c in cmds:
        if c[:2] == ["kubectl", "get"] and c[2] in ("raycluster", "rayjob"):
            assert ({"raycluster": "RayCluster", "rayjob": "RayJob"}[c[2]], c[3]) in objects, c
        if c[:1] == ["export"] and "get secret" in " ".join(c):
            assert f"get secret {cluster} " in " ".join(c)  # KubeRay names the token Secret after the cluster
        if c[:3] == ["kubectl", "logs", "-f"]:
            assert ("RayJob", c[-1].removeprefix("job-name=")) in objects, c


def test_runbooks_check_the_cluster_with_the_doctor() -> None:
    doctor = "ray job submit --address http://127.0.0.1:8265 --working-dir . -- python -m sweeps doctor --gpu-checks"
    text = (REPO / "cluster" / "README.md").read_text()
    launcher, k8s = text.split("## Sweeps on Kubernetes")
    assert launcher.index("ray up cluster/aws.yaml") < launcher.index(doctor) < launcher.index("sweeps run")
    assert k8s.index("kubectl apply -f cluster/kubernetes/raycluster.yaml") < k8s.index(doctor) < k8s.index("sweeps run")
