"""Reports of a real sweep: figures on the parent run (read back: size, not blank), the HTML
summary, `sweeps report` text and JSON, and the MLflow UI checked in headless Chromium; and, without
Ray, the Pareto front and the best configuration's `space:` fragment."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from mlflow.tracking import MlflowClient
from PIL import Image

from sweeps.cli import main
from sweeps.outcome import SweepOutcome, TrialRow, pareto_rows
from sweeps.report import best_fragment, rows_from_runs
from sweeps.space import resolve_trial, trial_params
from sweeps.spec import KNOBS, parse_spec

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


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
    assert list(yaml.safe_load(fragment)["space"]) == [*KNOBS, "params"]  # every knob, new ones included
    pasted = resolve_trial(parse_spec(_SPEC.replace("SPACE", fragment), "the pasted fragment"), {})
    assert {k: getattr(pasted, k) for k in KNOBS} == {k: getattr(ran, k) for k in KNOBS}, fragment
    assert pasted.workload_params == ran.workload_params == {"num_train_rows": 2048, "hidden": 64, "num_features": 8}


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


@pytest.mark.ray
def test_mlflow_ui_lists_parent_with_children_in_chromium(small_sweep: tuple, tmp_path: Path) -> None:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("Debian chromium is missing in CI: `make test` installs it (make browser)")
        pytest.skip("no chromium on this machine: run `make browser` (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    outcome, uri, _ = small_sweep
    client = MlflowClient(uri)
    exp_id = client.get_run(outcome.parent_run_id).info.experiment_id
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
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/#/experiments/{exp_id}/runs", wait_until="load", timeout=90_000)
            page.get_by_text("test-sweep", exact=True).first.wait_for(timeout=90_000)
            page.get_by_role("row").filter(has_text="test-sweep").first.get_by_role("button").first.click()
            for t in outcome.trials:
                page.get_by_text(f"trial-{t.number:03d}", exact=False).first.wait_for(timeout=30_000)
            page.screenshot(path=str(tmp_path / "mlflow-ui.png"))
            browser.close()
        assert (tmp_path / "mlflow-ui.png").stat().st_size > 10_000
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
