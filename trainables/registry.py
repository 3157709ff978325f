"""Workload registry: name -> module, resolved lazily so that validating a spec imports no torch.

A registered workload declares its ``Params`` dataclass and unit in `trainables.workloads.declared`
and its module exposes ``build(params: Params, ctx: BuildContext) -> Workload``. A user-defined
trainable is a ``package.module:function`` path whose function takes ``(params: dict, ctx)`` and
returns a ``Workload``. Its module may declare, as plain literals at module level,

    PARAMS = {"hidden": 64, "dropout": 0.1}   # its own params and their defaults
    UNIT = "tokens"                            # what count_items counts (default "samples")

which the service reads from the source file without running it: spec params (fixed or searched
as ``space.params.<name>``) are then checked against the declared names and types, and the default
objective uses the declared unit.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import os
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainables.loop_errors import WorkloadError
from trainables.workloads.declared import REGISTERED

if TYPE_CHECKING:
    from trainables.workloads.base import BuildContext, Workload

_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def names() -> list[str]:
    return sorted(REGISTERED)


def is_import_path(name: str) -> bool:
    return bool(_IMPORT_PATH.match(name))


def check_name(name: str) -> None:
    if name not in REGISTERED and not is_import_path(name):
        raise WorkloadError(
            f"unknown trainable {name!r}: use a registered name ({', '.join(names())}) "
            "or an import path 'package.module:function'"
        )


@dataclass(frozen=True)
class Declaration:
    """What a trainable says about itself before it runs.

    `params` maps each declared param to its default (None: the trainable declares nothing, so any params are
    accepted)."""

    unit: str | None
    params: dict[str, Any] | None
    hints: dict[str, Any]  # param -> type, where known
    source: str  # where it was read, for messages


def _module_file(module: str) -> Path | None:
    """The source file of `module`, found on sys.path (and the working directory) without importing
    it or its packages: a declaration is read, never executed."""
    rel = Path(*module.split("."))
    for entry in [os.getcwd(), *sys.path]:
        base = Path(entry or os.getcwd())
        for candidate in (base / rel.with_suffix(".py"), base / rel / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _literals(path: Path, wanted: tuple[str, ...]) -> dict[str, Any]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return {}  # importing it on a worker will say what is wrong
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in wanted:
            try:
                found[target.id] = ast.literal_eval(value)
            except ValueError as exc:
                raise WorkloadError(f"{path}: {target.id} must be a plain literal (read without running the "
                                    f"module), e.g. PARAMS = {{'hidden': 64}}: {exc}") from None
    return found


def declaration(name: str) -> Declaration:
    """The unit and params a trainable declares; reads no model code and imports no torch."""
    check_name(name)
    if name in REGISTERED:
        reg = REGISTERED[name]
        fields = dataclasses.fields(reg.params)
        return Declaration(reg.unit, {f.name: f.default for f in fields}, typing.get_type_hints(reg.params), reg.module)
    module = name.split(":")[0]
    path = _module_file(module)
    if path is None:
        return Declaration(None, None, {}, module)
    found = _literals(path, ("PARAMS", "UNIT"))
    params, unit = found.get("PARAMS"), found.get("UNIT")
    if params is not None and not (isinstance(params, dict) and all(isinstance(k, str) for k in params)):
        raise WorkloadError(f"{path}: PARAMS must be a dict of param name -> default value")
    if unit is not None and not isinstance(unit, str):
        raise WorkloadError(f"{path}: UNIT must be a string such as 'samples' or 'tokens'")
    hints = {k: type(v) for k, v in (params or {}).items() if v is not None}
    return Declaration(unit, params, hints, str(path))


def unit(name: str) -> str | None:
    """The throughput unit a trainable declares (None: not declared; the loop's default is samples)."""
    return declaration(name).unit


def check_params(name: str, params: dict[str, Any]) -> list[str]:
    """Problems with a trainable's params (empty list: fine), against what it declares.

    User-defined trainables are not imported here: validating a spec runs no user code."""
    decl = declaration(name)
    if decl.params is None:
        return []
    allowed = ", ".join(sorted(decl.params)) or "none"
    problems = [f"{key}: unknown param for {name}; allowed: {allowed}" for key in params if key not in decl.params]
    problems += [
        f"{key}: expected {getattr(decl.hints[key], '__name__', decl.hints[key])}, got {type(value).__name__} {value!r}"
        for key, value in params.items()
        if key in decl.hints and not _is_type(value, decl.hints[key])
    ]
    if not problems and name in REGISTERED:
        try:
            REGISTERED[name].params(**params)
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
    if name in REGISTERED:
        problems = check_params(name, params)
        if problems:
            raise WorkloadError(f"bad params for workload {name!r}: " + "; ".join(problems))
        reg = REGISTERED[name]
        workload = importlib.import_module(reg.module).build(reg.params(**params), ctx)
    else:
        module_name, func_name = name.split(":")
        try:
            func = getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError) as exc:
            raise WorkloadError(f"cannot import trainable {name!r}: {exc}") from exc
        declared = getattr(sys.modules[module_name], "PARAMS", None)  # defaults for what the spec leaves out
        workload = func({**(declared if isinstance(declared, dict) else {}), **params}, ctx)
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"trainable {name!r} returned {type(workload).__name__}, not a "
            "trainables.Workload(model=..., train_dataset=..., val_dataset=..., loss_fn=... or step_fn=...)"
        )
    workload.check(name)
    declared = REGISTERED[name].unit if name in REGISTERED else getattr(sys.modules[name.split(":")[0]], "UNIT", None)
    if declared is not None and workload.unit != declared:
        raise WorkloadError(f"trainable {name!r} declares UNIT = {declared!r} but its Workload counts {workload.unit!r}: "
                            f"pass unit={declared!r} to Workload (the sweep's objective is throughput/{declared}_per_s)")
    return workload
