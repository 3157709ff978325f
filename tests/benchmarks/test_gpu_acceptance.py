"""benchmarks/gpu_acceptance.py on a CPU machine: every stage skips with its reason; rows, the table and the
recorded H100 run from fakes and files (no Ray, no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.bench_module import REPO, load

H100 = REPO / "benchmarks" / "gpu" / "h100-2026-11-24"


ga = load("gpu_acceptance")
MACHINE = {"gpu": "Fake GPU", "cores": 2}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the stages instead of skipping them")
def test_cpu_machine_skips_every_stage_with_its_reason(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_acceptance.py"), "--out", str(tmp_path / "out"),
                           "--results", str(results)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for stage in ga.STAGES:
        assert f"{stage}: skipped: no CUDA device (torch.cuda.is_available() is False)" in proc.stdout
        assert any(line.startswith(f"| {stage} ") and "| skipped " in line for line in proc.stdout.splitlines())
    assert "| stage " in proc.stdout and "results.jsonl |" in proc.stdout
    assert not results.exists()  # a skipped stage records nothing


def test_preflight_names_what_is_missing() -> None:
    why = ga.preflight(list(ga.STAGES), cuda=True, missing=["ray", "optuna"])
    assert why["doctor"] == why["parity"] == ""
    assert why["gpt"] == why["image"] == why["probe"] == why["memory"] == "needs ray, optuna to run a sweep (pip install -e .)"
    assert all(ga.preflight(list(ga.STAGES), cuda=True, missing=[]).values()) is False


def _trials() -> list[dict[str, Any]]:
    from sweeps.results.outcome import TrialRow

    def row(n: int, precision: str, batch: int, tps: float | None, status: str = "ok") -> TrialRow:
        metrics = {"throughput/tokens_per_s": tps, "perf/mfu_pct": 20.0 + n, "perf/sol_pct": 30.0 + n} if tps else {}
        return TrialRow(f"t{n}", n, {"precision": precision, "batch_size": batch, "lr": 3e-4}, f"r{n}", status,
                        "" if tps else "rank 0: OutOfMemoryError", "compute-bound: try compile" if tps else "", metrics)

    rows = [row(1, "32", 8, 1e4), row(2, "32", 16, 1.2e4), row(3, "bf16-mixed", 8, 3e4), row(4, "bf16-mixed", 16, 4.8e4),
            row(5, "bf16-mixed", 32, None, "oom")]
    return [ga.trial_record(t) for t in rows]


def test_sweep_rows_entry_and_table_from_a_fake_stage(tmp_path: Path) -> None:
    summary = {"sweep": "fake", "trials_ok": 4, "trials_total": 5, "wall_s": 60.0}
    rows = ga.sweep_rows(summary, _trials(), {"bf16-mixed": "largest batch_size that fits 16, 32 does not (2 of 3 ...)"})
    ups = {(x["precision"], x["batch_size"]): x for x in rows if "speedup" in x}
    assert set(ups) == {("bf16-mixed", 8), ("bf16-mixed", 16)}  # the OOM trial has no speed-up; fp32 is the base
    assert ups[("bf16-mixed", 16)]["value"] == pytest.approx(4.0)
    assert ups[("bf16-mixed", 16)]["formula"] == "throughput/tokens_per_s 4.8e+04 / 1.2e+04"
    oom = next(x for x in rows if x.get("trial") == 5 and "speedup" not in x)
    assert oom["status"] == "oom" and "perf/mfu_pct" not in oom and oom["reason"].startswith("rank 0")  # absent, not 0

    r = ga.StageResult("gpt", "ok", "", "python -m sweeps run ...", rows, wall_s=61.0)
    path = tmp_path / "r.jsonl"
    ga.record(r, path, MACHINE, "2026-01-02")
    entry = json.loads(path.read_text())
    assert r.line == 1
    assert (entry["benchmark"], entry["stage"], entry["status"], entry["date"], entry["machine"]) == \
        ("gpu_acceptance", "gpt", "ok", "2026-01-02", MACHINE)
    assert entry["rows"] == rows
    cell = ga.key_figures(r)
    assert "4/5 ok" in cell and "frontier bf16-mixed: largest batch_size that fits 16, 32 does not" in cell
    assert "b8 vs fp32: bf16-mixed 3.00x" in cell and "b16 vs fp32: bf16-mixed 4.00x" in cell
    assert "best trial 4 4.8e+04 tokens_per_s (mfu_pct 24.0, sol_pct 34.0)" in cell
    table = ga.final_table([r, ga.StageResult("parity", "skipped", "no CUDA device")])
    assert "| gpt " in table and "| ok (61 s) " in table and "line 1" in table
    assert "| parity | skipped" in table and "no CUDA device" in table

    ga.record(ga.StageResult("image", "skipped", "no CUDA device"), path, MACHINE)
    assert len(path.read_text().splitlines()) == 1  # a skipped stage writes no row


def test_doctor_and_parity_figures() -> None:
    report = {"nodes": [{"node": "n", "figures": {"matmul/bf16_tflops_per_s": 700.0, "copy/h2d_pinned_gb_per_s": 50.0},
                         "skipped": {"allreduce": "one GPU"}, "facts": {"gpu/count": 1},
                         "checks": [{"name": "bf16", "status": "pass", "evidence": "..."},
                                    {"name": "nccl_ddp", "status": "skip", "evidence": "one GPU"}]}],
              "findings": [], "elapsed_s": 90.0}
    doctor = ga.StageResult("doctor", "ok", rows=ga.doctor_rows(report))
    assert ga.key_figures(doctor) == "matmul TFLOP/s bf16 700.0; h2d pinned 50.0 GB/s; checks 1 pass, 1 skip"
    rounds = [{"case": "c", "round": 0, "ours": 99.0, "plain": 100.0, "ratio": 0.99, "perf/mfu_pct": 29.5},
              {"case": "c", "round": 1, "ours": None, "plain": 100.0, "ratio": None},
              {"case": "c", "round": 2, "ours": 103.0, "plain": 100.0, "ratio": 1.03, "perf/mfu_pct": 30.0}]
    rows = ga.parity_rows(rounds)
    assert rows[-1] == {"case": "c", "ratio_median": pytest.approx(1.01), "ratio_min": 0.99, "ratio_max": 1.03, "n": 2,
                        "formula": "median over rounds of ours / plain"}
    assert ga.key_figures(ga.StageResult("parity", "failed", rows=rows)) == "c ours/plain 0.990, 1.030; ours MFU 29.5-30.0%"


def test_parity_rounds_alternate_and_read_both_outputs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ran: list[str] = []
    plains: list[tuple[str, list[str]]] = []

    def fake_run(cmd: list[str], log: Path, timeout_s: float) -> int:
        if "plain_" in cmd[5]:
            ran.append("plain")
            plains.append((Path(cmd[5]).name, cmd[cmd.index("--strategy"):][:2] if "--strategy" in cmd else []))
            Path(cmd[cmd.index("--out") + 1]).write_text(json.dumps({"throughput": 200.0, "unit": "tokens"}))
        else:
            ran.append("ours")
            assert cmd[5:7] == ["-m", "trainables.launch"]
            Path(cmd[cmd.index("--metrics-path") + 1]).write_text(
                json.dumps({"throughput/tokens_per_s": 190.0, "perf/mfu_pct": 25.0}) + "\n")
        return 0

    monkeypatch.setattr(ga, "_run", fake_run)
    r = ga.parity_stage(tmp_path, str(tmp_path / "data"), rounds=2, steps=5, timeout_s=10)
    assert ran == ["ours", "plain", "plain", "ours"] * 3  # every case, 2 rounds each
    assert r.status == "ok" and [x["ratio"] for x in r.rows if "round" in x] == [0.95] * 6
    # the sharded case against the plain FSDP2 loop, both told the strategy
    assert plains[-2:] == [("plain_fsdp.py", ["--strategy", "fsdp"])] * 2 and plains[0] == ("plain_ddp.py", [])
    assert r.rows[0]["order"] == "ours,plain" and r.rows[1]["order"] == "plain,ours"


def _traced(**change: Any) -> dict[str, Any]:
    final = {"trace/compute_pct": 71.25, "trace/data_wait_pct": 3.5, "trace/comm_exposed_pct": 0.0, "trace/idle_pct": 25.25,
             "trace/comm_pct": 0.0, "trace/memcpy_pct": 1.5, "trace/steps": "8-9", "throughput/tokens_per_s": 9.0e4,
             "cost/usd_per_hour": 3.0, "cost/usd_per_1m_tokens": 3.0 / (9.0e4 * 3600) * 1e6, "loss/val": 7.0}
    return {k: v for k, v in {**final, **change}.items() if v is not None}


def test_the_trace_stage_checks_its_split_and_its_price() -> None:
    assert ga.trace_checks(_traced()) == []  # 71.25 + 3.5 + 0 + 25.25 = 100
    assert ga.trace_checks(_traced(**{"trace/idle_pct": 25.3})) == ["the split sums to 100.0500, not 100"]
    assert ga.trace_checks(_traced(**{"trace/idle_pct": 25.255})) == []  # within 0.01
    assert ga.trace_checks(_traced(**{"trace/comm_pct": 2.0})) == ["1 rank, yet trace/comm_pct 2.0"]
    assert ga.trace_checks(_traced(**{"cost/usd_per_1m_tokens": None})) == ["no cost/usd_per_hour or cost/usd_per_1m_*"]
    assert ga.trace_checks(_traced(**{"cost/usd_per_hour": None})) == ["no cost/usd_per_hour or cost/usd_per_1m_*"]
    untraced = {"trace/skipped": "warm-up too short", "cost/usd_per_hour": 3.0}
    assert ga.trace_checks(untraced) == ["no split: warm-up too short"]


def test_the_trace_stage_runs_a_traced_priced_trial_and_records_it(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    ran: list[list[str]] = []

    def fake_run(cmd: list[str], log: Path, timeout_s: float) -> int:
        ran.append(cmd)
        Path(cmd[cmd.index("--metrics-path") + 1]).write_text(json.dumps(final) + "\n")
        return 0

    monkeypatch.setattr(ga, "_run", fake_run)
    final = _traced()
    r = ga.trace_stage(tmp_path, str(tmp_path / "data"), 3.0, timeout_s=10)
    (cmd,) = ran
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]  # plain torchrun, 1 GPU
    assert cmd[5:7] == ["-m", "trainables.launch"]
    assert cmd[cmd.index("--trace-steps") + 1] == "2" and cmd[cmd.index("--usd-per-hour") + 1] == "3.0"
    assert r.status == "ok" and r.reason == "" and "--trace-steps 2 --usd-per-hour 3.0" in r.command
    assert r.rows[0]["cost/usd_per_1m_tokens"] == final["cost/usd_per_1m_tokens"] and "loss/val" not in r.rows[0]
    cell = ga.key_figures(r)
    assert "split compute 71.2%, data wait 3.5%, comm exposed 0.0%, idle 25.2% (sum 100.00)" in cell, cell
    assert "cost/usd_per_1m_tokens 0.009259" in cell, cell  # 3 / (9e4 x 3600) x 1e6
    path = tmp_path / "r.jsonl"
    ga.record(r, path, MACHINE, "2026-01-02")
    entry = json.loads(path.read_text())
    assert (entry["benchmark"], entry["stage"], entry["status"]) == ("gpu_acceptance", "trace", "ok")

    final = _traced(**{"trace/idle_pct": 20.0})  # a split that does not sum to 100 fails the stage
    failed = ga.trace_stage(tmp_path, str(tmp_path / "data"), 3.0, timeout_s=10)
    assert failed.status == "failed" and failed.reason == "the split sums to 94.7500, not 100"


def test_sweep_figures_come_from_the_mlflow_store(tmp_path: Path) -> None:
    """read_sweep rebuilds what a sweep logged (parent run, child runs, probe tag) through MlflowClient."""
    from sweeps.tracking import SweepTracker

    spec_text = (REPO / "benchmarks" / "gpu" / "probe.yaml").read_text()
    uri = ga.tracking_uri(tmp_path)
    tracker = SweepTracker(uri, "gpu-probe")
    tracker.start_sweep("gpu-gpt2-probe", "", spec_text, {})
    for n, (batch, compile_, tps) in enumerate([(16, False, 3.0e5), (16, True, 3.6e5)], start=1):
        tracker.start_trial(f"t{n}", n, {"batch_size": batch, "precision": "bf16-mixed", "compile": compile_})
        tracker.log_result(f"t{n}", {"throughput/tokens_per_s": tps, "perf/mfu_pct": 30.0}, 1)
        tracker.end_trial(f"t{n}", True)
    tracker.end_sweep("FINISHED", {}, {"sweep.probe.bf16-mixed": "largest batch_size that fits 64, 256 does not"})
    summary, trials, probe = ga.read_sweep(uri, "gpu-gpt2-probe")
    assert (summary["trials_ok"], summary["trials_total"]) == (2, 2)
    assert probe == {"bf16-mixed": "largest batch_size that fits 64, 256 does not"}
    assert [(t["batch_size"], t["compile"], t["throughput/tokens_per_s"]) for t in trials] == \
        [(16, False, 3.0e5), (16, True, 3.6e5)]
    ups = ga.speedups(trials)
    assert [(x["speedup"], x["value"]) for x in ups] == [("compile vs not, same batch_size and precision", pytest.approx(1.2))]


def test_specs_validate_and_move_their_stores_under_out(tmp_path: Path) -> None:
    from sweeps.spec import load_spec

    for stage in ga.SWEEPS:
        spec, _ = load_spec(ga.SPECS / f"{stage}.yaml")
        assert spec.scaling.use_gpu
        moved, _ = load_spec(ga.write_spec(ga.SPECS / f"{stage}.yaml", tmp_path, str(tmp_path / "data")))
        assert moved.tracking.uri == ga.tracking_uri(tmp_path)
        assert (moved.storage_path, moved.data_dir) == (str(tmp_path / "ray_results"), str(tmp_path / "data"))


def test_record_from_the_h100_run(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    results = ga.record_from(H100, path, "shared/gpu")
    entries = [json.loads(x) for x in path.read_text().splitlines()]
    # every stage but the memory and trace ones, which came after that run
    assert [e["stage"] for e in entries] == [s for s in ga.STAGES if s not in ("memory", "trace")] and [r.line for r in results] == [1, 2, 3, 4, 5]
    for e in entries:
        assert (e["date"], e["machine"]["gpu"], e["machine"]["git_sha"], e["machine"]["versions"]["torch"]) == \
            ("2026-11-24", "NVIDIA H100 80GB HBM3", "4861472", "2.11.0+cu130")
        assert (REPO / e["recorded_from"]["source"]).is_file()
        assert e["recorded_from"]["origin"].startswith("shared/gpu/")
    by = {e["stage"]: e["rows"] for e in entries}
    assert {"figure": "matmul/bf16_tflops_per_s", "value": 697.7318168223657} in by["doctor"]
    gpt = next(x for x in by["gpt"] if x.get("speedup") and (x["precision"], x["batch_size"]) == ("bf16-mixed", 16))
    assert gpt["value"] == pytest.approx(3.378e5 / 5.407e4)
    assert {"probe": "bf16-mixed", "frontier": "largest batch_size that fits 64, 256 does not (2 of 4 candidates "
            "tried: 64 fits, 256 oom)"} in by["probe"]
    oom = next(x for x in by["probe"] if x.get("trial") == 5)
    assert (oom["status"], oom["batch_size"], oom["compile"]) == ("oom", 256, True)
    assert [x["ratio"] for x in by["parity"] if "round" in x] == [0.9943, 0.9946, 0.9641, 1.0239]


def test_the_memory_stage_says_its_prediction_error_and_the_best_against_both_baselines() -> None:
    def trial(n: int, ac: str, compiled: bool, batch: int, tput: float | None, predicted: float = 0.0,
              measured: float = 0.0) -> dict[str, Any]:
        row: dict[str, Any] = {"trial": n, "status": "ok" if tput else "oom", "precision": "bf16-mixed",
                               "batch_size": batch, "compile": compiled, "activation_checkpointing": ac}
        return row | ({"throughput/tokens_per_s": tput, ga.PREDICTED: predicted, ga.MEASURED: measured} if tput else {})

    trials = [trial(1, "none", False, 16, 100e3, 40.0, 42.0), trial(2, "none", False, 64, None),
              trial(3, "full", False, 16, 70e3, 20.0, 25.0), trial(4, "full", False, 64, 80e3, 30.0, 31.0),
              trial(5, "selective", True, 64, 130e3, 50.0, 51.0), trial(6, "selective", False, 64, 110e3, 50.0, 52.0)]
    rows = ga.sweep_rows({"sweep": "gpu-gpt2-memory", "trials_ok": 5, "trials_total": 6}, trials, {}, "memory")
    errors = {x["prediction"]: x["error_pct"] for x in rows if "prediction" in x}
    assert errors[3] == pytest.approx(-20.0) and errors[1] == pytest.approx(100 * (40 - 42) / 42) and 2 not in errors
    assert {"predictions_within_pct": 10.0, "within": 4, "of": 5} in rows
    vs = {x["speedup"]: x for x in rows if x.get("speedup", "").startswith("best vs")}
    naive = vs["best vs naive default (full AC, no compile, its largest batch)"]
    assert (naive["trial"], naive["vs_trial"], naive["value"]) == (5, 4, pytest.approx(130 / 80))
    bare = vs["best vs no AC, no compile, its largest batch"]  # 64 ran out of memory: 16 is its largest
    assert (bare["vs_trial"], bare["value"]) == (1, pytest.approx(1.3))
    compiled = [x for x in rows if x.get("speedup", "").startswith("compile")]
    assert [(x["trial"], x["vs_trial"]) for x in compiled] == [(5, 6)]  # the eager twin with the same AC
    cell = ga.key_figures(ga.StageResult("memory", "ok", "", "", rows))
    assert "prediction within 10% for 4 of 5" in cell and "best vs naive default" in cell and "1.62x (trial 5 vs 4)" in cell
    assert ga.sweep_rows({"sweep": "x"}, trials, {}, "gpt")[-1].get("speedup", "").startswith("compile")  # not derived


def test_set_changes_a_stages_spec_and_a_bad_one_names_the_form(tmp_path: Path) -> None:
    from sweeps.spec import load_spec

    sets = ga.parse_sets(["memory:space.compile=false", "memory:budget.num_trials=6",
                          "memory:cost.price_file=examples/prices.csv", "memory:scaling.accelerator_type=H100"])
    spec, _ = load_spec(ga.write_spec(ga.SPECS / "memory.yaml", tmp_path, str(tmp_path / "data"), sets["memory"]))
    assert spec.space.compile.value is False and spec.budget.num_trials == 6
    assert spec.cost is not None and "H100" in spec.cost.prices  # the repo's price file, read from any directory
    with pytest.raises(ValueError, match="precision is a value in memory.yaml, not a section"):
        ga.write_spec(ga.SPECS / "memory.yaml", tmp_path, "", ga.parse_sets(["memory:space.precision.x=1"])["memory"])
    for bad in ("memory:space.compile", "nope:a=1", "memory:=1"):
        with pytest.raises(ValueError, match="STAGE:KEY=VALUE"):
            ga.parse_sets([bad])
