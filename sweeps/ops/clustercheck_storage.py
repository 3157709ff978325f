"""`sweeps cluster-check` for where a RayJob's sweep keeps its storage: every Ray pod must reach it.

Each rank writes its trace and a warm trial's checkpoint to `storage_path` on its own pod, and the driver on
the head reads them back. So a RayJob whose spec (a ConfigMap in the same file, mounted on the head and named
in the entrypoint) sets a local `storage_path` while worker groups exist needs that path on a volume that
every worker group mounts at the same path (the same claim: ReadWriteMany); otherwise what the workers
write is lost without a word. A `storage_path` on an object store (`s3://`, `gs://`) needs its credentials on
every Ray pod instead: variables from a Secret, `envFrom` a Secret, or a service account (a cloud IAM role).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Any

import yaml

from sweeps.ops.clustercheck_mlflow import container_env
from sweeps.ops.findings import Finding

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_CREDENTIALS = {  # the variables an object store's client reads, by URI scheme
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS",),
    "gcs": ("GOOGLE_APPLICATION_CREDENTIALS",),
}
_FIX = ("mount the same ReadWriteMany claim (EFS, Filestore, NFS) at the same path in every worker group, as "
        "cluster/kubernetes/ does, or put storage_path on an object store with its credentials on every pod "
        "(cluster/team/)")


class _Doc:
    """Collects the storage findings of one RayJob, each at a field path."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.name = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name', '?')}"
        self.findings: list[Finding] = []

    def add(self, check: str, path: str, message: str) -> None:
        self.findings.append(Finding(check, message, path=path, doc=self.name))


def _groups(cluster: dict[str, Any], at: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, group spec) for the head group and each worker group of a RayClusterSpec."""
    head = [(f"{at}.headGroupSpec", cluster["headGroupSpec"])] if isinstance(cluster.get("headGroupSpec"), dict) else []
    return head + [(f"{at}.workerGroupSpecs[{i}]", g) for i, g in enumerate(cluster.get("workerGroupSpecs") or [])
                   if isinstance(g, dict)]


def _pod(group: dict[str, Any]) -> dict[str, Any]:
    spec = (group.get("template") or {}).get("spec")
    return spec if isinstance(spec, dict) else {}


def _first(pod: dict[str, Any]) -> dict[str, Any]:
    containers = pod.get("containers") or [{}]
    return containers[0] if isinstance(containers[0], dict) else {}


def _mount(pod: dict[str, Any], path: str) -> tuple[str, dict[str, Any]] | None:
    """(mountPath, volume source) of the first container's deepest mount that holds `path`."""
    volumes = {v.get("name"): v for v in pod.get("volumes") or [] if isinstance(v, dict)}
    best: tuple[str, dict[str, Any]] | None = None
    for m in _first(pod).get("volumeMounts") or []:
        mount = str(m.get("mountPath", "")).rstrip("/") if isinstance(m, dict) else ""
        if mount and (path == mount or path.startswith(mount + "/")) and (best is None or len(mount) > len(best[0])):
            best = mount, {k: v for k, v in volumes.get(m.get("name"), {}).items() if k != "name"}
    return best


def _spec_storage(job: dict[str, Any], configmaps: dict[str, dict[str, Any]]) -> tuple[str, str] | None:
    """(storage_path, where it is written) of the spec a RayJob's entrypoint runs, when the file holds it."""
    head = _pod((job.get("rayClusterSpec") or {}).get("headGroupSpec") or {})
    volumes = {v.get("name"): v for v in head.get("volumes") or [] if isinstance(v, dict)}
    try:
        words = shlex.split(str(job.get("entrypoint", "")))
    except ValueError:
        words = str(job.get("entrypoint", "")).split()
    for m in _first(head).get("volumeMounts") or []:
        name = str(((volumes.get(m.get("name")) or {}).get("configMap") or {}).get("name"))
        data = (configmaps.get(name) or {}).get("data") or {}
        for key, text in data.items():
            if posixpath.join(str(m.get("mountPath", "")), key) in words:
                spec = yaml.safe_load(str(text))
                if isinstance(spec, dict) and isinstance(spec.get("storage_path"), str):
                    return spec["storage_path"], f"ConfigMap {name}'s {key}"
    return None


def _check_job(d: _Doc, job: dict[str, Any], configmaps: dict[str, dict[str, Any]]) -> None:
    found = _spec_storage(job, configmaps)
    cluster = job.get("rayClusterSpec") or {}
    if found is None or not cluster.get("workerGroupSpecs"):
        return
    storage, where = found
    at = "spec.rayClusterSpec"
    if (uri := _URI.match(storage)) is not None:
        _check_credentials(d, storage, uri.group(1).lower(), where, cluster, at)
        return
    head = _mount(_pod(cluster.get("headGroupSpec") or {}), posixpath.normpath(storage))
    for path, group in _groups(cluster, at):
        if not path.startswith(f"{at}.workerGroupSpecs"):
            continue
        mounts = f"{path}.template.spec.containers[0].volumeMounts"
        if not posixpath.isabs(storage):
            d.add("storage", mounts, f"storage_path {storage!r} ({where}) is relative: it resolves in the driver's "
                  "working folder on the head pod, which this group's ranks cannot see; " + _FIX)
        elif head is None or "emptyDir" in head[1] or "hostPath" in head[1]:
            d.add("storage", mounts, f"storage_path {storage} ({where}) is on the head pod's own disk: ranks on this "
                  "group's pods write their traces and warm checkpoints to theirs, and the sweep never sees them; "
                  + _FIX)
        elif _mount(_pod(group), posixpath.normpath(storage)) != head:
            d.add("storage", mounts, f"storage_path {storage} ({where}) is on the volume the head mounts at {head[0]}, "
                  "which this group does not mount there: its ranks write their traces and warm checkpoints to "
                  "their own disk, and the sweep never sees them; " + _FIX)


def _check_credentials(d: _Doc, storage: str, scheme: str, where: str, cluster: dict[str, Any], at: str) -> None:
    names = _CREDENTIALS.get(scheme)
    if names is None:
        return
    for path, group in _groups(cluster, at):
        pod = _pod(group)
        env, from_secret = container_env(_first(pod), f"{path}.template.spec.containers[0]")
        if from_secret or pod.get("serviceAccountName") or any(n in env for n in names):
            continue
        d.add("storage", f"{path}.template.spec.containers[0].env", f"storage_path {storage} ({where}) is on an object "
              f"store, and this group's pods have no credentials for it ({' or '.join(names)}, envFrom a Secret, or "
              "a serviceAccountName with a cloud IAM role): every rank writes its trace and checkpoint there; set "
              f"{names[0]} and its secret from a Secret on the head and every worker group, as cluster/team/ does")


def check_storage(docs: list[dict[str, Any]]) -> list[Finding]:
    """The storage findings of one manifest file's documents (RayJobs whose spec is a ConfigMap beside them)."""
    configmaps = {str((doc.get("metadata") or {}).get("name")): doc for doc in docs if doc.get("kind") == "ConfigMap"}
    findings: list[Finding] = []
    for doc in docs:
        if doc.get("kind") == "RayJob" and isinstance(doc.get("spec"), dict):
            d = _Doc(doc)
            _check_job(d, doc["spec"], configmaps)
            findings += d.findings
    return findings
