"""A real small sweep: Tuner + OptunaSearch + one TorchTrainer per trial + MLflow store,
read back through MlflowClient."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeps.service.runner import run_sweep
from sweeps.spec import parse_spec

pytestmark = pytest.mark.ray

PARAMS = {"batch_size", "precision", "lr", "num_dataloader_workers", "pin_memory", "num_workers", "global_batch_size"}


def test_sweep_logs_parent_and_child_runs(small_sweep: tuple) -> None:
    outcome, uri, lines = small_sweep

    statuses = sorted(t.status for t in outcome.trials)
    assert statuses == ["ok", "ok", "unsupported"], [(t.params["precision"], t.status, t.reason) for t in outcome.trials]
    assert outcome.best is not None and outcome.best.params["precision"] == "32"
    assert any("[trial 3/3]" in line and "done 3/3" in line for line in lines)

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("test-exp")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.run_id == outcome.parent_run_id
    parent = parents[0]
    note = parent.data.tags["mlflow.note.content"]  # the answer first, then the spec's description
    assert note.startswith("**Best: trial") and note.endswith("two precisions, one unsupported on CPU")
    assert parent.data.tags["sweep.version.ray"].startswith("2.60")
    assert parent.data.tags["sweep.best_run_id"] == outcome.best.run_id
    assert {"spec.yaml", "report"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}

    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 3
    for child in children:
        assert PARAMS <= set(child.data.params)
        assert not any(k in child.data.metrics for k in ("pid", "timestamp", "training_iteration", "time_total_s"))
        assert not any(k.startswith("config/") for k in child.data.metrics)
        if child.data.params["precision"] == "tf32":
            assert child.info.status == "FAILED"
            assert child.data.tags["sweep.status"] == "unsupported"
            assert "tf32" in child.data.tags["sweep.failure_reason"]
            assert "throughput/samples_per_s" not in child.data.metrics  # absent, not 0
        else:
            assert child.info.status == "FINISHED" and child.data.tags["sweep.status"] == "ok"
            assert child.data.metrics["throughput/samples_per_s"] > 0
            assert "loss/val" in child.data.metrics and "time/step_ms" in child.data.metrics
            assert child.data.tags["device/type"] == "cpu"
            # telemetry on CPU: CPU use and data wait, a verdict; no GPU metric, not even a 0
            assert child.data.metrics["cpu/worker_util_mean_pct"] > 0 and "time/data_wait_pct" in child.data.metrics
            assert not any(k.startswith("gpu/") for k in child.data.metrics)
            assert child.data.tags["sweep.verdict"] in (  # a CPU verdict (2 gloo ranks: the all-reduce may be it)
                "input-bound", "compute-bound", "communication-bound", "underutilised", "unclear")
            assert child.data.tags["sweep.verdict_reason"]
            # interim reports make step-indexed time series
            assert len(client.get_metric_history(child.info.run_id, "cpu/worker_util_mean_pct")) >= 2
            # the trace of its last 2 warm-up steps (2 and 3), on both ranks: split, cited, kept with the run
            assert child.data.tags["trace/steps"] == "2-3" and "trace/compute_pct" in child.data.metrics
            assert "trace (warm-up steps 2-3): compute" in child.data.tags["sweep.verdict_reason"]
            kept = {a.path for a in client.list_artifacts(child.info.run_id, "trace")}
            assert kept == {"trace/rank-0.pt.trace.json.gz", "trace/rank-1.pt.trace.json.gz"}, kept


def test_the_image_workload_learns_on_two_gloo_ranks_in_a_ray_train_run_of_its_own(
        ray_cluster: None, tmp_path: Path, new_store: Callable[[Path], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    # Every built-in workload sweeps for real: mlp-tabular in most tests, gpt-lm in test_quality_sweep's
    # time to target, image-cnn (PNG files decoded by the loader) here, on the cold path
    # (scaling.reuse_workers: false: one TorchTrainer for the trial, as `make_trainer` builds it).
    db = new_store(tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)  # the user's folder; the spec's data_dir is the relative default
    text = ("name: images\ntrainable: {name: image-cnn, params: {image_size: 16, num_train_images: 512, "
            "num_val_images: 64, width: 8, depth: 1}}\n"
            "space: {batch_size: 16, lr: 3.0e-3}\n"
            "budget: {num_trials: 1, num_steps: 30, num_warmup_steps: 3, report_interval_s: 0.05}\n"
            "scaling: {num_workers: 2, reuse_workers: false}\n"
            f"tracking: {{uri: 'sqlite:///{db}'}}\nstorage_path: {tmp_path / 'r'}\n")
    outcome = run_sweep(parse_spec(text), text, echo=lambda _: None)
    assert [t.status for t in outcome.trials] == ["ok"], [(t.status, t.reason) for t in outcome.trials]
    # A cold trial's ranks work where the sweep started, as under torchrun (tests/e2e/test_workdir.py: warm groups, and
    # a missing file): they wrote and their loader workers decoded the PNGs under ./.cache/datasets here
    assert list((tmp_path / ".cache" / "datasets").rglob("*.png")), sorted((tmp_path / ".cache").rglob("*"))[:5]
    client = MlflowClient(f"sqlite:///{db}")
    child = client.get_run(outcome.trials[0].run_id)
    m = child.data.metrics
    assert child.data.params["workload"] == "image-cnn" and m["progress/world_size"] == 2
    # summed over both ranks
    assert m["throughput/samples_per_s"] == pytest.approx(2 * m["throughput/samples_per_s_per_worker"])
    assert m["loss/val"] < 2.302  # below chance level for 10 classes (ln 10)
    loss = [p.value for p in sorted(client.get_metric_history(child.info.run_id, "loss/train"), key=lambda p: p.step)]
    assert len(loss) >= 3 and loss[-1] < loss[0], loss  # interim reports at a cadence the ranks agreed on


def test_circuit_breaker_stops_repeated_identical_failures(ray_cluster: None, tmp_path: Path, new_store: Callable[[Path], Path]) -> None:
    new_store(tmp_path / "mlflow.db")
    text = ("name: broken\ntrainable: {name: 'examples.no_such_module:build'}\n"
            "space: {lr: {type: float, low: 1.0e-3, high: 1.0e-2}}\n"
            "budget: {num_trials: 6, num_steps: 5, max_identical_failures: 2}\n"
            f"tracking: {{uri: 'sqlite:///{tmp_path / 'mlflow.db'}'}}\nstorage_path: {tmp_path / 'r'}\n")
    lines: list[str] = []
    outcome = run_sweep(parse_spec(text), text, echo=lines.append)
    # The breaker trips on the 2nd failure; a 3rd trial Tune had already started is stopped or fails alike.
    assert 2 <= len(outcome.trials) <= 3 and [t.status for t in outcome.trials[:2]] == ["config", "config"]
    assert all(t.status in ("config", "stopped") for t in outcome.trials)
    assert "cannot import trainable 'examples.no_such_module:build'" in outcome.trials[0].reason
    assert outcome.stopped_reason.startswith("2 trials in a row failed the same way (config:")
    assert any(line.startswith("STOPPING the sweep") for line in lines)
    assert outcome.best is None


def test_grid_with_oom_and_divergence_classifies_skips_and_never_picks_them(ray_cluster: None, tmp_path: Path,
                                                                           new_store: Callable[[Path], Path]) -> None:
    new_store(tmp_path / "mlflow.db")
    # Injected faults: batch 16 diverges (NaN loss), batches above 32 run out of memory.
    text = ("name: oom\ntrainable: {name: 'tests.helpers.faulty:nan_at_16_oom_above_32'}\n"
            "space: {batch_size: {type: categorical, choices: [128, 64, 32, 16]}}\n"
            "search: {algorithm: grid}\n"
            "budget: {num_trials: 4, num_steps: 5, num_warmup_steps: 1, max_identical_failures: 0}\n"
            f"tracking: {{uri: 'sqlite:///{tmp_path / 'mlflow.db'}'}}\nstorage_path: {tmp_path / 'r'}\nseed: 1\n")
    lines: list[str] = []
    outcome = run_sweep(parse_spec(text), text, echo=lines.append)
    # Grid order is smallest batch first; after the OOM at 64, batch 128 is never run.
    ran = [(t.params["batch_size"], t.status) for t in sorted(outcome.trials, key=lambda t: t.number)]
    assert ran == [(16, "diverged"), (32, "ok"), (64, "oom")], ran
    by_batch = {t.params["batch_size"]: t for t in outcome.trials}
    assert "CUDA out of memory" in by_batch[64].reason and "rank" in by_batch[64].reason
    assert "nan" in by_batch[16].reason.lower()
    assert outcome.best is by_batch[32]  # neither the OOM nor the NaN trial is ever best
    assert any("out of memory at batch_size=64" in line for line in lines)
    # the OOM's own progress line already knows batch 128 will not run: nothing is left to wait for
    oom_line = next(line for line in lines if line.startswith("[trial 3/4] FAILED (oom"))
    assert "done 3/4 (1 skipped: out of memory bounds)" in oom_line and oom_line.endswith("ETA 0s"), oom_line
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    diverged = client.get_run(by_batch[16].run_id)
    assert diverged.data.tags["sweep.status"] == "diverged" and "loss/val" not in diverged.data.metrics
    assert all(v == v for v in diverged.data.metrics.values())  # no NaN logged as a metric
