"""Every metric key is written once, in `trainables/metrics.py` (issue 49): anywhere else in `sweeps/` or
`trainables/`, a string that is a declared key (any spelling of a templated one), a key family, a key followed
by a formatting slot or an f-string that spells a key fails here with `file:line: "key"`. Docstrings and
messages that mention a key are fine."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from trainables.contract import METRIC_KEY
from trainables.metrics import DECLARED_KEYS, KEY_FAMILIES, METRICS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sweeps", "trainables")
TABLE = Path("trainables", "metrics.py")
_KEYS = "|".join(re.escape(k) for k in sorted(DECLARED_KEYS, key=len, reverse=True))
_KEY_THEN_SLOT = re.compile(rf"(?<![\w/.-])({_KEYS})[ =:]*(?:%|\{{)")  # "loss/val %.3g", "loss/val {:.3g}"
_KEY_AT_END = re.compile(rf"(?<![\w/.-])({_KEYS})[ =:]*$")  # f"loss/val {loss}": a slot follows the part
_SEGMENT = r"[A-Za-z0-9_.\-]+"  # what a slot may stand for inside a key: never a "/" or a space


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, kinds) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _in_fstring(node: ast.JoinedStr) -> list[str]:
    found: list[str] = []
    parts = node.values
    for i, part in enumerate(parts):
        if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
            continue
        if part.value in DECLARED_KEYS or part.value in KEY_FAMILIES:
            found.append(part.value)
        elif i + 1 < len(parts) and (m := _KEY_AT_END.search(part.value)):
            found.append(m.group(1))
    # f"trace/{part}_pct": a key spelled around slots, its group written out
    shape = "".join(p.value if isinstance(p, ast.Constant) else "{}" for p in parts)
    if "{}" in shape and re.match(r"[a-z][a-z0-9_]*/", shape):
        pattern = re.compile("".join(re.escape(p.value) if isinstance(p, ast.Constant) else _SEGMENT for p in parts))
        if any(pattern.fullmatch(k) for k in DECLARED_KEYS):
            found.append(shape)
    return found


def spelled_keys(path: Path, name: str) -> list[str]:
    """`name:line: "key"` for each metric key `path` spells itself."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    hits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            hits += [(node.lineno, k) for k in _in_fstring(node)]
            skip.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
            continue
        if node.value in DECLARED_KEYS or node.value in KEY_FAMILIES:
            hits.append((node.lineno, node.value))
        else:
            hits += [(node.lineno, m.group(1)) for m in _KEY_THEN_SLOT.finditer(node.value)]
    return [f'{name}:{line}: "{key}"' for line, key in sorted(hits)]


def keys_outside_the_table(root: Path) -> list[str]:
    """Every metric key spelled in `root`'s packages outside `trainables/metrics.py`."""
    return [hit for package in PACKAGES for path in sorted((root / package).rglob("*.py"))
            if path.relative_to(root) != TABLE for hit in spelled_keys(path, str(path.relative_to(root)))]


def test_every_metric_key_is_written_only_in_the_table() -> None:
    hits = keys_outside_the_table(ROOT)
    assert not hits, "metric keys written outside trainables/metrics.py (import its names instead):\n" + "\n".join(hits)


def test_each_way_of_spelling_a_key_is_found(tmp_path: Path) -> None:
    source = '''"""A docstring naming loss/val is fine."""
a = "loss/val"
b = f"perf/sol_pct={1:.3g}"
c = "throughput/tokens_per_s"
d = f"trace/{a}_pct"
e = "loss/train %.3g" % 1.0
f = "eval/"
g = "no perf/tflops_per_s in the loop's report"
h = f"{a} is not measured by an evaluation; use loss/val or an eval/<name> metric"
i = f"matmul/{a}_tflops_per_s"
j = f"{a}/{b}"
'''
    (tmp_path / "m.py").write_text(source)
    assert spelled_keys(tmp_path / "m.py", "m.py") == [
        'm.py:2: "loss/val"', 'm.py:3: "perf/sol_pct"', 'm.py:4: "throughput/tokens_per_s"',
        'm.py:5: "trace/{}_pct"', 'm.py:6: "loss/train"', 'm.py:7: "eval/"']


def test_declared_keys_are_metric_keys_and_families_groups() -> None:
    assert [k for k in sorted(DECLARED_KEYS) if not METRIC_KEY.match(k)] == []
    assert {k for m in METRICS for k in m.keys()} <= DECLARED_KEYS
    assert all(re.fullmatch(r"[a-z]+/", f) for f in KEY_FAMILIES)
