"""The verdict rules table (`sweeps.results.verdict_rules.RULES`), each rule on its own: a trial that only it
catches, its kind and its advice; and the table a reader sees in the module is the one that runs."""

from __future__ import annotations

import re

import pytest

from sweeps.results import verdict_rules as rules
from sweeps.results.verdict_rules import RULES, first_rule

WAIT, ALLREDUCE, UTIL, SOL = "time/data_wait_pct", "time/allreduce_wait_pct", "gpu/util_mean_pct", "perf/sol_pct"
CPU, HEADROOM, TOTAL = "cpu/worker_util_mean_pct", "memory/headroom_gib", "memory/total_gib"

# (rule, a trial only it catches, words its facts must say, the knobs its moves name)
EXAMPLES = [
    ("input_bound", {WAIT: 35.0}, {"num_dataloader_workers": 1}, "35% of step time waiting for data",
     ["num_dataloader_workers", ""]),
    ("waits_in_allreduce", {ALLREDUCE: 31.0, WAIT: 5.0}, {"num_workers": 4, "batch_size": 64},
     "at 4 ranks 31% of the step waiting for the gradient all-reduce", ["num_workers", "batch_size", "grad_accum_steps"]),
    ("gpu_near_peak", {UTIL: 97.0, SOL: 72.0, WAIT: 2.0}, {"precision": "32", "use_gpu": True},
     "compute at 72% of this machine's measured fp32 peak: little left to gain", ["precision", "precision"]),
    ("gpu_busy", {UTIL: 95.0, SOL: 30.0, WAIT: 2.0}, {"precision": "bf16-mixed", "use_gpu": True},
     "GPU busy 95%, compute at 30% of this machine's measured bf16 peak", ["compile"]),
    ("gpu_memory_left", {UTIL: 50.0, HEADROOM: 70.0, TOTAL: 80.0, WAIT: 2.0}, {"batch_size": 128, "use_gpu": True},
     "with only 10.0 of 80 GiB reserved", ["batch_size"]),
    ("gpu_other", {UTIL: 50.0, HEADROOM: 10.0, TOTAL: 80.0, WAIT: 2.0}, {"batch_size": 128, "use_gpu": True},
     "GPU busy 50% and data wait 2%", ["batch_size", "compile"]),
    ("cpu_saturated", {CPU: 97.0, WAIT: 3.0}, {"cpus_per_worker": 1, "precision": "32", "compile": True},
     "the rank's core(s) are saturated: training process 97% of 1 core(s) busy", ["cpus_per_worker"]),
    ("cpu_idle", {CPU: 40.0, WAIT: 3.0}, {"num_workers": 2, "batch_size": 16},
     "waiting for the other ranks in the gradient all-reduce", ["batch_size"]),
    ("always", {CPU: 90.0, WAIT: 3.0}, {"cpus_per_worker": 2}, "no single bottleneck stands out", []),
]


@pytest.mark.parametrize(("when", "metrics", "params", "says", "knobs"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_each_rule_catches_its_trial_and_says_so(when: str, metrics: dict, params: dict, says: str,
                                                 knobs: list[str]) -> None:
    rule, figures = first_rule(metrics, params)
    assert rule.when is getattr(rules, when), rule
    facts, moves = rule.advice(figures)
    assert says in facts, facts
    assert [m.knob for m in moves] == knobs, moves


def test_every_rule_has_its_example_and_the_modules_table_is_the_one_that_runs() -> None:
    assert [e[0] for e in EXAMPLES] == [r.when.__name__ for r in RULES]
    table = [line.split("|")[1].strip() for line in (rules.__doc__ or "").splitlines()
             if re.match(r"^\| [a-z-]+ \|", line) and not line.startswith("| kind ")]
    assert table == [r.kind for r in RULES]


def test_a_sharded_trial_is_communication_bound_by_its_traced_all_gathers() -> None:
    """FSDP2 has no DDP hook, so no all-reduce counter: the trace's exposed collectives (all-gathers and
    reduce-scatters are NCCL kernels too) decide, and the moves are the sharding's own."""
    traced = {"trace/compute_pct": 55.0, "trace/comm_exposed_pct": 38.0, WAIT: 2.0, CPU: 60.0}
    rule, figures = first_rule(traced, {"num_workers": 8, "batch_size": 4, "strategy": "fsdp"})
    facts, moves = rule.advice(figures)
    assert rule.kind == "communication-bound" and facts == (
        "at 8 ranks 38% of the step in FSDP2's all-gathers and reduce-scatters that compute did not hide (the trace)")
    assert [(m.knob, m.toward) for m in moves] == [("strategy", "fsdp_no_reshard"), ("strategy", "hsdp"),
                                                   ("batch_size", "up")]
    rule, figures = first_rule(traced, {"num_workers": 8, "batch_size": 4, "strategy": "fsdp_no_reshard"})
    _, kept = rule.advice(figures)
    assert [m.knob for m in kept] == ["strategy", "batch_size"]  # already kept gathered: hsdp, a larger batch
    # DDP's trial with the same trace and no counter is not read this way (its counter is the source)
    assert first_rule(traced, {"num_workers": 8, "batch_size": 4, "strategy": "ddp"})[0].kind != "communication-bound"


def test_room_to_spare_says_the_memory_knobs_that_cost_compute_can_go() -> None:
    metrics = {UTIL: 50.0, HEADROOM: 70.0, TOTAL: 80.0, WAIT: 2.0}
    rule, figures = first_rule(metrics, {"batch_size": 8, "use_gpu": True, "activation_checkpointing": "full",
                                         "strategy": "fsdp", "cpu_offload": True})
    _, moves = rule.advice(figures)
    assert rule.kind == "memory-headroom"
    assert [(m.knob, m.toward) for m in moves] == [("batch_size", "up"), ("activation_checkpointing", "none"),
                                                   ("cpu_offload", "false")]
