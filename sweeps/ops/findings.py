"""What a cluster check found: one finding each, shared by the launcher and KubeRay checks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    check: str
    message: str
    path: str = ""  # the field, e.g. spec.workerGroupSpecs[0].rayStartParams.num-gpus
    doc: str = ""  # the document of a multi-document manifest, e.g. RayJob/gpu-sweep

    def __str__(self) -> str:
        where = " ".join(p for p in (self.doc, self.path) if p)
        return f"[{self.check}] {where + ': ' if where else ''}{self.message}"
