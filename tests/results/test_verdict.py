"""The verdict's next step: never what the trial already uses; speed-of-light figures quoted where the
loop reports them; the demo's trials (figures from a real `make demo` on a 2-core CPU) get a verdict;
across a sweep, never a move another trial already measured worse (figures from a real H100 sweep)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeps.results.outcome import SweepOutcome, TrialRow
from sweeps.results.verdict import revise, revise_verdicts, verdict
from sweeps.spec import parse_spec

CPU = {"cpus_per_worker": 1, "cpus_per_loader_worker": 0, "use_gpu": False, "compile": False, "pin_memory": False}
GPU = {"cpus_per_worker": 4, "use_gpu": True, "compile": False, "pin_memory": False, "batch_size": 256}


def _suggestion(reason: str) -> str:
    """The "try ..." part of a reason (what it proposes), without the evidence cited after it."""
    return reason.split("; try ", 1)[1].split("; ")[0] if "; try " in reason else ""


@pytest.mark.parametrize("metrics,params,name,absent", [
    # a GPU trial that is compute-bound in bf16-mixed and compiled: neither is suggested again
    ({"gpu/util_mean_pct": 97.0, "time/data_wait_pct": 1.0}, {**GPU, "precision": "bf16-mixed", "compile": True},
     "compute-bound", ("bf16-mixed", "compile")),
    # tf32 is no step up from tf32
    ({"gpu/util_mean_pct": 97.0, "time/data_wait_pct": 1.0}, {**GPU, "precision": "tf32"}, "compute-bound", ("tf32",)),
    # pinned already; a CPU never hears of pin_memory
    ({"gpu/util_mean_pct": 30.0, "time/data_wait_pct": 45.0}, {**GPU, "precision": "32", "pin_memory": True,
                                                              "num_dataloader_workers": 2}, "input-bound", ("pin_memory",)),
    ({"cpu/worker_util_mean_pct": 50.0, "time/data_wait_pct": 45.0}, {**CPU, "precision": "32"}, "input-bound", ("pin_memory",)),
    # a busy CPU in bf16-mixed with AMX: not bf16-mixed again; a CPU without bf16 in its ISA: no bf16 at all
    ({"cpu/worker_util_mean_pct": 95.0, "device/cpu_isa": "avx512f amx_bf16"}, {**CPU, "precision": "bf16-mixed"},
     "compute-bound", ("bf16-mixed",)),
    ({"cpu/worker_util_mean_pct": 95.0, "device/cpu_isa": "avx2 avx512f"}, {**CPU, "precision": "32"}, "compute-bound",
     ("bf16-mixed",)),
])
def test_the_next_step_is_never_what_the_trial_already_uses(metrics: dict, params: dict, name: str,
                                                             absent: tuple[str, ...]) -> None:
    v = verdict(metrics, params)
    assert v.name == name, v
    assert not any(a in _suggestion(v.reason) for a in absent), v


def test_a_cpu_with_amx_is_told_to_try_bf16_and_a_gpu_in_fp32_both_mixed_precisions() -> None:
    v = verdict({"cpu/worker_util_mean_pct": 95.0, "device/cpu_isa": "avx512f amx_bf16"}, {**CPU, "precision": "32"})
    assert "bf16-mixed (this CPU has amx_bf16)" in _suggestion(v.reason)
    v = verdict({"gpu/util_mean_pct": 97.0}, {**GPU, "precision": "32"})
    assert "bf16-mixed" in _suggestion(v.reason) and "tf32" in _suggestion(v.reason) and "compile" in _suggestion(v.reason)


def test_speed_of_light_figures_are_quoted() -> None:
    v = verdict({"gpu/sm_active_mean_pct": 88.0, "perf/sol_pct": 71.0, "time/data_wait_pct": 1.0},
                {**GPU, "precision": "bf16-mixed"})
    assert v.name == "compute-bound"
    assert "compute at 71% of this machine's measured bf16 peak: little left to gain from batch size" in v.reason
    v = verdict({"gpu/util_mean_pct": 40.0, "time/data_wait_pct": 55.0, "perf/input_sol_pct": 93.0, "perf/h2d_bw_pct": 12.0},
                {**GPU, "precision": "bf16-mixed", "num_dataloader_workers": 2})
    assert v.name == "input-bound"
    assert "input pipeline at 93% of what 2 loader workers can decode" in v.reason
    assert "host-to-device copies at 12% of the measured bandwidth" in v.reason
    assert "more num_dataloader_workers (now 2)" in v.reason and "decode on the GPU" in v.reason
    v = verdict({"cpu/worker_util_mean_pct": 95.0, "perf/sol_pct": 40.0}, {**CPU, "precision": "32"})
    assert "compute at 40% of this machine's measured fp32 peak" in v.reason
    # decode has capacity to spare: adding workers is not the advice
    v = verdict({"gpu/util_mean_pct": 40.0, "time/data_wait_pct": 55.0, "perf/input_sol_pct": 30.0},
                {**GPU, "precision": "32", "num_dataloader_workers": 4})
    assert "more num_dataloader_workers" not in v.reason and "decode is not the limit" in v.reason


# (precision, batch, loader workers, training process % of a core, loader workers %, data wait %) per demo trial
_DEMO = [("32", 32, 0, 47.5, 0.0, 12.4), ("32", 128, 0, 61.5, 0.0, 13.0), ("32", 32, 1, 45.8, 7.7, 3.8),
         ("32", 128, 1, 67.8, 11.4, 4.3), ("bf16-mixed", 32, 0, 58.6, 0.0, 11.6), ("bf16-mixed", 128, 0, 58.1, 0.0, 10.9),
         ("bf16-mixed", 32, 1, 56.1, 8.0, 3.7), ("bf16-mixed", 128, 1, 46.6, 7.3, 3.9)]


@pytest.mark.parametrize("precision,batch,loaders,cpu,loader_cpu,wait", _DEMO)
def test_the_demo_trials_get_a_verdict_not_unclear(precision: str, batch: int, loaders: int, cpu: float,
                                                   loader_cpu: float, wait: float) -> None:
    metrics = {"cpu/worker_util_mean_pct": cpu, "cpu/loader_util_mean_pct": loader_cpu, "time/data_wait_pct": wait,
               "device/cpu_isa": "avx2 avx512f"}
    v = verdict(metrics, {**CPU, "precision": precision, "batch_size": batch, "num_dataloader_workers": loaders})
    assert v.name == "underutilised", v
    assert f"a batch_size above {batch}" in v.reason
    assert ("precision 32" in v.reason) == (precision == "bf16-mixed")  # bf16 is emulated on this ISA


def test_a_rank_busy_on_one_of_two_cores_stays_unclear_and_no_figures_is_unclear() -> None:
    assert verdict({"time/data_wait_pct": 5.0, "cpu/worker_util_mean_pct": 100.0}, {"cpus_per_worker": 2}).name == "unclear"
    assert verdict({}, {}).name == "unclear"


TPUT = "throughput/samples_per_s"
H100_GPU = {"lr": 0.001, "num_dataloader_workers": 6, "pin_memory": True, "compile": False, "use_gpu": True,
            "prefetch_factor": 2, "grad_accum_steps": 1}
# The image-cnn precision x batch grid on one H100 (/work/shared/gpu/image-sweep-h100-2026-11-24.txt):
# (trial, batch, precision, samples/s, data wait %, SM active %, perf/sol_pct)
_H100 = [(1, 128, "32", 2489, 1.802, 94, 48.63), (2, 512, "32", 2675, 7.667, 97, 52.28),
         (3, 128, "tf32", 8686, 46.97, 85, 24.53), (4, 512, "tf32", 9122, 76.12, 85, 25.76),
         (5, 128, "16-mixed", 9699, 14.92, 21, 14.49), (6, 512, "16-mixed", 8028, 81.19, 28, 12.0),
         (7, 128, "bf16-mixed", 10030, 16.79, 26, 14.51), (8, 512, "bf16-mixed", 8057, 79.64, 35, 11.66)]


def gpu_row(number: int, batch: int, precision: str, tput: float | None, wait: float = 10.0, sm: float = 30.0,
            sol: float = 15.0, status: str = "ok", **params: object) -> TrialRow:
    """A finished GPU trial as the sweep keeps it (its one-trial verdict set), 4 of 79 GiB reserved."""
    p = {**H100_GPU, "batch_size": batch, "precision": precision, "seed": number, **params}
    m = {"time/data_wait_pct": wait, "gpu/sm_active_mean_pct": sm, "perf/sol_pct": sol, "perf/h2d_bw_pct": 1.0,
         "memory/headroom_gib": 75.0, "memory/total_gib": 79.0} if status == "ok" else {}
    if tput is not None and status == "ok":
        m[TPUT] = float(tput)
    return TrialRow(f"t{number}", number, p, f"run{number}", status, "" if status == "ok" else "CUDA out of memory",
                    str(verdict(m, p)) if status == "ok" else "", m)


def h100_rows() -> list[TrialRow]:
    return [gpu_row(*t) for t in _H100]


def test_the_h100_best_cites_the_larger_batch_it_measured_instead_of_proposing_it() -> None:
    rows = h100_rows()
    alone = verdict(rows[6].metrics, rows[6].params)
    assert alone.name == "memory-headroom" and "a batch_size above 128" in _suggestion(alone.reason)  # what it said
    revised = revise(rows, TPUT, "max")
    best = revised["t7"]
    assert best.name == "memory-headroom" and best.facts == alone.facts
    assert _suggestion(best.reason) == "" and not any(m.knob == "batch_size" for m in best.moves)
    assert best.measured == ("batch_size 512 (trial 8) was input-bound: 8,057/s vs 10,030/s; add loader workers first",)
    assert "batch_size 512 (trial 6) was input-bound: 8,028/s vs 9,699/s" in revised["t5"].reason  # fp16 alike
    # tf32 at 512: bf16-mixed at 512 was slower (cited), compile nobody measured (kept)
    assert _suggestion(revised["t4"].reason) == "compile"
    assert "precision bf16-mixed (trial 8) was input-bound: 8,057/s vs 9,122/s" in revised["t4"].reason
    # measured better in that direction is no evidence against it: tf32 at 128 still hears of bf16-mixed
    # (trial 7 is faster), fp32 of both; the input-bound trials' moves nobody measured
    for tid in ("t1", "t2", "t3", "t6", "t8"):
        assert revised[tid] == verdict(rows[int(tid[1:]) - 1].metrics, rows[int(tid[1:]) - 1].params), tid


def test_a_larger_batch_measured_faster_keeps_the_move() -> None:
    rows = [gpu_row(1, 128, "bf16-mixed", 10030), gpu_row(2, 512, "bf16-mixed", 11200)]
    revised = revise(rows, TPUT, "max")["t1"]
    assert _suggestion(revised.reason) == "a batch_size above 128" and revised.measured == ()
    # one larger batch faster, another slower: still not measured worse
    rows.append(gpu_row(3, 1024, "bf16-mixed", 9000))
    assert _suggestion(revise(rows, TPUT, "max")["t1"].reason) == "a batch_size above 128"


def test_a_precision_measured_slower_at_the_same_batch_is_cited_only_by_a_twin() -> None:
    fp32 = gpu_row(1, 128, "32", 2489, sm=94, sol=48)
    assert _suggestion(verdict(fp32.metrics, fp32.params).reason) == "bf16-mixed or tf32 or compile"
    other_batch = gpu_row(2, 256, "bf16-mixed", 2000)
    other_loaders = gpu_row(3, 128, "bf16-mixed", 2000, num_dataloader_workers=2)
    assert revise([fp32, other_batch, other_loaders], TPUT, "max")["t1"].measured == ()  # not twins
    twin = gpu_row(4, 128, "bf16-mixed", 2300, sm=90, sol=10, lr=0.01, lr_schedule="cosine")  # lr does not count
    revised = revise([fp32, other_batch, other_loaders, twin], TPUT, "max")["t1"]
    assert _suggestion(revised.reason) == "tf32 or compile"
    assert revised.measured == ("precision bf16-mixed (trial 4) was compute-bound: 2,300/s vs 2,489/s",)


def test_compile_measured_slower_by_a_compiled_twin_is_dropped() -> None:
    plain = gpu_row(1, 128, "bf16-mixed", 6000, sm=95, sol=30)
    compiled = gpu_row(2, 128, "bf16-mixed", 5800, sm=40, sol=20, compile=True)
    assert _suggestion(verdict(plain.metrics, plain.params).reason) == "compile"
    revised = revise([plain, compiled], TPUT, "max")["t1"]
    assert revised.moves == () and revised.measured == ("compile on (trial 2) measured slower: 5,800/s vs 6,000/s",)


def test_out_of_memory_at_a_larger_batch_is_evidence_and_the_nearest_twin_is_cited() -> None:
    rows = [gpu_row(1, 128, "bf16-mixed", 10030), gpu_row(2, 1024, "bf16-mixed", None, status="oom")]
    revised = revise(rows, TPUT, "max")["t1"]
    assert revised.moves == () and revised.measured == ("batch_size 1024 (trial 2) ran out of memory",)
    rows.append(gpu_row(3, 512, "bf16-mixed", 8057, wait=80.0))
    assert revise(rows, TPUT, "max")["t1"].measured[0].startswith("batch_size 512 (trial 3) was input-bound")
    rows.append(gpu_row(4, 256, "bf16-mixed", None, status="oom"))
    assert revise(rows, TPUT, "max")["t1"].measured == ("batch_size 256 (trial 4) ran out of memory",)


def test_a_degraded_twin_is_evidence_even_when_faster() -> None:
    rows = [gpu_row(1, 128, "bf16-mixed", 10030), gpu_row(2, 512, "bf16-mixed", 11200)]
    rows[1].degraded = "loss/val 12% above the fp32 reference at equal data"
    revised = revise(rows, TPUT, "max")["t1"]
    assert revised.moves == () and revised.measured == (
        "batch_size 512 (trial 2) was degraded: loss/val 12% above the fp32 reference at equal data",)
    rows[0].degraded = "loss/val 9% above the fp32 reference at equal data"  # both degraded: speed decides again
    assert _suggestion(revise(rows, TPUT, "max")["t1"].reason) == "a batch_size above 128"


@pytest.mark.parametrize("mode,theirs,dropped", [("min", 45.0, True), ("min", 35.0, False),
                                                 ("max", 45.0, False), ("max", 35.0, True)])
def test_worse_follows_the_objective_mode(mode: str, theirs: float, dropped: bool) -> None:
    rows = [gpu_row(1, 128, "bf16-mixed", 9000), gpu_row(2, 512, "bf16-mixed", 8000)]
    rows[0].metrics["time/to_target_s"], rows[1].metrics["time/to_target_s"] = 40.0, theirs
    revised = revise(rows, "time/to_target_s", mode)["t1"]
    assert (revised.moves == ()) == dropped
    if dropped:
        assert revised.measured == (f"batch_size 512 (trial 2) measured slower: time/to_target_s {theirs:.0f} vs 40",)


def test_on_a_quality_objective_the_bottleneck_is_not_the_reason() -> None:
    rows = [gpu_row(1, 128, "bf16-mixed", 10030), gpu_row(2, 512, "bf16-mixed", 8057, wait=80.0)]
    rows[0].metrics["loss/val"], rows[1].metrics["loss/val"] = 0.2197, 0.3035
    assert revise(rows, "loss/val", "min")["t1"].measured == (
        "batch_size 512 (trial 2) measured worse: loss/val 0.3035 vs 0.2197",)


def test_a_trial_without_the_metric_neither_gives_nor_gets_measured_evidence() -> None:
    rows = [gpu_row(1, 128, "bf16-mixed", None), gpu_row(2, 512, "bf16-mixed", 8057)]
    assert revise(rows, TPUT, "max")["t1"].measured == ()  # nothing to compare it with
    rows = [gpu_row(1, 128, "bf16-mixed", 10030), gpu_row(2, 512, "bf16-mixed", None)]
    assert revise(rows, TPUT, "max")["t1"].measured == ()
    rows[1].status = "crash"  # a failure that is not an oom says nothing about the move
    assert revise(rows, TPUT, "max")["t1"].measured == ()


def test_revise_verdicts_updates_rows_in_place_once_and_leaves_foreign_text() -> None:
    spec = parse_spec((Path(__file__).resolve().parents[2] / "examples" / "demo.yaml").read_text())
    rows = h100_rows()
    rows[0].verdict = "compute-bound: written by older rules; try bf16-mixed"  # not this module's text
    outcome = SweepOutcome(spec, "p", "sqlite://", rows, 1.0)
    updates = revise_verdicts(outcome)
    assert set(updates) == {"run4", "run5", "run7"}
    assert updates["run7"] == {"sweep.verdict_reason": rows[6].verdict.split(": ", 1)[1]}
    assert "(trial 8) was input-bound" in rows[6].verdict and rows[0].verdict.startswith("compute-bound: written")
    assert revise_verdicts(outcome) == {}  # a revised verdict revises to itself (`sweeps report` reads it back)
    rows.append(gpu_row(9, 256, "bf16-mixed", 9500))  # a resumed sweep's new trial: nearer evidence
    assert set(revise_verdicts(outcome)) == {"run7", "run9"}
    assert rows[6].verdict.endswith("reserved; batch_size 256 (trial 9) measured slower: 9,500/s vs 10,030/s")


def test_a_twin_slower_only_within_both_trials_noise_is_a_tie_not_evidence() -> None:
    cv = "throughput/samples_per_s_cv_pct"
    plain = gpu_row(1, 128, "bf16-mixed", 6000, sm=95, sol=30)
    compiled = gpu_row(2, 128, "bf16-mixed", 5900, sm=40, sol=20, compile=True)  # 1.7% slower
    plain.metrics[cv], compiled.metrics[cv] = 0.8, 2.5  # ... inside the larger spread: not measured slower
    assert _suggestion(revise([plain, compiled], TPUT, "max")["t1"].reason) == "compile"
    compiled.metrics[cv] = 1.2  # now outside both spreads: the slower compiled twin is evidence
    assert revise([plain, compiled], TPUT, "max")["t1"].measured == (
        "compile on (trial 2) measured slower: 5,900/s vs 6,000/s",)
