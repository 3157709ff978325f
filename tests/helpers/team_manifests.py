"""The shipped cluster files the cluster-check tests read, and their paths (cluster/team/, cluster/kubernetes/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sweeps.ops.clustercheck_k8s import check_manifests

REPO = Path(__file__).resolve().parents[2]
TEAM = REPO / "cluster" / "team"
K8S = REPO / "cluster" / "kubernetes"
SHIPPED = sorted([*TEAM.glob("*.yaml"), *(TEAM / "kubernetes").glob("*.yaml")])
HEAD = "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0]"
WORKER = "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0]"
SERVER = "spec.template.spec.containers[0]"


def load_docs(path: Path) -> list[dict[str, Any]]:
    """Every YAML document of a manifest file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def one_doc(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one document of `kind`."""
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def found_checks(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """What `check_manifests` flags: (check, field path) pairs."""
    return {(f.check, f.path) for f in check_manifests(docs)}
