"""The worker count as a searched knob, without Ray: the spec and the trial's config, the cluster check,
the warm pool's queue routing trials by size, the memory probe per size, the scaling efficiency against
a twin on fewer ranks, the all-reduce wait the comm hook times (two real gloo ranks), the verdict, the
answer, the table, the fragment and the figure; and a fixed global batch (`budget.global_batch_size`): each trial's
accumulation follows from its batch and ranks, the spec refuses what cannot divide it, and the verdicts compare trials
that split it differently."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import torch
import yaml

from sweeps.results.outcome import SweepOutcome, TrialRow, twins
from sweeps.results.quality import annotate, scaling_twin
from sweeps.results.report import answer, best_fragment, table_rows
from sweeps.results.verdict import revise, verdict
from sweeps.search.trials import largest_trial_need, resolve_trial, trial_params, worker_counts
from sweeps.service.pool import Queue
from sweeps.spec import SpecError, parse_spec
from trainables.contract import ALLREDUCE_WAIT_PCT, POOL_RESIZE, SCALING_EFFICIENCY_PCT, STEP_TIME_MS, TrialConfig
from trainables.noise_scale import CommTimer

TPUT = "throughput/samples_per_s"
SPEC = """\
name: ranks
trainable: {name: mlp-tabular, params: {num_train_rows: 2048}}
space:
  num_workers: {type: categorical, choices: [1, 2, 4]}
  batch_size: {type: categorical, choices: [32, 64]}
  lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}
lr_scaling: {rule: linear, reference_batch_size: 64}
objective: {metric: throughput/samples_per_s, mode: max}
budget: {num_trials: 6, num_steps: 5}
"""


def test_the_worker_count_is_a_knob_of_the_space_and_the_trial_runs_on_its_own_count() -> None:
    spec = parse_spec(SPEC)
    assert worker_counts(spec) == [1, 2, 4] and largest_trial_need(spec)["CPU"] == 4.0  # the largest trial
    cfg = resolve_trial(spec, {"num_workers": 4, "batch_size": 32, "lr": 1e-3})
    assert cfg.num_workers == 4 and cfg.lr == pytest.approx(1e-3 * 32 * 4 / 64)  # lr_scaling sees the global batch
    params = trial_params(spec, cfg)
    assert (params["num_workers"], params["global_batch_size"], params["cpus_reserved"]) == (4, 128, 4.0)
    assert params["lr"] == pytest.approx(1e-3)  # the searched rate is logged, as for batch size
    fixed = parse_spec(SPEC.replace("  num_workers: {type: categorical, choices: [1, 2, 4]}\n", ""))
    assert resolve_trial(fixed, {"batch_size": 32, "lr": 1e-3}).num_workers == 2  # scaling.num_workers, the default


@pytest.mark.parametrize("change,message", [
    (("budget:", "scaling: {num_workers: 2}\nbudget:"), "scaling.num_workers: 2 and space.num_workers are both given"),
    (("choices: [1, 2, 4]", "choices: [0, 2]"), "space.num_workers: 0 is not allowed; values must be an integer >= 1"),
    (("{type: categorical, choices: [1, 2, 4]}", "{type: float, low: 1, high: 4}"), "type float is not allowed"),
])
def test_sweeps_validate_refuses_a_worker_count_that_cannot_run(change: tuple[str, str], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(SPEC.replace(*change))


def test_a_space_whose_largest_trial_never_fits_is_refused_naming_the_count_to_drop() -> None:
    from sweeps.service.resources import refuse_if_never_fits

    spec = parse_spec(SPEC)
    with pytest.raises(SpecError, match=r"space.num_workers: the largest trial needs num_workers x cpus_per_worker = "
                                        r"4 x 1 CPUs but this cluster has 2; drop 4 from space.num_workers \(at most 2 fit\)"):
        refuse_if_never_fits(spec, {"CPU": 2.0})
    refuse_if_never_fits(spec, {"CPU": 4.0})


def _pending(q: Queue, trial: str, size: int, kind: str = "") -> None:
    q.submit(trial, TrialConfig(workload="mlp-tabular", batch_size=32, precision="32", lr=1e-3, num_steps=5, num_workers=size,
                                accelerator_type=kind).to_dict(), None, "/tmp/x")


def test_a_warm_group_serves_trials_of_its_own_size_and_ends_to_be_resized_for_the_others() -> None:
    q = Queue()
    _pending(q, "two", 2)
    _pending(q, "one", 1)
    assert q.take(0, 0.1, (1, ""))[0] == "one"  # the oldest trial *of its size*, not the oldest
    assert q.take(0, 0.1, (1, "")) == POOL_RESIZE  # only a 2-rank trial waits: end, a 2-rank group follows
    assert q.shape_for(0, (1, "")) == (2, "")
    assert q.take(1, 0.1, (1, "")) is None  # slot 0 is being resized for it already: slot 1 keeps its group
    assert q.take(0, 0.1, (2, ""))[0] == "two"  # the new group of slot 0 takes it
    assert q.shape_for(0, (2, "")) == (2, "") and q.take(0, 0.05, (2, "")) is None  # nothing waits: no resize


def test_a_warm_group_serves_only_trials_of_its_accelerator_type() -> None:
    q = Queue()
    _pending(q, "on-large", 2, "large")
    _pending(q, "on-small", 2, "small")
    assert q.take(0, 0.1, (2, "small"))[0] == "on-small"  # same size, other type: not served
    assert q.take(0, 0.1, (2, "small")) == POOL_RESIZE
    assert q.shape_for(0, (2, "small")) == (2, "large")
    assert q.take(0, 0.1, (2, "large"))[0] == "on-large"


def test_the_memory_probe_measures_every_worker_count_on_its_own() -> None:
    from sweeps.search.live_state import SearchState
    from sweeps.service.probe import memory_settings

    spec = parse_spec(SPEC + "search: {probe_batch_size: true}\n")
    assert [s["num_workers"] for s in memory_settings(spec)] == [1, 2, 4]
    state = SearchState()
    state.record_probe({"precision": "32", "compile": False, "num_workers": 2}, 64)
    state.record_probe({"precision": "32", "compile": False, "num_workers": 1}, None)
    assert state.oom_excluded({"precision": "32", "compile": False, "num_workers": 2, "batch_size": 64}) == 64
    assert state.oom_excluded({"precision": "32", "compile": False, "num_workers": 1, "batch_size": 64}) is None


def test_the_comm_timer_counts_from_the_last_bucket_to_the_end_of_backward() -> None:
    timer = CommTimer(torch.device("cpu"))
    timer.bucket_ready()
    time.sleep(0.2)  # counted from the first bucket, the window would read >= 0.23 s
    timer.bucket_ready()  # the last bucket: what came before it overlapped backward
    time.sleep(0.03)
    timer.backward_done(keep=True)
    timer.bucket_ready()
    timer.backward_done(keep=False)  # warm-up: dropped
    timer.backward_done(keep=True)  # no bucket since (no sync): nothing
    assert 0.03 <= timer.window_s() < 0.2  # room for a late wake-up beside another busy process
    assert timer.window_s() == 0.0  # per window


def _rank(rank: int, port: int, slow: bool, out: str) -> None:  # a spawned process: two gloo ranks
    import torch.distributed as dist

    import trainables.build as build
    from trainables.loop import train
    from trainables.reporting import ListReporter

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if slow:  # an all-reduce 50 ms slower than backward: the hook returns late, as a slow network would
        real = build.ddp_hook

        def slow_hook(state, bucket):  # type: ignore[no-untyped-def]
            fut = real(state, bucket)
            time.sleep(0.05)
            return fut

        build.ddp_hook = slow_hook  # type: ignore[assignment]
    cfg = TrialConfig(workload="mlp-tabular", batch_size=32, precision="32", lr=1e-3, num_steps=12, num_warmup_steps=2, telemetry_period_s=0,
                      report_interval_s=1e9, workload_params={"num_train_rows": 1024, "num_val_rows": 64},
                      data_dir=out + ".data", num_workers=2)
    final = train(cfg, ListReporter(), torch.device("cpu"))
    if rank == 0:
        Path(out).write_text(f"{final[ALLREDUCE_WAIT_PCT]} {final[STEP_TIME_MS]}")
    dist.destroy_process_group()


def _wait_ms(tmp_path: Path, slow: bool) -> float:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / f"slow{slow}.txt"
    mp.spawn(_rank, args=(port, slow, str(out)), nprocs=2, join=True)
    pct, step_ms = map(float, out.read_text().split())
    return pct / 100 * step_ms


def test_two_gloo_ranks_report_the_all_reduce_wait_backward_did_not_hide(tmp_path: Path) -> None:
    slow, fast = _wait_ms(tmp_path, True), _wait_ms(tmp_path, False)
    assert slow >= 45.0, slow  # the 50 ms each step waited after its backward, per step
    assert fast < slow - 30.0, (fast, slow)


def test_one_rank_has_no_all_reduce_to_wait_for(tmp_path: Path) -> None:
    from trainables.loop import train
    from trainables.reporting import ListReporter

    cfg = TrialConfig(workload="mlp-tabular", batch_size=32, precision="32", lr=1e-3, num_steps=3, num_warmup_steps=1, telemetry_period_s=0,
                      workload_params={"num_train_rows": 256, "num_val_rows": 64}, data_dir=str(tmp_path))
    assert ALLREDUCE_WAIT_PCT not in train(cfg, ListReporter(), torch.device("cpu"))  # absent, never 0


def _row(number: int, workers: int, batch: int, tput: float, lr: float = 1e-3, status: str = "ok",
         **metrics: float) -> TrialRow:
    params = {"num_workers": workers, "batch_size": batch, "precision": "32", "lr": lr, "grad_accum_steps": 1,
              "global_batch_size": workers * batch, "cpus_reserved": float(workers), "use_gpu": False}
    return TrialRow(f"t{number}", number, params, f"run{number}", status, metrics={TPUT: tput, **metrics})


def _outcome(rows: list[TrialRow]) -> SweepOutcome:
    return SweepOutcome(parse_spec(SPEC), "parent", "sqlite://", rows, 1.0)


def test_scaling_efficiency_is_measured_against_the_twin_on_the_fewest_ranks() -> None:
    rows = [_row(1, 1, 32, 100.0), _row(2, 2, 32, 160.0, lr=5e-3), _row(3, 4, 32, 240.0), _row(4, 2, 64, 300.0),
            _row(5, 1, 64, 0.0, status="oom")]
    outcome = _outcome(rows)
    _, updates = annotate(outcome)
    assert rows[1].metrics[SCALING_EFFICIENCY_PCT] == pytest.approx(80.0)  # 160 / (100 x 2 / 1); lr changes no speed
    assert rows[2].metrics[SCALING_EFFICIENCY_PCT] == pytest.approx(60.0)  # against 1 rank, not 2
    assert scaling_twin(rows[2], rows) is rows[0]
    for r in (rows[0], rows[3]):  # the fewest ranks itself; a twin that ran out of memory measured nothing
        assert SCALING_EFFICIENCY_PCT not in r.metrics
    assert updates["run2"][0][SCALING_EFFICIENCY_PCT] == pytest.approx(80.0)  # logged on the child run


def test_the_verdict_says_communication_bound_and_cites_the_twin() -> None:
    params = _row(3, 4, 32, 240.0).params
    v = verdict({ALLREDUCE_WAIT_PCT: 31.0, "cpu/worker_util_mean_pct": 60.0}, params)
    assert str(v).startswith("communication-bound: at 4 ranks 31% of the step waiting for the gradient all-reduce")
    assert [m.knob for m in v.moves] == ["num_workers", "batch_size", "grad_accum_steps"]
    assert verdict({ALLREDUCE_WAIT_PCT: 10.0, "cpu/worker_util_mean_pct": 95.0}, params).name == "compute-bound"
    assert verdict({ALLREDUCE_WAIT_PCT: 31.0, "cpu/worker_util_mean_pct": 95.0},
                   {**params, "num_workers": 1}).name == "compute-bound"  # one rank waits for nobody
    rows = [_row(1, 1, 32, 100.0), _row(3, 4, 32, 240.0, **{ALLREDUCE_WAIT_PCT: 31.0})]
    revised = revise(rows, TPUT, "max")["t3"]
    assert "scaling efficiency 60% of linear against 1 rank (trial 1: 100/s vs 240/s at 4)" in revised.reason
    # fewer ranks was measured slower in total: cited, not suggested
    assert "num_workers 1 (trial 1) measured slower: 100/s vs 240/s" in revised.reason
    assert "fewer ranks" not in revised.reason


def test_the_answer_names_the_rank_count_and_its_efficiency() -> None:
    rows = [_row(1, 1, 32, 100.0), _row(2, 2, 32, 180.0)]
    outcome = _outcome(rows)
    annotate(outcome)
    assert "it runs on **2 ranks** at 90% scaling efficiency against 1 (trial 1)" in answer(outcome)
    assert yaml.safe_load(best_fragment(outcome))["space"]["num_workers"] == 2
    head, table = table_rows(outcome)
    assert {"num_workers", "global_batch_size", SCALING_EFFICIENCY_PCT} <= set(head)
    assert table[0][1][head.index("global_batch_size")] == 64
    lone = _outcome([_row(1, 2, 32, 180.0)])
    assert "it runs on **2 ranks**, the fewest measured" in answer(lone)


def test_the_scaling_figure_draws_one_line_per_configuration(tmp_path: Path) -> None:
    from sweeps.results.plots import figures

    rows = [_row(1, 1, 32, 100.0), _row(2, 2, 32, 180.0), _row(3, 1, 64, 150.0), _row(4, 2, 64, 290.0)]
    outcome = _outcome(rows)
    annotate(outcome)
    figs, skipped = figures(outcome, lambda run, key: [])
    fig = figs["scaling_vs_ranks.png"]
    left, right = fig.axes
    assert sorted(line.get_label() for line in left.get_lines()) == ["batch_size 32", "batch_size 64"]
    assert [list(line.get_ydata()) for line in right.get_lines()][:2] == [[100.0, 90.0], [100.0, pytest.approx(290 / 3)]]
    one = _outcome([_row(1, 1, 32, 100.0), _row(2, 1, 64, 150.0)])
    assert "scaling_vs_ranks.png" not in figures(one, lambda run, key: [])[0]


# -- a fixed global batch --------------------------------------------------------------------------------

GLOBAL = """\
name: split
trainable: {name: gpt-lm, params: {n_layer: 2, n_embd: 32, seq_len: 32}}
space:
  num_workers: {type: categorical, choices: [1, 2]}
  batch_size: {type: categorical, choices: [4, 8, 16]}
  strategy: {type: categorical, choices: [ddp, fsdp]}
  activation_checkpointing: {type: categorical, choices: [none, full]}
objective: {metric: throughput/tokens_per_s, mode: max}
budget: {num_trials: 8, num_steps: 5, global_batch_size: 32}
"""


def test_each_trial_accumulates_to_the_fixed_global_batch_and_logs_how() -> None:
    spec = parse_spec(GLOBAL)
    for workers, batch, accum in ((1, 4, 8), (1, 16, 2), (2, 4, 4), (2, 16, 1)):
        cfg = resolve_trial(spec, {"num_workers": workers, "batch_size": batch, "strategy": "fsdp",
                                   "activation_checkpointing": "full"})
        assert cfg.grad_accum_steps == accum and cfg.batch_size * accum * workers == 32
        params = trial_params(spec, cfg)
        assert params["global_batch_size"] == 32 and params["grad_accum_steps"] == accum
        assert params["global_batch_fixed"] is True
    # without it nothing changes: the space's accumulation (its default, 1), and no new param
    plain = parse_spec(GLOBAL.replace(", global_batch_size: 32", ""))
    cfg = resolve_trial(plain, {"num_workers": 2, "batch_size": 4, "strategy": "ddp", "activation_checkpointing": "none"})
    assert cfg.grad_accum_steps == 1 and "global_batch_fixed" not in trial_params(plain, cfg)
    assert "global_batch_size" not in plain.budget.model_dump()  # an earlier sweep's spec digest still matches


@pytest.mark.parametrize(("change", "said"), [
    (("choices: [4, 8, 16]", "choices: [4, 8, 12]"),
     "budget.global_batch_size: 32 is not a multiple of batch_size 12 x num_workers 1 = 12; give batch sizes that "
     "divide 32 (its share per rank at 1 rank): 1, 2, 4, 8, 16, 32; or another global batch"),
    (("global_batch_size: 32", "global_batch_size: 4"),
     "budget.global_batch_size: 4 is not a multiple of batch_size 8 x num_workers 1 = 8"),
    (("choices: [1, 2]", "choices: [1, 3]"),
     "is not a multiple of batch_size 4 x num_workers 3 = 12; give batch sizes that divide its share per rank (none "
     "does: 32 is not a multiple of 3 ranks)"),
    (("  batch_size: {type: categorical, choices: [4, 8, 16]}\n", "  batch_size: {type: int, low: 4, high: 16}\n"),
     "space.batch_size: with budget.global_batch_size each batch size must divide the global batch, which a range's "
     "values mostly do not; give a list of divisors, e.g. {type: categorical, choices: [4, 8, 16, 32]}"),
    (("  strategy:", "  grad_accum_steps: 2\n  strategy:"),
     "space.grad_accum_steps: with budget.global_batch_size it follows from each trial's batch_size x num_workers"),
])
def test_what_cannot_split_the_global_batch_is_refused_naming_the_field_and_the_fix(change: tuple[str, str],
                                                                                     said: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(GLOBAL.replace(*change))
    assert said in str(caught.value), str(caught.value)


def _split(n: int, batch: int, accum: int, tput: float, **metrics: float) -> TrialRow:
    params = {"num_workers": 2, "batch_size": batch, "grad_accum_steps": accum, "global_batch_size": 32,
              "global_batch_fixed": True, "strategy": "ddp", "activation_checkpointing": "none", "precision": "32"}
    return TrialRow(f"t{n}", n, params, status="ok", metrics={"throughput/tokens_per_s": tput, **metrics})


def test_trials_that_split_the_same_global_batch_differently_are_twins_in_batch_size() -> None:
    small, large = _split(1, 4, 4, 900.0), _split(2, 16, 1, 600.0)
    assert twins(small, large, "batch_size")  # their accumulation follows from the batch: not a second difference
    unfixed = [TrialRow(r.trial_id, r.number, {**r.params, "global_batch_fixed": None}, status="ok",
                        metrics=r.metrics) for r in (small, large)]
    assert not twins(*unfixed, "batch_size")  # a searched accumulation is a knob of its own
    # the comm-bound verdict at a fixed global batch: one all-reduce per global batch whatever the split, so fewer
    # ranks is the move; a larger micro-batch or more accumulation is not offered
    v = verdict({ALLREDUCE_WAIT_PCT: 40.0, "cpu/worker_util_mean_pct": 60.0}, small.params)
    assert v.name == "communication-bound" and [m.knob for m in v.moves] == ["num_workers"], v
    assert "one per fixed global batch" in str(v)
    # an idle rank's batch-up move says what a larger micro-batch changes here (not the all-reduces per sample),
    # and is refuted by its twin that split the same global batch as 16 x 1
    low = _split(3, 4, 4, 900.0, **{"cpu/worker_util_mean_pct": 30.0})
    said = str(verdict(low.metrics, low.params))
    assert said.endswith("try a batch_size above 4 (fewer, larger micro-batches per step)"), said
    revised = revise([low, large], "throughput/tokens_per_s", "max")["t3"]
    assert "batch_size 16 (trial 2) measured slower: 600/s vs 900/s" in revised.reason, revised.reason


def test_the_best_fragment_leaves_the_accumulation_to_the_global_batch_and_validates() -> None:
    spec = parse_spec(GLOBAL)
    rows = [_split(1, 4, 4, 900.0), _split(2, 16, 1, 600.0)]
    fragment = best_fragment(SweepOutcome(spec, "p", "u", rows, 1.0))
    assert "batch_size: 4" in fragment and "grad_accum_steps" not in fragment, fragment
    head = GLOBAL.split("space:")[0]
    parse_spec(head + fragment + "\n" + GLOBAL.split("objective:", 1)[1].join(["objective:", ""]).replace(
        "num_trials: 8", "num_trials: 1"))  # pasted into the spec, it validates
