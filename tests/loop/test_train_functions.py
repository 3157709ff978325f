"""Ray Train's train functions' own pieces (`trainables/train_functions.py`), without Ray: a missing file named
with where relative paths resolve, and when .gitignore is the likely cause, every way out first."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from sweeps.service.progress import REASON_WIDTH, at_word
from trainables.train_functions import missing_file

ORIGIN = "the directory the sweep's driver runs in"


def _missing(name: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, "No such file or directory", name)


def test_a_gitignored_data_folder_is_named_with_every_fix_within_a_progress_lines_width(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".gitignore").write_text("# local\ndata/\nmlflow.db\n")
    why = str(missing_file(_missing("data/shapes/classes.txt"), ORIGIN))
    # what a trial's progress line keeps of it, after the rank and the type the failure's reason starts with
    shown = at_word(f"rank 0: WorkloadError: {why}", REASON_WIDTH)
    assert shown.startswith("rank 0: WorkloadError: 'data/shapes/classes.txt' is missing: `ray job submit` skips data "
                            "(in .gitignore)"), shown
    for fix in ("remove it from .gitignore", "RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1 when submitting",
                "use an absolute path on shared storage"):
        assert fix in shown, (fix, shown)
    assert f"relative paths resolve against {tmp_path} ({ORIGIN})" in why


def test_a_missing_file_outside_gitignore_names_where_relative_paths_resolve(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".gitignore").write_text("mlflow.db\n")
    why = str(missing_file(_missing("data/absent.bin"), ORIGIN))
    assert why == (f"No such file or directory: 'data/absent.bin' — relative paths resolve against {tmp_path} "
                   f"({ORIGIN}); give paths from there, or absolute ones on storage every node mounts")


_RESET = """\
import sys, torch
from trainables.train_functions import reset_between_trials
reset_between_trials(torch.device("cpu"))
print("dynamo after a reset with nothing compiled:", "torch._dynamo" in sys.modules)
from torch._dynamo.utils import counters
f = torch.compile(lambda x: x * 2 + 1, backend="eager")
f(torch.ones(3))
reset_between_trials(torch.device("cpu"))
f(torch.ones(3))  # compiled again: the reset dropped the first graph
print("graphs compiled:", counters["stats"]["unique_graphs"])
"""


def test_a_reset_between_trials_imports_no_compiler_where_nothing_compiled_and_clears_what_did() -> None:
    """A warm group's start and each trial reset the process; torch's compiler stack costs ~1.6 s of a core to
    import, so a group whose trials never compile never imports it (each rank of each group paid it before)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _RESET], cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dynamo after a reset with nothing compiled: False" in done.stdout, done.stdout
    assert "graphs compiled: 2" in done.stdout, done.stdout
