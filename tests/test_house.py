"""The house's shape, checked (issue 42): `sweeps/` a few packages by concern, imports one way with no
circle, no file over 500 lines, no function over 6 parameters, each loop knob's facts in one place."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("sweeps", "trainables")
# what each sub-package of sweeps/ may import of the others (the root's errors, store and tracking: any)
MAY_IMPORT = {"spec": set(), "search": {"spec"}, "results": {"spec"}, "service": {"spec", "search", "results"},
              "ops": {"spec", "search", "results", "service"}}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (REPO / pkg).rglob("*.py"):
            name = ".".join(f.relative_to(REPO).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = f
    return mods


def _imports(name: str, f: Path, mods: dict[str, Path]) -> set[str]:
    """The project's modules `name` imports at run time (an `if TYPE_CHECKING:` import is for annotations)."""
    tree = ast.parse(f.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for b in node.body for n in ast.walk(b)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or "", *[f"{node.module}.{a.name}" for a in node.names]]
        for n in names:
            while n and n not in mods:
                n = n.rsplit(".", 1)[0] if "." in n else ""
            if n and n != name:
                found.add(n)
    return found


def test_sweeps_is_a_few_packages_by_concern_with_at_most_six_modules_at_its_root() -> None:
    root = sorted(p.name for p in (REPO / "sweeps").glob("*.py"))
    assert len(root) <= 6, root
    assert {p.name for p in (REPO / "sweeps").iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(MAY_IMPORT)


def test_imports_run_one_way_and_no_modules_import_each_other() -> None:
    mods = _modules()
    graph = {m: _imports(m, f, mods) for m, f in mods.items()}
    for m, deps in graph.items():
        if m.startswith("trainables"):
            assert not any(d.startswith("sweeps") for d in deps), (m, deps)  # the loop never imports the service
        parts = m.split(".")
        if parts[0] == "sweeps" and len(parts) > 2 and parts[1] in MAY_IMPORT:
            for d in deps:
                dp = d.split(".")
                if dp[0] == "sweeps" and len(dp) > 1 and dp[1] in MAY_IMPORT and dp[1] != parts[1]:
                    assert dp[1] in MAY_IMPORT[parts[1]], f"{m} imports {d}: {parts[1]}/ may import {MAY_IMPORT[parts[1]]}"
    seen: dict[str, int] = {}

    def cycle_from(m: str, path: list[str]) -> list[str] | None:  # depth-first: a module met again on its own path
        if m in path:
            return path[path.index(m):] + [m]
        if seen.get(m):
            return None
        seen[m] = 1
        for d in sorted(graph[m]):
            found = cycle_from(d, [*path, m])
            if found:
                return found
        return None

    for m in sorted(graph):
        assert cycle_from(m, []) is None, f"an import circle: {' -> '.join(cycle_from(m, []) or [])}"


def test_no_file_over_500_lines_and_no_function_over_6_parameters() -> None:
    too_long, too_many = [], []
    for name, f in _modules().items():
        text = f.read_text()
        if len(text.splitlines()) > 500:
            too_long.append(f"{f.relative_to(REPO)}: {len(text.splitlines())}")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            n = len(a.posonlyargs) + len(a.args) + bool(a.vararg) + bool(a.kwarg)
            n += 0 if node.name == "__init__" else len(a.kwonlyargs)  # a constructor may keep keyword-only options
            n -= bool(a.args) and a.args[0].arg in ("self", "cls")
            if n > 6:
                too_many.append(f"{name}.{node.name}: {n}")
    assert not too_long and not too_many, (too_long, too_many)


def test_a_loop_knob_is_declared_once_and_named_only_where_it_is_used() -> None:
    """Its name, type, default, rule, help and flag in trainables/knobs.py; the spec, the trial's config and
    params, the launcher's flags derive from it. A knob that the service's logic does not reason about is
    named in at most 3 files of sweeps/ and trainables/ (its declaration, the loop, a hint), its default once."""
    from trainables.knobs import KNOBS

    plain = [k for k in KNOBS if k not in ("num_workers", "batch_size", "precision", "lr", "compile", "pin_memory",
                                           "num_dataloader_workers", "grad_accum_steps", "accelerator_type",
                                           # the spec refuses what cannot work with them; the build wraps by them
                                           "strategy", "activation_checkpointing", "cpu_offload",
                                           # offloaded gradients' norm: refused on GPUs (knobs.offload_problem)
                                           "max_grad_norm")]
    files = [f for f in _modules().values()]
    for knob in plain:
        named = sorted(str(f.relative_to(REPO)) for f in files if re.search(rf"\b{knob}\b", f.read_text()))
        assert len(named) <= 3 and "trainables/knobs.py" in named, (knob, named)
    knobs = (REPO / "trainables" / "knobs.py").read_text()
    assert re.search(r"prefetch_factor: int = knob\(2,", knobs)
    defaults = [f for f in files if re.search(r"prefetch_factor\b.{0,40}\b2\b", f.read_text())]
    assert [f.name for f in defaults] == ["knobs.py"], defaults


def test_no_two_modules_share_a_file_name() -> None:
    """A name says which module it is: `state.py` twice (the live search state; `sweep.json` on disk) cost a
    reader a look at the folder every time (issue 49)."""
    seen: dict[str, list[str]] = {}
    for f in _modules().values():
        if f.name != "__init__.py":
            seen.setdefault(f.name, []).append(str(f.relative_to(REPO)))
    assert not {n: fs for n, fs in seen.items() if len(fs) > 1}


# tests/<folder>/ -> the package its tests are about; e2e/ (whole sweeps) and helpers/ (no tests) are apart
MIRRORS = {"spec": "sweeps/spec", "search": "sweeps/search", "service": "sweeps/service", "results": "sweeps/results",
           "ops": "sweeps/ops", "loop": "trainables", "benchmarks": "benchmarks", "": "sweeps"}
# test files about one component that has no module of that name: why each is where it is
APART = {"loop/test_loop_spine.py": "the loop's behaviour across its components, pinned (loop.py)",
         "loop/test_loop_faults.py": "faults provoked below Ray, inside the loop (loop.py)",
         "loop/test_loop_gpu_paths.py": "the loop's GPU code paths, checked on CPU (loop.py)",
         "spec/test_load_fuzz.py": "the loader fuzzed (load.py)",
         "service/test_ray_private.py": "the private Ray names the service reads (connect.py, trial.py)",
         "loop/test_workloads.py": "the workloads/ package's conformance suite",
         "test_house.py": "the house's shape",
         "test_docstrings.py": "the public docstrings' summary lines, across the packages"}


def test_tests_mirror_the_packages() -> None:
    """Each component's tests sit in `tests/<package>/test_<module>.py` (issue 49): a reader who changes
    `sweeps/search/trials.py` finds its tests in `tests/search/test_trials.py`; whole sweeps in `tests/e2e/`,
    the tests' own pieces in `tests/helpers/`."""
    tests = REPO / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(MIRRORS) - {""} | {"e2e", "helpers"}, folders
    misplaced = []
    for f in sorted(tests.rglob("*.py")):
        rel = f.relative_to(tests)
        folder = rel.parts[0] if len(rel.parts) > 1 else ""
        if f.name in ("__init__.py", "conftest.py") or folder in ("e2e", "helpers") or str(rel) in APART:
            if folder == "helpers" and f.name.startswith("test_") and f.name != "test_reap.py":
                misplaced.append(f"{rel}: a test among the helpers")
            continue
        if not f.name.startswith("test_"):
            misplaced.append(f"{rel}: a helper outside tests/helpers/")
            continue
        module = REPO / MIRRORS[folder] / f.name.removeprefix("test_")
        if not module.exists():
            misplaced.append(f"{rel}: no {module.relative_to(REPO)}")
    assert not misplaced, misplaced
