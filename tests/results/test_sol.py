"""Emulated bf16/fp16 on a CPU, said aloud: a trial is never scored above the fp32 peak it cannot beat, quick
figures measured under another `ONEDNN_MAX_CPU_ISA` never stand in, and the verdict calls a precision emulated
only when a twin at precision 32 measured it faster. Figures as measured on the emulating 2-core VMs of
/work/shared/NOTES.md ("The three CPU classes seen"): a quick bf16 peak of 1.7 GFLOP/s per core against fp32's
~40, bf16-mixed trials at ~60 samples/s against fp32's ~451 at batch 128."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from sweeps.ops.doctor import log_mlflow
from sweeps.results import sol
from sweeps.results.outcome import SweepOutcome, TrialRow
from sweeps.results.sol import KERNEL_ENV, cached_quick_figures, kernel_env, latest_figures, quick_cache_key, score
from sweeps.results.verdict import revise, revise_verdicts, verdict
from sweeps.spec import parse_spec
from tests.results.test_verdict import gpu_row

TPUT, CV = "throughput/samples_per_s", "throughput/samples_per_s_cv_pct"
FP32, BF16 = "matmul/fp32_tflops_per_s_per_core", "matmul/bf16_tflops_per_s_per_core"
EMULATING = {FP32: 0.040, BF16: 0.0017}  # TFLOP/s per core: bf16 matmuls emulated (AMD EPYC, or AVX2-capped Xeon)
NATIVE = {FP32: 0.040, BF16: 0.084}  # native bf16 above fp32 (AMX measures far above)
# quick figures of the avx512_bf16 Xeon, no AMX (2026-11-25): native, yet its 512-matmul at 53% of fp32's
NATIVE_BELOW_FP32 = {FP32: 0.158, BF16: 0.084}
FLOP_PER_SAMPLE = 123e6  # what puts a 60/s bf16 trial at ~217% of the emulated bf16 peak, as measured
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_kernel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests set the kernel variables they mean; one the shell running the suite set (e.g. the whole
    suite run under `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`) must not leak into what they read."""
    for name in KERNEL_ENV:
        monkeypatch.delenv(name, raising=False)


def cpu_row(number: int, precision: str, tput: float, figures: dict[str, float], batch: int = 128, cv: float = 2.0,
            isa: str = "avx2 avx512f", **params: object) -> TrialRow:
    """A finished 2-rank CPU trial as the sweep keeps it: scored against `figures`, its one-trial verdict set."""
    p = {"batch_size": batch, "precision": precision, "num_dataloader_workers": 1, "cpus_per_worker": 1,
         "cpus_per_loader_worker": 0, "use_gpu": False, "compile": False, "pin_memory": False, "lr": 0.001,
         "seed": number, **params}
    m: dict[str, object] = {TPUT: tput, CV: cv, "cpu/worker_util_mean_pct": 97.0, "cpu/loader_util_mean_pct": 8.0,
                            "time/data_wait_pct": 2.0, "device/type": "cpu", "device/cpu_isa": isa,
                            "progress/world_size": 2, "perf/tflops_per_s": tput * FLOP_PER_SAMPLE / 1e12}
    m.update(score(m, p, figures))  # what the sweep's callback does when the trial ends
    return TrialRow(f"t{number}", number, p, f"run{number}", "ok", "", str(verdict(m, p)), m)


# --- perf/sol_pct --------------------------------------------------------------------------------------


def test_an_emulated_bf16_trial_is_held_to_the_fp32_peak_and_a_native_one_to_its_own() -> None:
    metrics = {"perf/tflops_per_s": 60 * FLOP_PER_SAMPLE / 1e12, "progress/world_size": 2}
    bf16 = {"precision": "bf16-mixed", "cpus_per_worker": 1}
    assert 100 * metrics["perf/tflops_per_s"] / (EMULATING[BF16] * 2) > 200  # what it claimed before: 217%
    got = score(metrics, bf16, EMULATING)
    assert got["perf/sol_pct"] == pytest.approx(100 * metrics["perf/tflops_per_s"] / (0.040 * 2)) and got["perf/sol_pct"] <= 100
    assert got["matmul/bf16_emulated"] == 1.0 and got["matmul/bf16_of_fp32_pct"] == pytest.approx(4.25)
    before = score(metrics, bf16, {BF16: NATIVE[BF16]})["perf/sol_pct"]  # its own peak alone, the rule before
    got = score(metrics, bf16, NATIVE)  # native above fp32: its own peak, unchanged
    assert got["perf/sol_pct"] == pytest.approx(before) == pytest.approx(100 * metrics["perf/tflops_per_s"] / (0.084 * 2))
    assert got["matmul/bf16_emulated"] == 0.0
    got = score(metrics, bf16, NATIVE_BELOW_FP32)  # native, measured below fp32: the higher fp32 peak, not emulated
    assert got["perf/sol_pct"] == pytest.approx(100 * metrics["perf/tflops_per_s"] / (0.158 * 2))
    assert got["matmul/bf16_emulated"] == 0.0
    fp32 = score(metrics, {"precision": "32"}, EMULATING)["perf/sol_pct"]
    assert fp32 == pytest.approx(100 * metrics["perf/tflops_per_s"] / (0.040 * 2))  # fp32 trials: unchanged


def test_fp16_is_held_to_fp32_only_where_its_peak_was_measured_and_gpus_are_untouched() -> None:
    metrics = {"perf/tflops_per_s": 0.01, "progress/world_size": 2}
    assert "perf/sol_pct" not in score(metrics, {"precision": "16-mixed"}, EMULATING)  # no fp16 figure: absent
    got = score(metrics, {"precision": "16-mixed"}, {**EMULATING, "matmul/fp16_tflops_per_s_per_core": 0.002})
    assert got["perf/sol_pct"] == pytest.approx(12.5) and got["matmul/fp16_emulated"] == 1.0
    gpu = {"matmul/bf16_tflops_per_s": 700.0, "matmul/fp32_tflops_per_s": 50.0}
    assert score({"perf/tflops_per_s": 350.0, "progress/world_size": 1}, {"precision": "bf16-mixed"}, gpu) == {
        "perf/sol_pct": 50.0}


def test_the_doctor_records_the_flags_and_the_kernel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    figures, facts = dict(EMULATING), {}
    sol.annotate_node(figures, facts)
    assert figures["matmul/bf16_emulated"] == 1.0 and "matmul/fp16_emulated" not in figures  # fp16 not measured
    assert facts == {"host/kernel_env": "ONEDNN_MAX_CPU_ISA=AVX2"}


# --- which figures stand for this process ------------------------------------------------------------


def test_quick_figures_are_measured_in_a_process_that_ends(caplog: pytest.LogCaptureFixture) -> None:
    """The driver never measures on its own device: on a GPU it would keep a CUDA context beside every trial."""
    with caplog.at_level(logging.DEBUG, logger="sweeps.results.sol"):
        figures = sol.measured_apart()
    pids = [int(r.getMessage().rsplit(" ", 1)[1]) for r in caplog.records if "measured in process" in r.getMessage()]
    assert pids and pids[0] != os.getpid()
    assert figures and all(isinstance(v, float) for v in figures.values())


def test_quick_figures_are_cached_per_kernel_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measured: list[str] = []

    def fake_quick_figures() -> dict[str, float]:  # the measurement: what oneDNN would pick under this env
        measured.append(kernel_env())
        return dict(EMULATING if "ONEDNN_MAX_CPU_ISA=AVX2" in kernel_env() else NATIVE)

    monkeypatch.setattr(sol, "measured_apart", fake_quick_figures)
    native_key = quick_cache_key("cpu:Xeon")
    assert cached_quick_figures("cpu:Xeon") == NATIVE and cached_quick_figures("cpu:Xeon") == NATIVE
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert quick_cache_key("cpu:Xeon") != native_key
    assert cached_quick_figures("cpu:Xeon") == EMULATING  # measured again, not the native figures
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert cached_quick_figures("cpu:Xeon") == NATIVE
    assert measured == ["", "ONEDNN_MAX_CPU_ISA=AVX2"]


def test_the_sweep_says_up_front_that_bf16_is_emulated_here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setattr(sol, "measured_apart", lambda: dict(EMULATING))
    (source,) = sol.SpeedOfLight.for_sweep(f"sqlite:///{tmp_path}/mlflow.db").sources.values()  # what the runner echoes
    assert source.endswith("; bf16 matmul at 4.2% of fp32's: emulated here, its trials are held to fp32's peak"
                           "; measured under ONEDNN_MAX_CPU_ISA=AVX2")


def test_kernel_env_names_only_the_variables_that_pick_kernels() -> None:
    assert kernel_env({"ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": ""}) == (
        "ONEDNN_MAX_CPU_ISA=AVX2")
    assert kernel_env({}) == ""


def test_a_doctor_run_measured_under_other_kernels_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    for env, figures in (("", NATIVE), ("AVX2", EMULATING)):
        if env:
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", env)
        else:
            monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        figs, facts = dict(figures), {"device/type": "cpu"}
        sol.annotate_node(figs, facts)
        log_mlflow({"date": "2026-11-25 00:00 UTC", "quick": True, "findings": [], "nodes": [
            {"node": "n0", "hardware_key": "cpu:Xeon", "figures": figs, "facts": facts, "skipped": {}, "findings": []}]}, uri)
    assert latest_figures(uri, "cpu:Xeon", "ONEDNN_MAX_CPU_ISA=AVX2")[BF16] == EMULATING[BF16]
    assert latest_figures(uri, "cpu:Xeon", "")[BF16] == NATIVE[BF16]  # the older run, measured without it
    assert latest_figures(uri, "cpu:Xeon", "ATEN_CPU_CAPABILITY=default") is None
    assert latest_figures(uri, "cpu:Xeon")[BF16] == EMULATING[BF16]  # another node type's figures: the newest


# --- the verdict -------------------------------------------------------------------------------------------


def _demo_rows(figures: dict[str, float], fp32: float, bf16: float, isa: str = "avx2 avx512f", cv: float = 2.0) -> list[TrialRow]:
    """The demo's precision x batch grid at one loader worker: fp32 at trials 1-2, bf16-mixed at 3-4."""
    return [cpu_row(1, "32", fp32 * 0.7, figures, batch=32, isa=isa, cv=cv), cpu_row(2, "32", fp32, figures, isa=isa, cv=cv),
            cpu_row(3, "bf16-mixed", bf16 * 0.8, figures, batch=32, isa=isa, cv=cv),
            cpu_row(4, "bf16-mixed", bf16, figures, isa=isa, cv=cv)]


def test_a_bf16_trial_with_a_much_faster_fp32_twin_is_told_bf16_is_emulated() -> None:
    rows = _demo_rows(EMULATING, fp32=451.0, bf16=60.0)
    alone = verdict(rows[3].metrics, rows[3].params)
    assert "emulated" not in str(alone)  # one trial alone proves nothing
    assert alone.moves[0].text == "precision 32 (its bf16 matmul measured at 4.2% of fp32's here)"
    assert "compute at 9% of this machine's measured fp32 peak" in alone.facts  # not 217% of bf16's
    revised = revise(rows, TPUT, "max")
    assert revised["t4"].confirmed == ("bf16 is emulated on this CPU: 60/s vs 451/s for precision 32 (trial 2)",)
    assert revised["t3"].confirmed == ("bf16 is emulated on this CPU: 48/s vs 315.7/s for precision 32 (trial 1)",)
    assert str(revised["t4"]).startswith(f"compute-bound: {alone.facts}; bf16 is emulated on this CPU: 60/s vs 451/s")
    assert "; try precision 32" in revised["t4"].reason
    assert not any(v.confirmed for tid, v in revised.items() if tid in ("t1", "t2"))
    assert not any("bf16-mixed" in m.text for m in revised["t2"].moves)  # fp32 is not told to try bf16 here


def test_the_claim_reaches_the_logged_verdict_and_sweeps_report() -> None:
    rows = _demo_rows(EMULATING, fp32=451.0, bf16=60.0)
    outcome = SweepOutcome(parse_spec((REPO / "examples" / "demo.yaml").read_text()), "p", "sqlite://", rows, 1.0)
    updates = revise_verdicts(outcome)
    assert set(updates) == {"run3", "run4"}
    assert "bf16 is emulated on this CPU: 60/s vs 451/s for precision 32 (trial 2)" in updates["run4"]["sweep.verdict_reason"]
    assert rows[3].verdict.startswith("compute-bound: ") and "bf16 is emulated on this CPU" in rows[3].verdict
    assert revise_verdicts(outcome) == {}  # read back by `sweeps report`: revises to itself


def test_an_avx2_capped_xeon_is_judged_by_its_figures_not_its_flags() -> None:
    """`ONEDNN_MAX_CPU_ISA=AVX2` on the avx512_bf16 Xeon: /proc/cpuinfo still lists avx512_bf16."""
    isa = "avx2 avx512f avx512_bf16 avx512_fp16"
    rows = _demo_rows(EMULATING, fp32=838.0, bf16=98.0, isa=isa)
    revised = revise(rows, TPUT, "max")
    assert revised["t4"].confirmed == ("bf16 is emulated on this CPU: 98/s vs 838/s for precision 32 (trial 2)",)
    assert not any("bf16-mixed" in m.text for m in revised["t2"].moves)


@pytest.mark.parametrize("figures,fp32,bf16,isa,cv", [
    (NATIVE, 1010.0, 1080.0, "avx2 avx512f avx512_bf16", 2.0),  # native (figures), bf16 faster
    (NATIVE, 1010.0, 900.0, "avx2 avx512f", 2.0),  # the figures say native: a slower bf16 is not called emulated
    (NATIVE_BELOW_FP32, 1010.0, 1080.0, "avx2 avx512f avx512_bf16", 2.0),  # native, its matmul below fp32's
    ({}, 1010.0, 1010.0, "avx2 avx512f avx512_bf16", 2.0),  # native by its flags where no figures, as fast
    (EMULATING, 61.5, 60.0, "avx2 avx512f", 3.0),  # the twin faster only within both trials' noise
])
def test_no_emulation_claim_without_a_clearly_faster_fp32_twin(figures: dict[str, float], fp32: float, bf16: float,
                                                                 isa: str, cv: float) -> None:
    revised = revise(_demo_rows(figures, fp32, bf16, isa, cv), TPUT, "max")
    assert not any("emulated" in str(v) for v in revised.values()), revised


def test_no_fp32_twin_no_claim_and_fp16_follows_the_same_rule() -> None:
    rows = _demo_rows(EMULATING, fp32=451.0, bf16=60.0)
    alone = revise([rows[3], cpu_row(5, "32", 451.0, EMULATING, num_dataloader_workers=0)], TPUT, "max")["t4"]
    assert alone.confirmed == () and "precision 32" in alone.reason  # a trial at other loaders is no twin
    fp16 = [rows[1], cpu_row(6, "16-mixed", 40.0, EMULATING)]  # no fp16 figure: this CPU's flags, then the twin
    assert revise(fp16, TPUT, "max")["t6"].confirmed == (
        "fp16 is emulated on this CPU: 40/s vs 451/s for precision 32 (trial 2)",)
    fp16 = [cpu_row(2, "32", 451.0, {}, isa="avx2 avx512f avx512_fp16"),
            cpu_row(6, "16-mixed", 400.0, {}, isa="avx2 avx512f avx512_fp16")]
    assert not any("emulated" in str(v) for v in revise(fp16, TPUT, "max").values())


def test_on_a_gpu_no_precision_is_called_emulated() -> None:
    rows = [gpu_row(1, 128, "32", 9000, sm=95, sol=50), gpu_row(2, 128, "bf16-mixed", 2000, sm=95, sol=5)]
    for row in rows:
        row.metrics["device/cpu_isa"] = "avx2 avx512f"  # the host's flags: no bf16 on the CPU, irrelevant here
    revised = revise(rows, TPUT, "max")
    assert not any("emulated" in str(v) or v.confirmed for v in revised.values())


def test_native_bf16_measured_below_fp32_is_scored_against_fp32_and_still_suggested() -> None:
    rows = _demo_rows(NATIVE_BELOW_FP32, fp32=1010.0, bf16=1080.0, isa="avx2 avx512f avx512_bf16")
    assert "of this machine's measured fp32 peak" in rows[3].verdict  # the peak it was scored against
    assert "bf16-mixed (this CPU has avx512_bf16)" in rows[1].verdict and "precision 32" not in rows[3].verdict


def test_quick_figures_that_fail_say_why_in_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sol, "_QUICK_CHILD", "import sys; print('no figures here'); sys.exit(3)")
    with pytest.raises(RuntimeError, match="exited 3 without its figures"):
        sol.measured_apart()
    monkeypatch.setattr(sol, "_QUICK_CHILD", "import time; time.sleep(5)")
    with pytest.raises(RuntimeError, match="took over 0.5 s"):
        sol.measured_apart(timeout_s=0.5)
