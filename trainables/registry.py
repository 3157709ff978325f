"""Workload registry: name -> module, resolved lazily so that listing names imports no torch.

A workload module exposes ``Params`` (a dataclass of its fixed knobs) and
``build(params: Params, ctx: BuildContext) -> Workload``. A user-defined trainable is a
``package.module:function`` path whose function takes ``(params: dict, ctx)`` and returns
a ``Workload``.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import types
import typing
from typing import TYPE_CHECKING, Any

from trainables.errors import WorkloadError

if TYPE_CHECKING:
    from trainables.workloads.base import BuildContext, Workload

_REGISTRY: dict[str, str] = {
    "image-cnn": "trainables.workloads.image_cnn",
    "mlp-tabular": "trainables.workloads.mlp_tabular",
    "gpt-lm": "trainables.workloads.gpt_lm",
}
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def names() -> list[str]:
    return sorted(_REGISTRY)


def is_import_path(name: str) -> bool:
    return bool(_IMPORT_PATH.match(name))


def check_name(name: str) -> None:
    if name not in _REGISTRY and not is_import_path(name):
        raise WorkloadError(
            f"unknown trainable {name!r}: use a registered name ({', '.join(names())}) "
            "or an import path 'package.module:function'"
        )


def unit(name: str) -> str | None:
    """The throughput unit of a registered workload (None for user-defined ones)."""
    return importlib.import_module(_REGISTRY[name]).UNIT if name in _REGISTRY else None  # type: ignore[no-any-return]


def check_params(name: str, params: dict[str, Any]) -> list[str]:
    """Problems with a registered workload's fixed params (empty list: fine).

    User-defined trainables are not imported here: validating a spec runs no user code.
    """
    check_name(name)
    if name not in _REGISTRY:
        return []
    params_cls = importlib.import_module(_REGISTRY[name]).Params
    fields = {f.name: f for f in dataclasses.fields(params_cls)}
    problems = [
        f"{key}: unknown param for {name}; allowed: {', '.join(sorted(fields))}"
        for key in params
        if key not in fields
    ]
    hints = typing.get_type_hints(params_cls)
    problems += [
        f"{key}: expected {getattr(hints[key], '__name__', hints[key])}, got {type(value).__name__} {value!r}"
        for key, value in params.items()
        if key in fields and not _is_type(value, hints[key])
    ]
    if not problems:
        try:
            params_cls(**params)
        except (TypeError, ValueError) as exc:
            problems.append(str(exc))
    return problems


def _is_type(value: Any, kind: Any) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return any(_is_type(value, k) for k in typing.get_args(kind))
    if kind is type(None):
        return value is None
    return not isinstance(kind, type) or isinstance(value, kind)


def build(name: str, params: dict[str, Any], ctx: BuildContext) -> Workload:
    """Build a workload by registered name or import path, checking what comes back."""
    from trainables.workloads.base import Workload

    check_name(name)
    if name in _REGISTRY:
        problems = check_params(name, params)
        if problems:
            raise WorkloadError(f"bad params for workload {name!r}: " + "; ".join(problems))
        module = importlib.import_module(_REGISTRY[name])
        workload = module.build(module.Params(**params), ctx)
    else:
        module_name, func_name = name.split(":")
        try:
            func = getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError) as exc:
            raise WorkloadError(f"cannot import trainable {name!r}: {exc}") from exc
        workload = func(dict(params), ctx)
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"trainable {name!r} returned {type(workload).__name__}, not a "
            "trainables.Workload(model=..., train_dataset=..., val_dataset=..., loss_fn=...)"
        )
    workload.check(name)
    return workload
