"""`sweeps cluster-check` for Kubernetes manifests: KubeRay `RayCluster`/`RayJob` and plain objects.

A file is a Kubernetes manifest when its documents carry `apiVersion` and `kind`. Checks, each a
finding that names the document, the field path and the fix:
- token-auth: every Ray cluster sets `authOptions.mode: token` (KubeRay >= 1.5.1), no container
  overrides `RAY_AUTH_MODE`;
- ray-version: `rayVersion` (and any `rayproject/ray` image tag) equals the installed Ray;
- gpu: a group's `nvidia.com/gpu` limit equals its request (when given) and `rayStartParams.num-gpus`;
- shm: every group with GPUs mounts a memory-backed, sized `emptyDir` at `/dev/shm` (always, not only
  when a spec searches loader workers: the cluster outlives any one spec, and NCCL uses /dev/shm too);
- exposure: no `LoadBalancer`/`NodePort` head or Service, no KubeRay ingress, no `hostPort`;
- mlflow: an `mlflow server` container sets `--allowed-hosts` (and not `*`); on sqlite it runs one
  process in one replica; a basic-auth server takes its secret key from a Secret, no password is written
  in the manifest (`sweeps.ops.clustercheck_mlflow`); `mlflow db upgrade` in an initContainer runs in one
  replica only (nothing serialises two migrations, mlflow#19299);
- storage: a RayJob's `storage_path` (its spec in a ConfigMap of the same file) is on a volume every
  worker group mounts at the same path, or on an object store whose credentials every group has
  (`sweeps.ops.clustercheck_storage`);
- image: every container image is tagged (or pinned by digest) and not `latest`;
- rayjob: a `RayJob` that creates its cluster deletes it when the job ends (`shutdownAfterJobFinishes`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from sweeps.ops.clustercheck_mlflow import Fixes, container_env, is_server, server_findings
from sweeps.ops.clustercheck_storage import check_storage
from sweeps.ops.findings import Finding

GPU = "nvidia.com/gpu"
_EXPOSED = {"LoadBalancer", "NodePort"}
_WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


def is_manifest(docs: list[Any]) -> bool:
    """True when the parsed YAML documents are Kubernetes objects (not a cluster-launcher config)."""
    objs = [d for d in docs if d is not None]
    return bool(objs) and all(isinstance(d, dict) and "apiVersion" in d and "kind" in d for d in objs)


def _name(doc: dict[str, Any]) -> str:
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name', '?')}"


def _installed_ray() -> str | None:
    try:
        return version("ray")
    except PackageNotFoundError:
        return None


def _as_int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


class _Doc:
    """Collects the findings of one document, each at a field path."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.name = _name(doc)
        self.findings: list[Finding] = []

    def add(self, check: str, path: str, message: str) -> None:
        self.findings.append(Finding(check, message, path=path, doc=self.name))


def _groups(cluster: dict[str, Any], at: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, group spec) for the head group and each worker group of a RayClusterSpec."""
    if isinstance(cluster.get("headGroupSpec"), dict):
        yield f"{at}.headGroupSpec", cluster["headGroupSpec"]
    for i, group in enumerate(cluster.get("workerGroupSpecs") or []):
        if isinstance(group, dict):
            yield f"{at}.workerGroupSpecs[{i}]", group


def _containers(pod: dict[str, Any], at: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for key in ("initContainers", "containers"):
        for i, c in enumerate(pod.get(key) or []):
            if isinstance(c, dict):
                yield f"{at}.{key}[{i}]", c


def _check_image(d: _Doc, path: str, image: Any, ray: str | None) -> None:
    ref = str(image or "")
    name, _, digest = ref.partition("@")
    colon = name.rfind(":")
    repo, tag = (name[:colon], name[colon + 1:]) if colon > name.rfind("/") else (name, "")
    if not ref:
        d.add("image", f"{path}.image", "no image; set one built from cluster/kubernetes/Dockerfile with a version tag")
    elif not digest and tag in ("", "latest"):
        d.add("image", f"{path}.image", f"image {ref!r} is {'untagged' if not tag else 'latest'}: pods started at "
              "different times may run different code; tag it with a version (e.g. :0.1.0-ray2.60.0) or a digest")
    official = re.fullmatch(r"(docker\.io/)?rayproject/ray(-ml|-llm)?", repo)
    if ray and official and tag and tag.split("-")[0] != ray:
        d.add("ray-version", f"{path}.image", f"image {ref!r} is not Ray {ray} (the installed Ray); use "
              f"rayproject/ray:{ray}-py311-gpu or an image built on it")


_FROM_SECRET = "env: [{name: VAR, valueFrom: {secretKeyRef: {name: SECRET, key: KEY}}}], as cluster/team/ does"


def _check_mlflow(d: _Doc, c: dict[str, Any], path: str, words: list[str], replicas: int, replicas_at: str) -> None:
    env, from_secret = container_env(c, path)
    fixes = Fixes(secret=_FROM_SECRET, env_at=f"{path}.env", args_at=f"{path}.args", replicas_at=replicas_at)
    for field, message in server_findings(words, env, replicas, fixes, from_secret):
        d.add("mlflow", field, message)


def _check_pod(d: _Doc, pod: dict[str, Any], at: str, ray: str | None, replicas: int = 1,
               replicas_at: str = "") -> None:
    for path, c in _containers(pod, at):
        _check_image(d, path, c.get("image"), ray)
        for j, port in enumerate(c.get("ports") or []):
            if isinstance(port, dict) and port.get("hostPort"):
                d.add("exposure", f"{path}.ports[{j}].hostPort", f"hostPort {port['hostPort']} opens the port on the "
                      "node's address; remove it and reach the port with kubectl port-forward")
        for j, env in enumerate(c.get("env") or []):
            if isinstance(env, dict) and env.get("name") == "RAY_AUTH_MODE" and env.get("value") != "token":
                d.add("token-auth", f"{path}.env[{j}].value", f"RAY_AUTH_MODE={env.get('value')!r} turns token auth "
                      "off for this container; remove the variable (authOptions sets it)")
        words = [str(w) for w in [*(c.get("command") or []), *(c.get("args") or [])]]
        line = " ".join(words)
        if re.search(r"\bmlflow (server|ui)\b", line):
            hosts = re.search(r"--allowed-hosts[= ](\S+)", line)
            if hosts is None or "*" in hosts.group(1).split(","):
                d.add("mlflow", f"{path}.args", "MLflow server without a list of --allowed-hosts (DNS rebinding); add "
                      "--allowed-hosts=mlflow:5000,localhost:5000,127.0.0.1:5000")
            if is_server(words):
                _check_mlflow(d, c, path, words, replicas, replicas_at)
        if ".initContainers[" in path and re.search(r"\bmlflow db upgrade\b", line) and replicas > 1:
            d.add("mlflow", replicas_at, f"{replicas} replicas each run `mlflow db upgrade` in an initContainer: nothing "
                  "serialises two migrations of one database (mlflow#19299); set replicas: 1, or run the upgrade "
                  "once in a Job before the servers start")


def _check_group(d: _Doc, path: str, group: dict[str, Any], ray: str | None) -> None:
    pod = (group.get("template") or {}).get("spec")
    containers = pod.get("containers") if isinstance(pod, dict) else None
    if not isinstance(pod, dict) or not containers or not isinstance(containers[0], dict):
        d.add("schema", f"{path}.template.spec.containers", "a Ray group needs a pod template with the Ray container first")
        return
    _check_pod(d, pod, f"{path}.template.spec", ray)
    ray_c, at = containers[0], f"{path}.template.spec.containers[0]"  # KubeRay runs Ray in the first container
    resources = ray_c.get("resources") or {}
    limit, request = (resources.get("limits") or {}).get(GPU), (resources.get("requests") or {}).get(GPU)
    params = group.get("rayStartParams") or {}
    num_gpus = params.get("num-gpus")
    n_limit = _as_int(limit) if limit is not None else 0
    if request is not None and limit is None:
        d.add("gpu", f"{at}.resources.limits.{GPU}", f"requests {GPU}={request} without a limit: Kubernetes "
              f"schedules GPUs by the limit; set limits.{GPU} equal to the request")
    elif request is not None and _as_int(request) != n_limit:
        d.add("gpu", f"{at}.resources.requests.{GPU}", f"GPU request {request} != limit {limit}; set both to the "
              "same count (Kubernetes refuses a GPU request that differs from its limit)")
    if n_limit and num_gpus is None:
        d.add("gpu", f"{path}.rayStartParams.num-gpus", f"the pod has {limit} GPU(s) but rayStartParams sets no "
              f"num-gpus; set num-gpus: \"{limit}\" so Ray and Kubernetes count the same GPUs")
    elif num_gpus is not None and _as_int(num_gpus) != n_limit:
        d.add("gpu", f"{at}.resources.limits.{GPU}", f"limits.{GPU}={limit} but rayStartParams.num-gpus={num_gpus}: "
              "Ray would schedule GPUs the pod cannot see (or leave some idle); set both to the same count")
    if n_limit or _as_int(num_gpus or 0):
        _check_shm(d, pod, at, f"{path}.template.spec")


def _check_shm(d: _Doc, pod: dict[str, Any], at: str, pod_at: str) -> None:
    mounts = {m.get("name"): m for m in pod["containers"][0].get("volumeMounts") or [] if isinstance(m, dict)}
    shm = [m for m in mounts.values() if str(m.get("mountPath", "")).rstrip("/") == "/dev/shm"]
    fix = "add volumes: [{name: dshm, emptyDir: {medium: Memory, sizeLimit: 64Gi}}] and mount it at /dev/shm"
    if not shm:
        d.add("shm", f"{at}.volumeMounts", f"no volume at /dev/shm: containers get 64 MB, too little for dataloader "
              f"workers and NCCL; {fix}")
        return
    volumes = {v.get("name"): (i, v) for i, v in enumerate(pod.get("volumes") or []) if isinstance(v, dict)}
    i, volume = volumes.get(shm[0].get("name"), (None, {}))
    empty = volume.get("emptyDir")
    if not isinstance(empty, dict) or empty.get("medium") != "Memory":
        d.add("shm", f"{pod_at}.volumes[{i}].emptyDir.medium" if i is not None else f"{pod_at}.volumes",
              f"/dev/shm is not a memory-backed emptyDir; {fix}")
    elif not empty.get("sizeLimit"):
        d.add("shm", f"{pod_at}.volumes[{i}].emptyDir.sizeLimit", "/dev/shm has no sizeLimit; size it for the "
              "loader workers (batch bytes x prefetch x workers per rank x ranks), e.g. 64Gi")


def _check_ray_cluster(d: _Doc, spec: Any, at: str, ray: str | None) -> None:
    if not isinstance(spec, dict) or not isinstance(spec.get("headGroupSpec"), dict):
        d.add("schema", f"{at}.headGroupSpec", "a RayCluster spec needs headGroupSpec")
        return
    auth = spec.get("authOptions")
    if not isinstance(auth, dict):
        d.add("token-auth", f"{at}.authOptions", "no token authentication: anyone who reaches the dashboard or job "
              "server can run code; add authOptions: {mode: token} (KubeRay >= 1.5.1)")
    elif auth.get("mode", "token") != "token":
        d.add("token-auth", f"{at}.authOptions.mode", f"authOptions.mode is {auth.get('mode')!r}; set it to token")
    if ray is not None and str(spec.get("rayVersion", "")) != ray:
        d.add("ray-version", f"{at}.rayVersion", f"rayVersion is {spec.get('rayVersion')!r}, the installed Ray is "
              f"{ray}: set rayVersion: \"{ray}\" and use an image with that Ray")
    head = spec["headGroupSpec"]
    if head.get("serviceType") in _EXPOSED:
        d.add("exposure", f"{at}.headGroupSpec.serviceType", f"serviceType {head['serviceType']} publishes the "
              "dashboard and job server; use ClusterIP and kubectl port-forward")
    service_type = ((head.get("headService") or {}).get("spec") or {}).get("type")
    if service_type in _EXPOSED:
        d.add("exposure", f"{at}.headGroupSpec.headService.spec.type", f"head Service type {service_type} publishes "
              "the dashboard and job server; use ClusterIP and kubectl port-forward")
    if head.get("enableIngress"):
        d.add("exposure", f"{at}.headGroupSpec.enableIngress", "an Ingress publishes the dashboard and job server; "
              "remove enableIngress and use kubectl port-forward")
    for path, group in _groups(spec, at):
        _check_group(d, path, group, ray)


def _pod_spec(doc: dict[str, Any]) -> tuple[str, Any] | None:
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    if kind == "Pod":
        return "spec", spec
    if kind in _WORKLOADS:
        return "spec.template.spec", (spec.get("template") or {}).get("spec")
    if kind == "CronJob":
        return "spec.jobTemplate.spec.template.spec", (((spec.get("jobTemplate") or {}).get("spec") or {})
                                                       .get("template") or {}).get("spec")
    return None


def check_document(doc: dict[str, Any], ray: str | None) -> list[Finding]:
    """Every finding for one Kubernetes object; `ray` is the Ray version the cluster must run."""
    d, spec = _Doc(doc), doc.get("spec")
    kind = doc.get("kind")
    if kind == "RayCluster":
        _check_ray_cluster(d, spec, "spec", ray)
    elif kind == "RayJob" and isinstance(spec, dict):
        if "rayClusterSpec" in spec:
            _check_ray_cluster(d, spec["rayClusterSpec"], "spec.rayClusterSpec", ray)
            if spec.get("shutdownAfterJobFinishes") is not True:
                d.add("rayjob", "spec.shutdownAfterJobFinishes", "the Ray cluster (and its GPUs) outlives the job; set "
                      "shutdownAfterJobFinishes: true (ttlSecondsAfterFinished to keep it a while for logs)")
        if isinstance(spec.get("submitterPodTemplate"), dict):
            _check_pod(d, spec["submitterPodTemplate"].get("spec") or {}, "spec.submitterPodTemplate.spec", ray)
    elif kind == "Service" and isinstance(spec, dict) and spec.get("type") in _EXPOSED:
        d.add("exposure", "spec.type", f"Service type {spec['type']} publishes it outside the cluster; use "
              "ClusterIP and kubectl port-forward")
    elif (found := _pod_spec(doc)) is not None and isinstance(found[1], dict):
        _check_pod(d, found[1], found[0], ray, *_replicas(doc))
    return d.findings


def _replicas(doc: dict[str, Any]) -> tuple[int, str]:
    """How many copies of its pod a workload runs (a DaemonSet: one per node, so more than one)."""
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    if kind in ("Deployment", "StatefulSet", "ReplicaSet"):
        return _as_int(spec.get("replicas", 1)) or 0, "spec.replicas"
    return (2, "kind") if kind == "DaemonSet" else (1, "")


def check_manifests(docs: list[Any]) -> list[Finding]:
    """Every finding for the documents of one manifest file."""
    ray = _installed_ray()
    objs = [doc for doc in docs if isinstance(doc, dict)]
    return [f for doc in objs for f in check_document(doc, ray)] + check_storage(objs)
