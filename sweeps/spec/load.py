"""Load a spec: strict YAML (no code run, no aliases, bounded depth) -> `SweepSpec`.

Every problem is reported at once with its YAML line, field path, the bad value and what is allowed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sweeps.spec.cost import SAVED_PRICES
from sweeps.spec.problems import RuleProblems, SpecError, SpecProblem
from sweeps.spec.sections import RENAMED
from sweeps.spec.space import OPTIM_KNOBS, PARAMS_PREFIX
from sweeps.spec.sweep import SweepSpec
from sweeps.store import shown_uri
from trainables.knobs import KNOBS
from trainables.loop_errors import WorkloadError

_MAX_DEPTH = 32  # a real spec is 4 levels deep; deeper input is hostile (recursion bombs)


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors/aliases (no alias bombs) and keeps node lines."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        event = self.peek_event()
        if self.check_event(yaml.AliasEvent):
            raise yaml.MarkedYAMLError("while composing the spec", None, "aliases (*name) are not allowed", event.start_mark)
        if self._depth >= _MAX_DEPTH:
            raise yaml.MarkedYAMLError("while composing the spec", None, f"nested deeper than {_MAX_DEPTH} levels", event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _lines(node: yaml.Node, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    lines = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            lines.update(_lines(v, path + (str(k.value),)))
            lines[path + (str(k.value),)] = k.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            lines.update(_lines(v, path + (str(i),)))
    return lines


_TAGS = {"float", "int", "categorical", "fixed", "function-after", "function-before"}


def _allowed_keys(section: tuple[str, ...]) -> list[str]:
    model: Any = SweepSpec
    for part in section:
        field = getattr(model, "model_fields", {}).get(part)
        model = field.annotation if field is not None else None
    return sorted(getattr(model, "model_fields", {}))


_FIELD_FIRST = re.compile(r"^([a-z_]+(?:\.[a-z_0-9]+)*): (.*)$", re.S)


def _problem(err: dict[str, Any], lines: dict[tuple[str, ...], int]) -> SpecProblem:
    loc = tuple(str(p) for p in err["loc"] if str(p) not in _TAGS)
    msg = err["msg"].removeprefix("Value error, ")
    named = _FIELD_FIRST.match(msg) if not loc else None
    if named:  # a whole-spec rule names its field first: point there
        loc, msg = tuple(named.group(1).split(".")), named.group(2)
    line = next((lines[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in lines), None)
    if err["type"] == "extra_forbidden" and loc[:-1] == ("space",):
        loop = sorted(k for k in KNOBS if k not in OPTIM_KNOBS)
        msg = (f"unknown key; allowed: {', '.join(loop)}; optimisation: {', '.join(OPTIM_KNOBS)}; the trainable's "
               f"own: {PARAMS_PREFIX}<name>")
    elif err["type"] == "extra_forbidden" and ".".join(loc) in RENAMED:
        new = RENAMED[".".join(loc)]
        msg = f"renamed to {new} (the same setting); write {new.rsplit('.', 1)[1]} instead"
    elif err["type"] == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        msg = "unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
    value = err.get("input")
    if isinstance(value, dict) and err["type"] != "missing":
        value = None  # a whole section is noise; the message says what is wrong
    if err["type"] == "missing":
        value = None
    if isinstance(value, str) and "://" in value:
        value = shown_uri(value)  # a password in a URI (tracking.uri: postgresql://user:secret@...) is not echoed
    return SpecProblem(".".join(loc), msg, value, line)


def parse_spec(text: str, source: str = "<spec>", prices: dict[str, Any] | None = None) -> SweepSpec:
    """Validate YAML text into a `SweepSpec` or raise `SpecError` listing every problem.

    `prices`: those a sweep of this spec read from its `cost.price_file` when it started (`CostSpec.saved`),
    used instead of reading the file again."""
    try:
        loader = _NoAliasLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        reason = getattr(exc, "problem", None) or str(exc)
        raise SpecError(source, [SpecProblem("", f"not valid YAML: {reason}", line=line)]) from None
    if not isinstance(data, dict):
        raise SpecError(source, [SpecProblem("", "the spec must be a YAML mapping (key: value)", type(data).__name__)])
    cost = data.get("cost")
    if prices and isinstance(cost, dict) and cost.get("price_file") is not None:
        data["cost"] = {**cost, SAVED_PRICES: prices}
    try:
        return SweepSpec.model_validate(data)
    except RuleProblems as exc:  # the rules across sections: each names its field first
        lines = _lines(node) if node is not None else {}
        found = [_problem({"loc": (), "msg": m, "type": "value_error", "input": None}, lines) for m in exc.problems]
        raise SpecError(source, sorted(found, key=lambda p: p.line or 0)) from None
    except ValidationError as exc:
        lines = _lines(node) if node is not None else {}
        problems = [_problem(dict(e), lines) for e in exc.errors()]
        raise SpecError(source, sorted(problems, key=lambda p: p.line or 0)) from None
    except WorkloadError as exc:  # raised outside a field validator
        raise SpecError(source, [SpecProblem("trainable", str(exc))]) from None


def load_spec(path: str | Path) -> tuple[SweepSpec, str]:
    """Read and validate a spec file; returns the spec and its text (kept as an artifact)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise SpecError(str(path), [SpecProblem("", f"cannot read the spec: {exc.strerror}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        kind = "UTF-16 text" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else "not text"
        raise SpecError(str(path), [SpecProblem("", f"the spec must be UTF-8 text; this file is {kind} (byte "
                                                f"{exc.start} cannot be read): save it as UTF-8")]) from None
    if "\x00" in text:
        raise SpecError(str(path), [SpecProblem("", "the spec must be UTF-8 text; this file holds NUL bytes "
                                                "(binary, or UTF-16/32): save it as UTF-8")])
    return parse_spec(text, str(path)), text
