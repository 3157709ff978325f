"""Public docstrings open with a one-line summary (issue 49), as Optuna's do.

A multi-line docstring of a public module, class, function or method under `sweeps/` or `trainables/` starts
with one whole sentence on its first line (ending in `.`, or in `:` when a list follows), at most 120
characters with its indentation, then an empty line, then the rest.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("sweeps", "trainables")
MAX_LINE = 120
# a list item: `- x`, `* x`, `1. x`, `1) x`
_LIST_ITEM = re.compile(r"^\s*([-*]|\d+[.)])\s")

Documented = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def _public_docstrings(tree: ast.Module, module: str) -> Iterator[tuple[str, Documented]]:
    """Each public object of a module that has a docstring, with its dotted name: the module, then its classes,
    functions and methods whose every name along the way is public (a function's inner functions are not API)."""
    yield module, tree

    def walk(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, Documented]]:
        for node in body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                yield f"{prefix}.{node.name}", node
                if isinstance(node, ast.ClassDef):
                    yield from walk(node.body, f"{prefix}.{node.name}")

    yield from walk(tree.body, module)


def _problem(node: Documented, lines: list[str]) -> str | None:
    """What is wrong with a multi-line docstring's opening, or None when it opens with a one-line summary."""
    doc = ast.get_docstring(node, clean=False)
    if doc is None or "\n" not in doc.strip():
        return None
    text = doc.split("\n")
    first = text[0].strip()
    if not first:
        return "the summary is not on the opening line"
    if not first.endswith((".", ":")):
        return f"the first line is not a whole sentence: {first!r}"
    source_line = lines[node.body[0].lineno - 1]
    if len(source_line) > MAX_LINE:
        return f"the first line is {len(source_line)} characters long (at most {MAX_LINE})"
    if text[1].strip():
        return f"no empty line after the summary: {text[1].strip()!r}"
    if first.endswith(":"):
        following = next((line for line in text[2:] if line.strip()), "")
        if not _LIST_ITEM.match(following):
            return f"the summary ends in ':' but no list follows: {first!r}"
    return None


def _problems() -> tuple[int, list[str]]:
    """How many multi-line public docstrings were checked, and one line for each without a summary line."""
    checked, problems = 0, []
    for pkg in PACKAGES:
        for f in sorted((REPO / pkg).rglob("*.py")):
            rel = f.relative_to(REPO).as_posix()
            parts = f.relative_to(REPO).with_suffix("").parts
            if any(p.startswith("_") and p != "__init__" for p in parts):
                continue
            module = ".".join(parts).removesuffix(".__init__")
            source = f.read_text()
            lines = source.splitlines()
            for name, node in _public_docstrings(ast.parse(source), module):
                doc = ast.get_docstring(node, clean=False)
                if doc is None or "\n" not in doc.strip():
                    continue
                checked += 1
                problem = _problem(node, lines)
                if problem:
                    line = node.body[0].lineno
                    problems.append(f"{rel}:{line} {name}: {problem}")
    return checked, problems


def test_every_multi_line_public_docstring_opens_with_a_one_line_summary() -> None:
    checked, problems = _problems()
    assert checked > 100, f"only {checked} docstrings checked: is the walk still finding the packages?"
    assert not problems, f"{len(problems)} of {checked} docstrings lack a summary line:\n" + "\n".join(problems)


def test_the_rule_tells_a_summary_from_a_paragraph() -> None:
    def problem(source: str) -> str | None:
        tree = ast.parse(source)
        return _problem(tree, source.splitlines())

    assert problem('"""One sentence.\n\nThe rest, on\nmore lines."""') is None
    assert problem('"""What it holds:\n\n- one thing\n- another"""') is None
    assert problem('"""One line only."""') is None
    assert problem('"""A sentence that runs on\nover two lines."""') is not None
    assert problem('"""One sentence.\nThe rest at once."""') is not None
    assert problem('"""\nThe summary below the quotes.\n\nThe rest."""') is not None
    assert problem('"""What it holds:\n\nnot a list."""') is not None
    assert problem('"""' + "x" * 120 + '.\n\nThe rest."""') is not None
