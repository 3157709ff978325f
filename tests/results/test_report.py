"""Reports of a real sweep: figures on the parent run (read back: size, not blank), the HTML
summary, `sweeps report` text and JSON, and the MLflow UI checked in headless Chromium; and, without
Ray, the Pareto front, the best configuration's `space:` fragment, the verdicts revised against the
whole sweep (as the sweep left them and as `sweeps report` reads them back) and "within noise"."""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import yaml
from mlflow.tracking import MlflowClient
from PIL import Image

from sweeps.cli import main
from sweeps.results.outcome import SweepOutcome, TrialRow, pareto_rows
from sweeps.results.plots import MAX_LABELS, TOP_N, figures, publish
from sweeps.results.quality import log_updates
from sweeps.results.report import (
    answer,
    baseline,
    best_fragment,
    knob_split,
    load_outcome,
    next_steps,
    rows_from_runs,
    speedups,
    sweep_note,
    trials_table,
)
from sweeps.results.summary_page import summary_html
from sweeps.results.verdict import revise_verdicts
from sweeps.search.trials import resolve_trial, trial_params
from sweeps.spec import parse_spec
from sweeps.tracking import SweepTracker, ui_hint, ui_links
from tests.results.test_verdict import gpu_row, h100_rows
from trainables.knobs import KNOBS

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REPO = Path(__file__).resolve().parents[2]
DEMO = (REPO / "examples" / "demo.yaml").read_text()
TPUT = "throughput/samples_per_s"
ML = "workflowType=machine_learning"  # MLflow 3.17's UI: the Model training view, not the GenAI one


def _trials(n: int, seed: int = 0) -> list[TrialRow]:
    """n synthetic trials of the demo's space (2 trials: the grid's corners; more: random batch sizes)."""
    rng = random.Random(seed)
    rows = []
    for i in range(1, n + 1):
        precision = "32" if i % 2 else "bf16-mixed"
        batch = (32 if i == 1 else 128) if n <= 2 else rng.randint(16, 1024)
        loaders = (i // 2) % 2
        speed = (1.6 if precision == "bf16-mixed" else 1.0) * (batch ** 0.3) * (1 + loaders * 0.2) * 60
        metrics = {TPUT: speed, "loss/val": 2.0 / speed ** 0.2 + rng.random() * 0.01, "time/step_ms": 1000 * batch / speed,
                   "time/data_wait_pct": 30.0 / (1 + loaders) + rng.random(), "cpu/worker_util_mean_pct": 60.0}
        status = "oom" if n > 2 and i % 37 == 0 else "ok"
        params = {"batch_size": batch, "precision": precision, "num_dataloader_workers": loaders, "lr": 0.001,
                  "pin_memory": False, "use_gpu": False}
        rows.append(TrialRow(f"t{i:04d}", i, params, f"run{i:04d}", status, "CUDA out of memory" if status == "oom" else "",
                             "underutilised: rank busy only 60% of 1 core(s)" if status == "ok" else "",
                             metrics if status == "ok" else {}))
    return rows


def _outcome(n: int, uri: str = "sqlite:///mlflow.db") -> SweepOutcome:
    return SweepOutcome(parse_spec(DEMO), "parent0", uri, _trials(n), 12.0)


class _Client:
    """What publish() reads from MLflow, without a store."""

    def get_metric_history(self, run_id: str, key: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(step=s, value=50.0 + s % 7) for s in range(0, 60, 10)]

    def get_run(self, run_id: str) -> SimpleNamespace:
        return SimpleNamespace(info=SimpleNamespace(experiment_id="7"))


class _Table(HTMLParser):
    """The trials table of summary.html: header texts and each row's cells."""

    def __init__(self) -> None:
        super().__init__()
        self.head: list[str] = []
        self.rows: list[list[str]] = []
        self.links: list[str] = []
        self._in: str | None = None
        self._table = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table" and a.get("id") == "trials":
            self._table = True
        elif self._table and tag == "tr":
            self.rows.append([])
        elif self._table and tag in ("th", "td"):
            self._in = tag
            (self.head if tag == "th" else self.rows[-1]).append("")
        elif self._table and tag == "a":
            self.links.append(a.get("href") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = False
        elif tag in ("th", "td"):
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "th":
            self.head[-1] += data
        elif self._in == "td":
            self.rows[-1][-1] += data


@pytest.mark.parametrize("n", [2, 200])
def test_every_figure_and_the_page_render_with_few_and_many_trials(n: int, tmp_path: Path) -> None:
    outcome = _outcome(n)
    figs, skipped = figures(outcome, lambda run, key: [(m.step, m.value) for m in _Client().get_metric_history(run, key)])
    assert {"throughput_vs_batch_size.png", "throughput_heatmap.png", "step_time_breakdown.png", "loss_vs_throughput.png",
            "throughput_vs_loader_workers.png", "best_trial_utilisation.png"} <= set(figs)
    assert any(s.startswith("memory_heatmap.png: gpu/mem_peak_gib was not measured") for s in skipped)
    batch_axis = figs["throughput_vs_batch_size.png"].axes[0]
    ran = sorted({t.params["batch_size"] for t in outcome.trials if t.status == "ok"})
    ticks = [float(x) for x in batch_axis.get_xticks()]
    assert batch_axis.get_xscale() == "log" and 2 <= len(ticks) <= 12
    assert ticks == ran if n == 2 else all(math.log2(x).is_integer() and ran[0] <= x <= ran[-1] for x in ticks)
    bars = figs["step_time_breakdown.png"].axes[0]
    assert len(bars.get_xticks()) <= MAX_LABELS and len(bars.patches) <= 3 * TOP_N
    assert ("best 40 of" in bars.get_title()) == (n > TOP_N)
    assert "host-to-device copy: none on CPU" in bars.get_title()  # not measured: said, not drawn as 0
    labels = [t.get_text() for t in figs["loss_vs_throughput.png"].axes[0].texts]
    assert labels and all(lbl.startswith("#") for lbl in labels) and len(labels) <= 2 * MAX_LABELS
    heat = figs["throughput_heatmap.png"].axes[0]
    assert [t.get_text() for t in heat.get_yticklabels()] == ["32", "bf16-mixed"] and len(heat.get_xticks()) <= 12
    import matplotlib.pyplot as plt

    plt.close("all")
    out = publish(outcome, _Client(), tmp_path, log=False)
    for png in sorted(out.glob("*.png")):
        img = np.asarray(Image.open(png).convert("L"), dtype=np.float32)
        assert 200 <= img.shape[0] <= 2000 and 300 <= img.shape[1] <= 2000, (png.name, img.shape)
        assert img.std() > 5 and (img < 128).mean() > 0.005, f"{png.name} looks blank"
    page = (out / "summary.html").read_text()
    table = _Table()
    table.feed(page)
    assert "<pre" not in page and page.count("data:image/png;base64,") == len(list(out.glob("*.png")))
    assert table.head[-1] == "cpu/worker_util_mean_pct" or table.head[-1] in trials_table(outcome)
    assert len(table.rows) == n + 1 and all(len(r) == len(table.head) for r in table.rows[1:])  # +1: the header row
    assert "lr" not in table.head and "Same in every trial: lr 0.001, pin_memory False." in page  # said once, not a column
    assert table.links[0] == f"http://127.0.0.1:5000/#/experiments/7/runs/{outcome.best.run_id}?{ML}"
    assert "mlflow ui --port 5000" in page and 'onclick="copyFragment()"' in page
    assert best_fragment(outcome).splitlines()[1].strip() in page


def test_the_answer_names_the_best_and_its_speed_ups() -> None:
    outcome = _outcome(8)
    best, base = outcome.best, baseline(outcome)
    other = _outcome(9)
    assert baseline(other) is not min(other.ranked(), key=lambda t: t.metrics[TPUT])  # both wordings get checked
    assert "** the slowest (trial" in answer(other) and "** the fp32 / batch-" in answer(other)
    assert best is not None and base is not None
    assert base.params["precision"] == "32" and base.params["batch_size"] == min(
        t.params["batch_size"] for t in outcome.ranked() if t.params["precision"] == "32")
    ups = {what.split()[1]: (t, x) for what, t, x in speedups(outcome)}
    slowest = min(outcome.ranked(), key=lambda t: t.metrics[TPUT])
    assert ups["slowest"] == (slowest, pytest.approx(best.metrics[TPUT] / slowest.metrics[TPUT]))
    assert ups["fp32"][1] == pytest.approx(best.metrics[TPUT] / base.metrics[TPUT])
    text = answer(outcome)
    assert text.startswith(f"**Best: trial {best.number}** (batch_size {best.params['batch_size']}, precision "
                           f"{best.params['precision']}, num_dataloader_workers {best.params['num_dataloader_workers']})")
    x = best.metrics[TPUT] / slowest.metrics[TPUT]
    if slowest is base:  # said once
        assert f"**{x:.2f}×** the slowest, which is the fp32 / batch-{base.params['batch_size']} baseline (trial {base.number}" in text
    else:
        assert f"**{x:.2f}×** the slowest (trial {slowest.number}" in text and "the fp32 / batch-" in text
    assert "Verdict: *underutilised" in text
    none = SweepOutcome(parse_spec(DEMO), "p", "sqlite://", [], 1.0)
    assert answer(none).startswith("**No answer**")


def test_quality_figures_and_degraded_trials_are_shown_where_present() -> None:
    outcome = _outcome(2)
    plain = trials_table(outcome)
    assert "grad_noise_scale" not in plain and "degraded" not in plain
    outcome.trials[0].metrics.update({"stats/grad_noise_scale": 812.0, "time/to_target_s": 41.5})
    outcome.trials[0].params["lr_effective"] = 0.004
    outcome.trials[0].degraded = "loss/val 12% above the fp32 reference at equal data"
    text = trials_table(outcome)
    head = text.splitlines()[0].split()
    assert {"stats/grad_noise_scale", "time/to_target_s", "lr_effective"} <= set(head)
    assert "predict/time_to_target_s" not in head  # nobody has it: no empty column
    assert "ok (degraded)" in text
    assert "trial 1 degraded: loss/val 12% above the fp32 reference at equal data" in text.split("Bottleneck verdicts:")[1]
    child = SimpleNamespace(info=SimpleNamespace(run_id="r1", run_name="trial-001-t1"), data=SimpleNamespace(
        params={}, metrics={}, tags={"sweep.status": "ok", "sweep.degraded": "loss/val 9% worse"}))
    assert rows_from_runs([child])[0].degraded == "loss/val 9% worse"  # `sweeps report` shows it too


def test_ui_links_for_a_server_and_for_local_stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = ui_links("http://mlflow.internal:5000/", "3", "p1", ["a", "b"])
    assert lines[1] == f"Open the answer:   http://mlflow.internal:5000/#/experiments/3/runs/p1?{ML}"
    assert lines[2] == f"The full report:    http://mlflow.internal:5000/#/experiments/3/runs/p1/artifacts/report/summary.html?{ML}"
    assert lines[3] == ("Compare the trials: http://mlflow.internal:5000/#/compare-runs?runs=%5B%22a%22%2C%22b%22%5D"
                        f"&experiments=%5B%223%22%5D&{ML}")
    assert lines[4] == f"Every sweep here:   http://mlflow.internal:5000/#/experiments/3/runs?{ML}"
    assert not any("mlflow ui" in line for line in lines)
    assert ui_hint("http://mlflow.internal:5000/") == f"open http://mlflow.internal:5000/#/experiments?{ML}"
    (tmp_path / "sub").mkdir()
    monkeypatch.setenv("PATH", "/nonexistent")  # mlflow not on PATH: this interpreter's, by its path
    assert ui_hint("sqlite:///m.db", cwd=str(tmp_path)).startswith(f"{Path(sys.executable).parent / 'mlflow'} ui ")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    local = ui_links("sqlite:///sub/m.db", "1", "p1", ["a", "b"], cwd=str(tmp_path))
    assert local[1] == "Serve the UI:  mlflow ui --backend-store-uri sqlite:///sub/m.db --host 127.0.0.1 --port 5000"
    assert local[2] == f"then open the answer:   http://127.0.0.1:5000/#/experiments/1/runs/p1?{ML}"
    urls = [word for line in local for word in line.split() if "://" in word and not word.startswith("sqlite")]
    assert len(urls) == 4 and all(u.endswith(ML) for u in urls)  # every URL opens the Model training view
    assert ui_hint(f"sqlite:///{tmp_path}/m.db", cwd=str(tmp_path / "sub")) == \
        f"mlflow ui --backend-store-uri sqlite:///{tmp_path}/m.db --host 127.0.0.1 --port 5000"  # outside the cwd: absolute
    assert ui_hint("sqlite:///mlflow.db", cwd=str(REPO)).startswith("make ui")
    assert ui_hint("sqlite:///mlflow.db", cwd=str(tmp_path)).startswith("mlflow ui --backend-store-uri sqlite:///mlflow.db")
    assert ui_links("sqlite:///m.db", None, "p1", [], cwd=str(tmp_path))[-1] == \
        f"Open the UI:   http://127.0.0.1:5000/#/experiments?{ML} (the parent run's experiment could not be read)"


def test_pareto_front() -> None:
    pts = [(100.0, 1.0, "a"), (200.0, 2.0, "b"), (150.0, 0.5, "c"), (90.0, 3.0, "d"), (200.0, 2.5, "e"), (150.0, 0.5, "f")]
    rows = [TrialRow(n, i, {}, metrics={"t": t, "l": loss}) for i, (t, loss, n) in enumerate(pts)]
    assert [r.trial_id for r in pareto_rows(rows, ("t", "l"), ("max", "min"))] == ["b", "c", "f"]  # ties both stay
    assert [r.trial_id for r in pareto_rows(rows, ("t", "l"), ("max", "max"))] == ["d", "e"]


_SPEC = """\
name: fragment-sweep
trainable: {name: mlp-tabular, params: {num_train_rows: 2048}}
SPACE
objective: {metric: throughput/samples_per_s, mode: max}
budget: {num_trials: 4, num_steps: 30}
"""
_SEARCHED = """\
space:
  batch_size: {type: categorical, choices: [32, 64]}
  precision: {type: categorical, choices: ["32", "bf16-mixed"]}
  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
  num_dataloader_workers: 2
  pin_memory: true
  prefetch_factor: 3
  persistent_workers: false
  compile: true
  params: {hidden: {type: categorical, choices: [16, 64]}, num_features: 8}"""


def test_best_fragment_validates_and_resolves_to_the_best_trial() -> None:
    spec = parse_spec(_SPEC.replace("SPACE", _SEARCHED))
    ran = resolve_trial(spec, {"batch_size": 64, "precision": "32", "lr": 0.0031622776601683794, "params.hidden": 64})
    logged = {k: str(v) for k, v in trial_params(spec, ran).items()}  # MLflow keeps every param as text
    child = SimpleNamespace(info=SimpleNamespace(run_id="r1", run_name="trial-001"), data=SimpleNamespace(
        params=logged, metrics={"throughput/samples_per_s": 1.0}, tags={"sweep.trial_id": "t1", "sweep.status": "ok"}))
    fragment = best_fragment(SweepOutcome(spec, "parent", "sqlite://", rows_from_runs([child]), 1.0))
    # every knob, new ones included, but the worker count (the spec holds it in scaling.num_workers) and the
    # accelerator type, which an unpinned trial does not log
    assert list(yaml.safe_load(fragment)["space"]) == [*(k for k in KNOBS if k not in ("num_workers", "accelerator_type")), "params"]
    pasted = resolve_trial(parse_spec(_SPEC.replace("SPACE", fragment), "the pasted fragment"), {})
    assert {k: getattr(pasted, k) for k in KNOBS} == {k: getattr(ran, k) for k in KNOBS}, fragment
    assert pasted.workload_params == ran.workload_params == {"num_train_rows": 2048, "hidden": 64, "num_features": 8}


_ALIKE = """\
name: patch-sweep
trainable: {name: mlp-tabular, params: {num_train_rows: 2048}}
space:
  batch_size: {type: categorical, choices: [64, 128]}
  precision: "32"
  lr: 0.002
  num_dataloader_workers: 1
  pin_memory: false
  params: {hidden: {type: categorical, choices: [16, 64]}, num_features: 8}
objective: {metric: throughput/samples_per_s, mode: max}
budget: {num_trials: 3, num_steps: 30}
"""


def test_the_tables_show_the_knobs_that_varied_and_say_once_what_every_trial_shared(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two trials that differ only in a trainable param (as measured: the table showed the five loop knobs,
    `64  32  0.002  1  False` twice): that param is the only knob column of the terminal table (`sweeps run`,
    and `sweeps report` reading the store back) and of summary.html; the rest is said once. The best
    configuration still names every knob."""
    spec = parse_spec(_ALIKE)
    tracker = SweepTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "alike-exp")
    parent = tracker.start_sweep(spec.name, "", _ALIKE, {})
    rows = []
    for i, point in enumerate(({"batch_size": 64, "params.hidden": 16}, {"batch_size": 64, "params.hidden": 64}), 1):
        t = TrialRow(f"t{i}", i, trial_params(spec, resolve_trial(spec, point)), status="ok",
                     metrics={TPUT: 100.0 * i, "loss/val": 0.5})
        tracker.start_trial(t.trial_id, t.number, t.params)
        tracker.log_result(t.trial_id, t.metrics, 30)
        tracker.end_trial(t.trial_id, True)
        t.run_id = tracker.run_id(t.trial_id)
        rows.append(t)
    outcome = SweepOutcome(spec, parent, tracker.uri, rows, 1.0)
    shared = ("Same in every trial: batch_size 64, precision 32, lr 0.002, num_dataloader_workers 1, pin_memory False, "
              "prefetch_factor 2, persistent_workers True, compile False, params.num_features 8.")
    table = trials_table(outcome).splitlines()
    assert table[0].split()[:5] == ["rank", "trial", "status", "params.hidden", TPUT]
    assert [line.split()[3] for line in table[1:3]] == ["64", "16"] and table[3:5] == ["", shared]  # best first; said once
    assert main(["report", spec.name, "--tracking-uri", tracker.uri]) == 0
    assert "\n".join(table) in capsys.readouterr().out  # `sweeps report`: the same table, read back from MLflow
    page = summary_html(outcome, {}, [])
    html_table = _Table()
    html_table.feed(page)
    assert html_table.head[2:5] == ["status", "params.hidden", TPUT] and f"<small>{shared}</small>" in page
    assert list(yaml.safe_load(best_fragment(outcome))["space"]) == [
        *(k for k in KNOBS if k not in ("num_workers", "accelerator_type")), "params"]  # unchanged: every knob logged
    rows.append(TrialRow("t3", 3, trial_params(spec, resolve_trial(spec, {"batch_size": 128, "params.hidden": 16})),
                         status="oom", reason="CUDA out of memory"))
    varied, same = knob_split(outcome)  # a failed trial's knobs count too
    assert varied == ["batch_size", "params.hidden"] and "batch_size" not in same  # in the space's order
    assert trials_table(outcome).splitlines()[0].split()[3:5] == varied


@pytest.mark.ray
def test_figures_and_summary_on_parent_run(small_sweep: tuple, tmp_path: Path) -> None:
    outcome, uri, _ = small_sweep
    client = MlflowClient(uri)
    names = {Path(a.path).name for a in client.list_artifacts(outcome.parent_run_id, "report")}
    expected = {"throughput_vs_batch_size.png", "throughput_vs_loader_workers.png", "pareto_front.png",
                "best_trial_utilisation.png", "summary.html", "pareto.json", "pareto.csv"}
    assert expected <= names and "memory_vs_batch_size.png" not in names  # GPU memory: not measured here
    local = Path(client.download_artifacts(outcome.parent_run_id, "report", str(tmp_path)))
    for png in sorted(local.glob("*.png")):
        img = np.asarray(Image.open(png).convert("L"), dtype=np.float32)
        assert img.shape[0] >= 200 and img.shape[1] >= 400, png.name
        assert img.std() > 5 and (img < 128).mean() > 0.005, f"{png.name} looks blank"
    html = (local / "summary.html").read_text()
    assert html.count("data:image/png;base64,") == len(list(local.glob("*.png")))
    assert "memory_vs_batch_size.png: memory/max_reserved_gib was not measured (no GPU)" in html


@pytest.mark.ray
def test_report_cli_text_and_json(small_sweep: tuple, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    outcome, uri, _ = small_sweep
    assert main(["report", "test-sweep", "--tracking-uri", uri, "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "2/3 trials ok" in out and "unsupported" in out and "Best configuration" in out and "Next: best trial" in out
    assert "Pareto front (" in out and "loss/val <= 1000" in out
    assert (tmp_path / "r" / "summary.html").exists()
    front = json.loads((tmp_path / "r" / "pareto.json").read_text())
    assert front and {r["run_id"] for r in front} <= {t.run_id for t in outcome.ranked()}
    assert (tmp_path / "r" / "pareto.csv").read_text().startswith("trial,trial_id,run_id,throughput/samples_per_s,loss/val")
    assert main(["report", outcome.parent_run_id, "--tracking-uri", uri, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["best"]["run_id"] == outcome.best.run_id and data["pareto"] == front
    assert sorted(t["status"] for t in data["trials"]) == ["ok", "ok", "unsupported"]
    assert main(["report", "no-such-sweep", "--tracking-uri", uri]) == 2
    assert "no sweep named 'no-such-sweep'" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _need_chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("Debian chromium is missing in CI: `make test` installs it (make browser)")
        pytest.skip("no chromium on this machine: run `make browser` (apt-get install chromium)")
    return CHROMIUM


@contextlib.contextmanager
def _mlflow_server(uri: str) -> Iterator[int]:
    """`mlflow server` on a free loopback port for the store; yields the port."""
    port = _free_port()
    # One worker and no job runner: a light server for a 2-core machine.
    server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", uri,
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline and server.poll() is None, "mlflow server did not start"
            time.sleep(0.5)
        yield port
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


@contextlib.contextmanager
def _page(chromium: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 900})
        finally:
            browser.close()


# Screenshots the browser tests keep: git-ignored, at the repo root where a person or a CI upload step finds
# them after the run (pytest's tmp_path is buried and pruned); each run overwrites the last one's.
ARTIFACTS = REPO / "test-artifacts"


def _keep(page: Any, name: str, capsys: pytest.CaptureFixture[str]) -> Path:
    """A full-page screenshot kept under test-artifacts/, its path printed in the test output."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000, f"{path} looks empty"
    with capsys.disabled():
        print(f"\nscreenshot: {path}")
    return path


def _training_view(page: Any, *genai: str) -> None:
    """The UI is in MLflow's Model training view: no GenAI sidebar ("Evaluation runs"), nor the GenAI page's
    own marks given (an experiment's "Overview" of traces, a run filed under "Evaluations")."""
    for text in ("Evaluation runs", *genai):
        assert page.get_by_text(text, exact=True).count() == 0, f"GenAI view: {text!r} on {page.url}"


@pytest.mark.ray
def test_mlflow_ui_lists_parent_with_children_in_chromium(small_sweep: tuple, capsys: pytest.CaptureFixture[str]) -> None:
    """The experiment URL the sweep prints opens the runs table (not the GenAI overview) with the sweep's
    parent run, its trials nested under it, and the experiment described by the sweep's answer."""
    chromium = _need_chromium()
    outcome, uri, _ = small_sweep
    client = MlflowClient(uri)
    parent = client.get_run(outcome.parent_run_id)
    exp_id = parent.info.experiment_id
    note = parent.data.tags["mlflow.note.content"]  # set by the runner at the sweep's end: the answer first
    assert note.startswith(f"**Best: trial {outcome.best.number}**") and note.endswith("two precisions, one unsupported on CPU")
    about = client.get_experiment(exp_id).tags["mlflow.note.content"]
    assert about.startswith(f"Latest sweep **test-sweep**: **Best: trial {outcome.best.number}**")
    printed = next(line for line in ui_links(uri, exp_id, outcome.parent_run_id, []) if line.startswith("Every sweep here:"))
    with _mlflow_server(uri) as port, _page(chromium) as page:
        page.goto(printed.split()[-1].replace("http://127.0.0.1:5000/", f"http://127.0.0.1:{port}/"),
                  wait_until="load", timeout=90_000)
        row = page.get_by_role("row").filter(has_text="test-sweep").first
        row.wait_for(timeout=90_000)
        _training_view(page, "Overview")
        page.get_by_text("Latest sweep", exact=False).first.wait_for(timeout=30_000)  # the experiment's description
        row.get_by_role("button").first.click()
        for t in outcome.trials:
            page.get_by_text(f"trial-{t.number:03d}", exact=False).first.wait_for(timeout=30_000)
        _keep(page, "mlflow-ui-sweep-runs.png", capsys)


def _store_with_a_sweep(tmp_path: Path, n: int) -> tuple[str, SweepOutcome]:
    """A finished sweep in a sqlite store as the runner leaves it (no Ray): parent, children, note, report/."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = parse_spec(DEMO)
    tracker = SweepTracker(uri, "ui-exp")
    parent = tracker.start_sweep(spec.name, spec.description, DEMO, {})
    rows = _trials(n)
    for t in rows:
        tracker.start_trial(t.trial_id, t.number, t.params)
        tracker.log_result(t.trial_id, t.metrics, 60)
        tags = {"sweep.verdict": t.verdict.split(":")[0], "sweep.verdict_reason": t.verdict.split(": ", 1)[1]} if t.verdict else {}
        tracker.end_trial(t.trial_id, t.status == "ok", t.status, t.reason, tags)
        t.run_id = tracker.run_id(t.trial_id)
    outcome = SweepOutcome(spec, parent, uri, rows, 12.0)
    tracker.end_sweep("FINISHED", {TPUT: outcome.best.metrics[TPUT]}, {})
    tracker.set_note(sweep_note(outcome))
    publish(outcome, tracker.client)
    return uri, outcome


def test_the_printed_urls_land_on_the_answer_in_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """What `sweeps report` prints last, opened in headless Chromium against `mlflow server`, each in the UI's
    Model training view: the experiment's runs table with the sweep's parent run, the experiment described
    by its answer; the parent run with the answer as its description; its report/summary.html in MLflow's
    artifact viewer (the trials table's last column reachable inside the viewer, sorting, run links to this
    UI); and the compare view of the trials with the swept params and the objective."""
    chromium = _need_chromium()
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    uri, outcome = _store_with_a_sweep(tmp_path, 6)
    assert main(["report", outcome.spec.name, "--tracking-uri", uri]) == 0
    printed = capsys.readouterr().out.splitlines()
    answer_url = next(line for line in printed if line.startswith("then open the answer:")).split()[-1]
    compare_url = next(line for line in printed if line.startswith("Compare the trials:")).split()[-1]
    assert next(line for line in printed if line.startswith("Serve the UI:")).startswith(
        f"Serve the UI:  mlflow ui --backend-store-uri {uri}")
    experiment_url = next(line for line in printed if line.startswith("Every sweep here:")).split()[-1]
    with _mlflow_server(uri) as port, _page(chromium) as page:
        here = f"http://127.0.0.1:{port}/"
        page.goto(experiment_url.replace("http://127.0.0.1:5000/", here), wait_until="load", timeout=90_000)
        page.get_by_role("row").filter(has_text=outcome.spec.name).first.wait_for(timeout=90_000)
        _training_view(page, "Overview")
        page.get_by_text(f"Best: trial {outcome.best.number}", exact=False).first.wait_for(timeout=30_000)
        _keep(page, "mlflow-ui-experiment.png", capsys)

        page.goto(answer_url.replace("http://127.0.0.1:5000/", here), wait_until="load", timeout=90_000)
        page.get_by_text(f"Best: trial {outcome.best.number}", exact=False).first.wait_for(timeout=90_000)
        _training_view(page, "Evaluations")

        report_url = next(line for line in printed if line.startswith("The full report:")).split()[-1]
        assert report_url == answer_url.replace(f"?{ML}", f"/artifacts/report/summary.html?{ML}")
        page.goto(report_url.replace("http://127.0.0.1:5000/", here), timeout=90_000)
        viewer = page.locator("iframe.mlflow-html-iframe")
        viewer.wait_for(timeout=60_000)
        frame = page.frame_locator("iframe.mlflow-html-iframe")
        last = frame.locator("#trials th").last
        last.wait_for(timeout=60_000)
        assert last.inner_text().replace("\n", "") == "time/data_wait_pct"
        last.scroll_into_view_if_needed()
        box, th = viewer.bounding_box(), last.bounding_box()
        assert box and th and box["x"] <= th["x"] and th["x"] + th["width"] <= box["x"] + box["width"] + 1, (box, th)
        assert th["height"] > 0 and box["y"] <= th["y"] <= box["y"] + box["height"]
        page_width = frame.locator("body").evaluate("b => [document.documentElement.scrollWidth, "
                                                    "document.documentElement.clientWidth]")
        assert page_width[0] <= page_width[1] + 1, f"summary.html overflows the viewer: {page_width}"
        assert frame.locator("pre").count() == 0 and frame.locator("img").count() >= 5
        href = frame.locator("#trials a").first.get_attribute("href")
        assert href == f"http://127.0.0.1:{port}/#/experiments/{outcome_experiment(uri, outcome)}/runs/{outcome.best.run_id}?{ML}"
        first_trial = frame.locator("#trials tbody tr").first.locator("td").nth(1)
        frame.locator("#trials th").nth(1).click()  # sort by trial number, ascending
        assert first_trial.inner_text().startswith("#1 ")
        _training_view(page, "Evaluations")
        _keep(page, "mlflow-ui-summary.png", capsys)

        page.goto(compare_url.replace("http://127.0.0.1:5000/", here), wait_until="load", timeout=90_000)
        for text in ("batch_size", "precision", "num_dataloader_workers", TPUT):
            page.get_by_text(text, exact=True).first.wait_for(timeout=60_000)
        for t in outcome.ranked():
            page.get_by_text(f"trial-{t.number:03d}", exact=False).first.wait_for(timeout=30_000)
        _training_view(page)
        _keep(page, "mlflow-ui-compare.png", capsys)


def outcome_experiment(uri: str, outcome: SweepOutcome) -> str:
    return str(MlflowClient(uri).get_run(outcome.parent_run_id).info.experiment_id)


CV = "throughput/samples_per_s_cv_pct"
_TIE = ("Trial 7 and trial 5 are within noise: 2.8% apart, inside their sub-window spread (cv 2.4% / 3.1%), "
        "so neither is measurably faster")


def _h100_outcome(fp16: float, cvs: tuple[float | None, float | None], spec: str = DEMO) -> SweepOutcome:
    """The H100 grid as the sweep leaves it (verdicts revised), trial 5 (fp16, the runner-up) at `fp16`
    samples/s, and the two best trials' cvs."""
    rows = h100_rows()
    rows[4].metrics[TPUT] = fp16
    for t, cv in zip((rows[6], rows[4]), cvs, strict=True):
        if cv is not None:
            t.metrics[CV] = cv
    outcome = SweepOutcome(parse_spec(spec), "parent0", "sqlite:///mlflow.db", rows, 1.0)
    revise_verdicts(outcome)
    return outcome


def test_the_best_and_the_runner_up_within_noise_are_said_to_be() -> None:
    tied = _h100_outcome(9760.0, (2.4, 3.1))  # 10,030 vs 9,760: 2.8% apart, below the larger cv (not the smaller)
    assert tied.best is not None and tied.best.number == 7
    assert f"{_TIE}." in answer(tied) and f"{_TIE}." in sweep_note(tied)
    assert next_steps(tied).endswith(f"add loader workers first. {_TIE}")
    head = trials_table(tied).splitlines()[0].split()
    assert head[head.index(TPUT) + 1] == CV  # the spread beside the figure it qualifies
    page = summary_html(tied, {}, [])
    assert page.count("are within noise: 2.8% apart") == 1  # in the answer, not again under Next
    for apart in (_h100_outcome(9699.0, (2.4, 3.1)),  # 3.4% apart: more than either spread
                  _h100_outcome(9760.0, (2.4, None)),  # no cv for one of them: no figure invented
                  _h100_outcome(9760.0, (2.4, 3.1), DEMO.replace("throughput/samples_per_s, mode: max",
                                                                 "loss/val, mode: min"))):  # not a throughput
        assert "within noise" not in answer(apart) + next_steps(apart) + sweep_note(apart)
    plain = trials_table(_h100_outcome(9760.0, (None, None)))
    assert CV not in plain  # nobody reported it: no empty column


def test_the_answer_and_next_step_carry_the_revised_verdict() -> None:
    outcome = _h100_outcome(9699.0, (None, None))
    cited = "batch_size 512 (trial 8) was input-bound: 8,057/s vs 10,030/s; add loader workers first"
    assert next_steps(outcome) == ("best trial 7 is memory-headroom: SM active (GPM) 26%, compute at 15% of this "
                                   f"machine's measured bf16 peak with only 4.0 of 79 GiB reserved; {cited}")
    assert "a batch_size above 128" not in trials_table(outcome) + answer(outcome)
    assert "trial 7: memory-headroom: SM active (GPM) 26%" in trials_table(outcome).split("Bottleneck verdicts:")[1]
    assert cited in answer(outcome) and cited in summary_html(outcome, {}, [])


def test_sweeps_report_reads_back_the_revised_verdicts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A sweep logged as the callback leaves it (one-trial verdicts): `sweeps report` revises them as the
    runner does; once the runner has logged its revision, the report reads the same text back."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = parse_spec(DEMO)
    tracker = SweepTracker(uri, "revise-exp")
    parent = tracker.start_sweep(spec.name, spec.description, DEMO, {})
    rows = [*h100_rows(), gpu_row(9, 1024, "bf16-mixed", None, status="oom")]
    for t in rows:
        tracker.start_trial(t.trial_id, t.number, t.params)
        tracker.log_result(t.trial_id, {**t.metrics, "device/cpu_isa": "avx2 avx512f"}, 60)
        tags = dict(zip(("sweep.verdict", "sweep.verdict_reason"), t.verdict.split(": ", 1), strict=True)) if t.verdict else {}
        tracker.end_trial(t.trial_id, t.status == "ok", t.status, t.reason, tags)
        t.run_id = tracker.run_id(t.trial_id)
    tracker.end_sweep("FINISHED", {TPUT: 10030.0}, {})
    client = MlflowClient(uri)
    before = load_outcome(client, spec.name)
    assert before.best is not None and before.best.number == 7
    assert "; batch_size 512 (trial 8) was input-bound: 8,057/s vs 10,030/s" in before.best.verdict
    assert before.trials[0].metrics["device/cpu_isa"] == "avx2 avx512f"  # the loop's text facts come back too
    outcome = SweepOutcome(spec, parent, uri, rows, 1.0)
    updates = revise_verdicts(outcome)  # what the runner does at the sweep's end
    log_updates(client, {run: ({}, tags) for run, tags in updates.items()})
    after = load_outcome(client, spec.name)
    assert [t.verdict for t in after.trials] == [t.verdict for t in before.trials] == [t.verdict for t in rows]
    assert main(["report", spec.name, "--tracking-uri", uri]) == 0
    printed = capsys.readouterr().out
    assert "  trial 7: memory-headroom: " in printed and "try a batch_size above 128" not in printed
    assert "\nNext: best trial 7 is memory-headroom: " in printed and "add loader workers first\n" in printed
