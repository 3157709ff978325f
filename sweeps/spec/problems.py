"""A spec's problems: each with its field path, YAML line, the bad value and what is allowed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sweeps.exits import InputError


@dataclass(frozen=True)
class SpecProblem:
    path: str
    message: str
    value: Any = None
    line: int | None = None

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        shown = "" if self.value is None else f" (got {self.value!r})"
        return f"{where}{self.path or '<root>'}: {self.message}{shown}"


class SpecError(InputError):
    """A spec that cannot run; `problems` lists every issue found."""

    def __init__(self, source: str, problems: list[SpecProblem]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s)\n" + "\n".join(f"  {p}" for p in problems))


class RuleProblems(Exception):
    """What the rules across sections found (`sweeps.spec.cross_checks`), each "field.path: message".

    Raised past pydantic (which wraps only ValueError) so that `parse_spec` reports each with its own line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems
