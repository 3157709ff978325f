"""`sweeps doctor`: the quick CPU run end to end, the GPU branches against a fake NVML and a fake CUDA
timing source, hostile environments as findings, and the speed-of-light scores."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
import torch

from sweeps.ops import doctor
from sweeps.results.sol import latest_figures, quick_figures, score
from tests.helpers.fake_nvml import FakeGpu, FakeNvml
from tests.helpers.reap import started_here
from trainables import doctor_checks as dc

REPO = Path(__file__).resolve().parents[2]
CPU_FIGURES = ("matmul/fp32_tflops_per_s_per_core", "matmul/bf16_tflops_per_s_per_core",
               "allreduce/gloo_w2_64kib_busbw_gb_per_s", "allreduce/gloo_w2_4mib_busbw_gb_per_s",
               "input/decode_samples_per_s_per_core")


def _doctor_children() -> list[psutil.Process]:
    def cmd(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:
            return ""

    return [p for p in psutil.process_iter() if "trainables.doctor_checks" in cmd(p) and started_here(p)]


def test_quick_doctor_on_cpu_measures_every_cpu_figure_and_leaves_no_process(tmp_path: Path) -> None:
    out = tmp_path / "doctor.json"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sweeps", "doctor", "--quick", "--no-mlflow", "--json", str(out),
                           "--storage-path", str(tmp_path / "results")], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 60
    node = json.loads(out.read_text())["nodes"][0]
    for key in CPU_FIGURES:
        assert node["figures"][key] > 0, key
    facts = node["facts"]
    assert facts["host/cores"] >= 1 and facts["host/shm_gib"] > 0 and facts["host/disk_free_gib"] > 0
    assert isinstance(facts["host/amx"], bool) and isinstance(facts["host/avx512_bf16"], bool) and facts["host/cpu_isa"]
    assert "tf32" in node["skipped"]["matmul/tf32_tflops_per_s_per_core"]  # absent with its reason, never 0
    assert "matmul/bf16_tflops_per_s_per_core" in proc.stdout  # the table
    assert _doctor_children() == []


def test_on_a_cluster_one_task_per_node_reports_that_node(ray_cluster: None, tmp_path: Path) -> None:
    report = doctor.run_cluster("auto", quick=True, gpu_checks=False, storage_path=str(tmp_path))
    assert not report["findings"] and len(report["nodes"]) == 1
    node = report["nodes"][0]
    assert node["hardware_key"].startswith("cpu:") and node["figures"]["matmul/fp32_tflops_per_s_per_core"] > 0
    assert node["figures"]["allreduce/gloo_w2_4mib_busbw_gb_per_s"] > 0 and _doctor_children() == []


# --- GPU branches: fake CUDA timing source, fake NVML -------------------------------------------------------


class FakeCudaTimer:
    """Every call of the timed function "takes" `per_call_s` on the pretend GPU; records the TF32 flag."""

    def __init__(self, per_call_s: float) -> None:
        self.per_call_s = per_call_s
        self.tf32_seen: list[bool] = []

    def __call__(self, fn: Any, repeats: int) -> float:
        self.tf32_seen.append(torch.backends.cuda.matmul.allow_tf32)
        return self.per_call_s * repeats


def _fake_gpu(timer: FakeCudaTimer, capability: tuple[int, int] = (9, 0)) -> dc.Device:
    return dc.Device("cuda", torch.device("cpu"), "NVIDIA H100 80GB HBM3", capability, timer,
                     host_buffer=lambda n, pinned: torch.empty(n, dtype=torch.uint8), memory_gib=79.2)


def test_gpu_peaks_per_device_for_every_precision_with_tf32_only_while_measuring_tf32() -> None:
    timer = FakeCudaTimer(1e-3)
    rep = dc.NodeReport()
    budget = dataclasses.replace(dc.QUICK, gpu_sizes=(64, 128), matmul_s=0.01)
    dc._measure_compute(rep, _fake_gpu(timer), budget, measure_peak=True)
    assert set(rep.figures) == {f"matmul/{x}_tflops_per_s" for x in ("fp32", "tf32", "fp16", "bf16")}  # per device
    assert rep.figures["matmul/bf16_tflops_per_s"] == pytest.approx(2 * 128**3 / 1e-3 / 1e12)  # best size wins
    assert sum(timer.tf32_seen) == len(timer.tf32_seen) // 4 and not torch.backends.cuda.matmul.allow_tf32
    assert torch.get_float32_matmul_precision() == "highest"


def test_pre_ampere_gpu_skips_tf32_and_bf16_with_the_reason() -> None:
    rep = dc.NodeReport()
    dc._measure_compute(rep, _fake_gpu(FakeCudaTimer(1e-3), (7, 0)), dataclasses.replace(dc.QUICK, gpu_sizes=(32,)), True)
    assert "matmul/tf32_tflops_per_s" not in rep.figures and "7.x" in rep.skipped["matmul/bf16_tflops_per_s"]
    rep = dc.NodeReport()
    dc._measure_compute(rep, _fake_gpu(FakeCudaTimer(1e-3)), dc.QUICK, measure_peak=False)  # another node of this type
    assert not rep.figures and "another node" in rep.skipped["matmul/fp32_tflops_per_s"]


def test_copy_bandwidth_pinned_and_pageable_from_the_device_timer() -> None:
    pinned_asked: list[bool] = []
    dev = _fake_gpu(FakeCudaTimer(0.01))
    dev.host_buffer = lambda n, pinned: pinned_asked.append(pinned) or torch.empty(n, dtype=torch.uint8)  # type: ignore[func-returns-value]
    got = dc.copy_bandwidth(dev, (1,), budget_s=0.1)
    assert got["copy/h2d_pinned_gb_per_s"] == pytest.approx(1024**2 / 1e9 / 0.01)
    assert set(got) == {f"copy/{d}_{k}_gb_per_s" for d in ("h2d", "d2h") for k in ("pinned", "pageable")}
    assert pinned_asked == [True, False]


def test_nvml_facts_by_uuid_gpm_and_driver() -> None:
    nvml = FakeNvml([FakeGpu("GPU-aaaa", util=10.0), FakeGpu("GPU-bbbb", util=10.0, gpm=False)])
    gpus = [_fake_gpu(FakeCudaTimer(1.0))] * 2
    facts, findings = dc.gpu_facts(gpus, nvml, ["aaaa"])
    assert facts["gpu/driver"] == "580.65" and facts["gpu/gpm"] is True and facts["gpu/count"] == 2 and not findings
    assert facts["gpu/memory_gib"] == 79.2 and facts["gpu/capability"] == "9.0" and facts["gpu/models"] == "NVIDIA H100 80GB HBM3"
    facts, _ = dc.gpu_facts(gpus, nvml, ["aaaa", "bbbb"])
    assert facts["gpu/gpm"] is False  # GPM only where every GPU has it
    facts, findings = dc.gpu_facts(gpus, nvml, ["cccc"])
    assert "not found through NVML" in findings[0]
    facts, findings = dc.gpu_facts(gpus, None, ["aaaa"])  # NVML missing or failing: a finding, not a crash
    assert facts["gpu/nvml"] is False and "NVML unavailable" in findings[0]


def test_world_sizes_a_sweep_would_use() -> None:
    assert dc.world_sizes("cpu", 1) == [2]
    assert dc.world_sizes("cuda", 8) == [2, 4, 8] and dc.world_sizes("cuda", 6) == [2, 4, 6]
    assert dc.world_sizes("cuda", 1) == []


def _fake_loop(reports: dict[str, Any]) -> Any:
    def loop(run: doctor.LoopRun, data_dir: str, timeout_s: float) -> tuple[dict[str, Any] | None, str]:
        precision = run.args[run.args.index("--precision") + 1]
        key = "compile" if "--compile" in run.args else precision
        return reports.get(key), f"python -m trainables.launch --precision {precision}"
    return loop


H100_REPORT = {"loss/train": 2.0, "progress/world_size": 2, "precision/grad_scaler": "True",
               "precision/autocast_dtype": "float16", "gpu/util_mean_pct": 90.0, "gpu/sm_active_mean_pct": 80.0,
               "energy/total_j": 900.0}


def test_gpu_checks_on_a_fake_two_gpu_hopper_node() -> None:
    facts = {"device/type": "cuda", "gpu/count": 2, "gpu/capability": "9.0", "gpu/nvml": True, "gpu/gpm": True}
    reports: dict[str, Any] = {"16-mixed": H100_REPORT, "compile": {"loss/train": 2.0},
               "tf32": {"loss/train": 2.0, "precision/cuda_matmul_tf32": "True", "precision/float32_matmul": "high"},
               "bf16-mixed": {"loss/train": 2.0, "precision/autocast_dtype": "bfloat16", "perf/mfu_pct": 41.0,
                              "perf/tflops_per_s": 400.0, "progress/world_size": 1}}
    checks = doctor.run_checks(facts, {"matmul/bf16_tflops_per_s": 800.0}, True, loop=_fake_loop(reports),
                               oom=lambda: ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 1.00 GiB"))
    status = {c.name: c.status for c in checks}
    assert status == dict.fromkeys(("nccl_ddp", "fp16_gradscaler", "tf32", "channels_last", "bf16", "compile", "nvml_uuid",
                                    "gpm", "energy", "oom", "mfu"), "pass")
    assert "perf/sol_pct=50" in next(c.evidence for c in checks if c.name == "mfu")


def test_gpu_checks_report_failures_and_skips_with_reasons() -> None:
    facts = {"device/type": "cuda", "gpu/count": 1, "gpu/capability": "7.0", "gpu/nvml": False}
    reports: dict[str, Any] = {"16-mixed": {**H100_REPORT, "loss/train": float("nan")}, "tf32": None}
    checks = {c.name: c for c in doctor.run_checks(facts, {}, True, loop=_fake_loop(reports),
                                                    oom=lambda: ("RuntimeError", "CUDA error: an illegal memory access"))}
    assert checks["nccl_ddp"].status == "skip" and "one GPU" in checks["nccl_ddp"].evidence
    assert checks["bf16"].status == "skip" and "7.0" in checks["bf16"].evidence
    assert checks["fp16_gradscaler"].status == "fail"  # a NaN loss is not a pass
    assert checks["tf32"].status == "fail" and checks["compile"].status == "fail"
    assert checks["nvml_uuid"].status == "fail" and "nvidia-ml-py" in checks["nvml_uuid"].evidence
    assert checks["oom"].status == "fail" and "classified error" in checks["oom"].evidence


def test_cpu_subset_says_what_it_skipped_and_provokes_a_real_oom() -> None:
    reports: dict[str, Any] = {"32": {"loss/train": 3.0, "progress/world_size": 2, "perf/tflops_per_s": 0.01},
               "bf16-mixed": {"loss/train": 3.0, "precision/autocast_dtype": "bfloat16"}, "compile": {"loss/train": 3.0}}
    checks = {c.name: c for c in doctor.run_checks({"device/type": "cpu"}, {"matmul/fp32_tflops_per_s_per_core": 0.1},
                                                    True, loop=_fake_loop(reports))}
    assert {n for n, c in checks.items() if c.status == "pass"} == {"gloo_ddp", "bf16", "compile", "oom", "mfu"}
    assert all("skipped" in c.evidence for c in checks.values() if c.status == "skip")
    assert "DefaultCPUAllocator" in checks["oom"].evidence  # the real allocator's error, classified oom
    assert "perf/sol_pct=5" in checks["mfu"].evidence  # 0.01 / (0.1 x 2 ranks x 1 thread)


# --- hostile environments: findings, never tracebacks ---------------------------------------------------


def test_small_or_missing_shm_is_a_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = dc.shutil.disk_usage
    monkeypatch.setattr(dc.shutil, "disk_usage", lambda p: SimpleNamespace(total=64 * 1024**2, free=1, used=0)
                        if str(p) == "/dev/shm" else real(p))
    facts, findings = dc.host_facts(str(tmp_path / "not" / "yet"))
    assert facts["host/shm_gib"] == pytest.approx(1 / 16, abs=1e-3) and "--shm-size" in findings[0]
    _, findings = dc.host_facts(str(tmp_path), shm_path=str(tmp_path / "no-shm"))
    assert "cannot be read" in findings[0]


def test_a_failing_measurement_is_skipped_with_its_reason() -> None:
    rep = dc.NodeReport()
    assert rep.attempt("copy", lambda: (_ for _ in ()).throw(RuntimeError("CUDA error: unspecified launch failure"))) is None
    assert rep.skipped == {"copy": "failed: RuntimeError: CUDA error: unspecified launch failure"}


def test_a_node_that_dies_or_hangs_mid_check_is_a_finding() -> None:
    class NodeDiedError(Exception):
        pass

    def get(ref: str) -> dict[str, Any]:
        if ref == "b":
            raise NodeDiedError("node 10.0.0.2 died")
        return {"figures": {}, "facts": {}, "skipped": {}, "findings": [], "hardware_key": "cpu:x"}

    def wait(refs: list[str], num_returns: int, timeout: float) -> tuple[list[str], list[str]]:
        ready = [r for r in refs if r != "c"][:1]
        if not ready:
            time.sleep(timeout)
        return ready, [r for r in refs if r not in ready]

    cancelled: list[str] = []
    got = doctor.gather({"a": "node-a", "b": "node-b", "c": "node-c"}, wait, get, lambda r, force: cancelled.append(r), 0.3)
    assert [n["node"] for n in got["nodes"]] == ["node-a"] and cancelled == ["c"]
    assert "node-b" in got["findings"][0] and "NodeDiedError" in got["findings"][0]
    assert "node-c: no answer" in got["findings"][1]
    assert doctor.any_failed(got)


# --- MLflow and scoring -----------------------------------------------------------------------------------


def _report(*nodes: tuple[str, dict[str, float]]) -> dict[str, Any]:
    return {"date": "2026-11-22 00:00 UTC", "quick": True, "findings": [], "nodes": [
        {"node": f"n{i}", "hardware_key": key, "figures": figs, "facts": {"device/type": key.split(":")[0]},
         "skipped": {}, "findings": []} for i, (key, figs) in enumerate(nodes)]}


def test_latest_figures_reads_the_newest_doctor_run_per_hardware_key(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert latest_figures(uri, "cpu:Xeon") is None  # no doctor run yet
    doctor.log_mlflow(_report(("cpu:Xeon", {"matmul/fp32_tflops_per_s_per_core": 0.1})), uri)
    doctor.log_mlflow(_report(("cpu:Xeon", {"matmul/fp32_tflops_per_s_per_core": 0.2}),
                              ("cuda:NVIDIA H100", {"matmul/bf16_tflops_per_s": 700.0}),
                              ("cuda:NVIDIA H100", {"matmul/bf16_tflops_per_s": 800.0})), uri)
    assert latest_figures(uri, "cpu:Xeon") == {"matmul/fp32_tflops_per_s_per_core": 0.2}
    assert latest_figures(uri, "cuda:NVIDIA H100") == {"matmul/bf16_tflops_per_s": 750.0}  # median over its nodes
    assert latest_figures(uri, "cuda:NVIDIA A100") is None


def test_sol_on_gpus_is_per_device_times_ranks_and_absent_without_inputs() -> None:
    figures = {"matmul/bf16_tflops_per_s": 800.0, "copy/h2d_pinned_gb_per_s": 50.0}
    metrics = {"perf/tflops_per_s": 400.0, "progress/world_size": 2}
    assert score(metrics, {"precision": "bf16-mixed"}, figures) == {"perf/sol_pct": 25.0}
    assert score(metrics, {"precision": "16-mixed"}, figures) == {}  # no fp16 figure: absent, not 0
    assert score({"progress/world_size": 2}, {"precision": "bf16-mixed"}, figures) == {}
    got = score({**metrics, "copy/h2d_gb_per_s": 5.0}, {"precision": "bf16-mixed", "pin_memory": True}, figures)
    assert got["perf/h2d_bw_pct"] == 10.0


def test_sol_on_cpus_is_per_core_times_ranks_times_threads() -> None:
    figures = {"matmul/fp32_tflops_per_s_per_core": 0.1}
    metrics = {"perf/tflops_per_s": 0.1, "progress/world_size": 2}
    assert score(metrics, {"precision": "32"}, figures)["perf/sol_pct"] == pytest.approx(50.0)
    assert score(metrics, {"precision": "32", "cpus_per_worker": 4}, figures)["perf/sol_pct"] == pytest.approx(12.5)


def test_input_sol_for_image_trials_against_decode_rate_times_loader_workers() -> None:
    figures = {"input/decode_samples_per_s_per_core": 1000.0, "input/decode_image_size": 32.0}
    metrics = {"throughput/samples_per_s": 3000.0, "progress/world_size": 2}
    params = {"workload": "image-cnn", "num_dataloader_workers": 2}
    assert score(metrics, params, figures) == {"perf/input_sol_pct": 75.0}
    assert score(metrics, {**params, "num_dataloader_workers": 0}, figures)["perf/input_sol_pct"] == 150.0
    assert score(metrics, {**params, "workload.image_size": 64}, figures) == {}  # decoded other images
    assert score(metrics, {**params, "workload": "gpt-lm"}, figures) == {}


def test_quick_figures_within_seconds() -> None:
    t0 = time.monotonic()
    figs = quick_figures()
    assert time.monotonic() - t0 < 10  # <= 5 s on an idle 2-core machine; the margin is for a busy one
    assert figs["matmul/fp32_tflops_per_s_per_core"] > 0 and figs["input/decode_samples_per_s_per_core"] > 0
    assert torch.get_num_threads() >= 1


def test_table_and_evidence_show_skips_findings_and_checks() -> None:
    rep = _report(("cpu:Xeon", {"matmul/fp32_tflops_per_s_per_core": 0.1}))
    node = rep["nodes"][0]
    node["skipped"] = {"matmul/tf32_tflops_per_s_per_core": "tf32 is CUDA-only"}
    node["findings"] = ["/dev/shm is 64 MiB"]
    node["checks"] = [{"name": "oom", "status": "pass", "evidence": "classified oom: RuntimeError: ..."}]
    text = doctor.table(rep)
    assert "tf32 is CUDA-only" in text and "FINDING n0: /dev/shm is 64 MiB" in text and "[PASS] n0 oom" in text
    assert "| oom | pass |" in doctor.evidence_markdown(rep, "sweeps doctor --gpu-checks")
