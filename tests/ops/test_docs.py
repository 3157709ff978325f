"""The front door (issue 43): the README stays short and its quick commands run as written; the reference
pages are generated from the code and never stale; every spec key, CLI argument and metric is described."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps.ops import docs
from sweeps.spec import SweepSpec
from trainables import contract
from trainables.metrics import METRICS

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_readme_is_a_front_door() -> None:
    assert len(README.splitlines()) <= 250
    for link in re.findall(r"\]\(((?:docs|examples)/[^)#]+)", README):  # every file it links to exists
        assert (ROOT / link).exists(), link


def test_reference_pages_are_generated_and_fresh() -> None:
    for name, make in docs.PAGES.items():
        assert (docs.REFERENCE / name).read_text() == make(), f"docs/reference/{name} is stale: python -m sweeps.ops.docs"
    assert docs.main(["--check"]) == 0


def test_a_stale_page_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    for name in docs.PAGES:
        shutil.copy(docs.REFERENCE / name, tmp_path / name)
    (tmp_path / "metrics.md").write_text("hand-written\n")
    monkeypatch.setattr(docs, "REFERENCE", tmp_path)
    assert docs.main(["--check"]) == 1
    said = capsys.readouterr().err  # read once: a second read is empty, and its assertion could not fail
    assert "metrics.md" in said and "spec.md" not in said


def test_every_spec_field_is_described() -> None:
    rows = docs.spec_rows(SweepSpec)
    undocumented = [path for path, _, _, _, description in rows if not description.strip()]
    assert not undocumented, f"spec fields without a description (Field(description=...)): {undocumented}"
    assert len(rows) > 50 and any(p == "budget.num_trials" for p, *_ in rows)
    page = docs.spec_page()
    assert all(f"`space.{knob}`" in page for knob in contract.KNOBS)


def test_an_undescribed_field_fails() -> None:
    from pydantic import BaseModel, Field

    class Section(BaseModel):
        described: int = Field(1, description="what it does")
        bare: int = 2

    assert [p for p, *_, d in docs.spec_rows(Section) if not d] == ["bare"]


def test_every_cli_argument_is_described() -> None:
    from sweeps.cli import build_parser

    page = docs.cli_page()
    assert not re.search(r"\|\s+\|$", page, re.M), "a CLI argument without help="
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert all(f"## sweeps {name}" in page for name in sub.choices)


def test_metrics_table_is_the_contract() -> None:
    keys = [k for m in METRICS for k in m.keys()]
    assert len(keys) == len(set(keys))
    assert all(contract.METRIC_KEY.match(k) for k in keys)
    assert all(m.measured and m.unit for m in METRICS)
    # every metric constant the contract names is in the table, and the vocabulary is read from it
    named = {v for k, v in vars(contract).items() if k.isupper() and isinstance(v, str) and contract.METRIC_KEY.match(v)}
    assert named - set(keys) <= {"pool/trial_in_group", "progress/restored_from_step", "progress/final"}
    assert set(contract.KNOWN_METRICS) == {k for m in METRICS if m.nameable for k in m.keys()}
    assert contract.is_final_only("loss/val") and not contract.is_final_only("loss/train")
    from trainables.telemetry import _COMBINE

    assert _COMBINE["energy/total_j"] == "sum" and _COMBINE["gpu/mem_peak_gib"] == "max"


def test_failure_kinds_and_exit_codes_are_documented() -> None:
    from sweeps.exits import EXIT_CODES, ExitCode
    from sweeps.service.failures import KIND_MEANING

    page = docs.exit_codes_page()
    assert set(EXIT_CODES) == set(ExitCode)
    assert all(f"| `{kind}` |" in page for kind in KIND_MEANING)
    # the README's own table: every code the CLI returns, and no other
    section = (ROOT / "README.md").read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {int(line.split("|")[1]) for line in section.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()}
    assert rows == {int(code) for code in ExitCode}, rows


def _sweeps(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sweeps", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_readme_quick_commands_run(tmp_path: Path) -> None:
    """The README's commands that take seconds, as written there."""
    assert "sweeps validate my.yaml" in README and "examples/custom.yaml" in README
    assert _sweeps("--help").returncode == 0
    for spec in sorted((ROOT / "examples").glob("*.yaml")):
        done = _sweeps("validate", str(spec.relative_to(ROOT)))
        assert done.returncode == 0, f"{spec.name}: {done.stderr}"
    # the minimal spec, copied from the README's block
    block = re.search(r"## A minimal spec\n\n```yaml\n(.*?)```", README, re.S)
    assert block is not None
    minimal = tmp_path / "my.yaml"
    minimal.write_text(block.group(1))
    done = _sweeps("validate", str(minimal))
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr


def test_a_mapping_of_sections_is_listed_under_its_key() -> None:
    paths = [r[0] for r in docs.spec_rows(SweepSpec)]
    assert "cost.prices.<type>.usd_per_hour" in paths and "cost.prices.usd_per_hour" not in paths


def test_the_readme_opens_on_a_gpu_figure_with_its_machine_and_date() -> None:


    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    first = re.search(r"!\[([^\]]*)\]\(([^)]+)\)", readme)
    assert first is not None and (Path(__file__).resolve().parents[2] / first.group(2)).is_file()
    said = first.group(1) + readme[first.end():first.end() + 400]
    assert re.search(r"NVIDIA H(100|200)", said) and re.search(r"20\d\d-\d\d-\d\d", said), said
