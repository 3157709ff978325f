"""Contention (issue 51): what else used a trial's node or GPUs while its window ran -- the per-node arithmetic
over ranks by hand, a real busy process beside a real loop, other processes on a (fake) GPU, and what the verdict
and the answer say of a ranking that rests on shared measurements."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

from sweeps.results.contention import contended, contention_sentence
from sweeps.results.outcome import SweepOutcome, TrialRow
from sweeps.results.verdict import verdict
from sweeps.spec import parse_spec
from tests.helpers.fake_nvml import FakeGpu, FakeNvml
from trainables import contract
from trainables.contract import TrialConfig
from trainables.loop import train
from trainables.reporting import ListReporter
from trainables.sampler import GpuIdentity, NvmlDevice, Sampler, summarize
from trainables.telemetry import combine_ranks, other_cores


def _rank(node: str, busy: float, own: float) -> dict:
    return {"_node": node, "_node_busy_cores": busy, "_own_cores": own, "_node_cores": 2.0}


def test_other_cores_are_a_nodes_busy_cores_less_the_trials_ranks_there() -> None:
    # two ranks on node a read the same node counter (1.9 and 2.0 busy cores: their windows differ a little);
    # they used 0.6 and 0.5 themselves: 1.95 - 1.1 = 0.85 cores of other work. Node b: 1.0 - 0.9 = 0.1
    ranks = [_rank("a", 1.9, 0.6), _rank("a", 2.0, 0.5), _rank("b", 1.0, 0.9)]
    assert other_cores(ranks) == pytest.approx(0.85)  # the busiest node's
    assert combine_ranks(ranks)[contract.CPU_OTHER_CORES] == pytest.approx(0.85)
    assert other_cores([_rank("a", 1.0, 1.02)]) == 0.0  # a counter's jitter is never negative work
    # a rank that could not measure (telemetry off, one sample): absent, never 0
    assert other_cores([_rank("a", 1.0, 0.5), {"_node": "a"}]) is None
    assert contract.CPU_OTHER_CORES not in combine_ranks([{"_node": "a"}])


def test_a_busy_process_beside_the_loop_is_measured_as_other_work() -> None:
    base = dict(workload="mlp-tabular", batch_size=64, precision="32", lr=1e-3, num_steps=100_000, num_warmup_steps=3,
                report_interval_s=100, telemetry_period_s=0.2, min_window_s=2, max_window_s=2)
    # a spinning process outside the trial's process tree (reparented: not a child of this rank)
    pid = int(subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True).stdout)
    try:
        final = train(TrialConfig(**base), ListReporter(), torch.device("cpu"))  # type: ignore[arg-type]
    finally:
        os.kill(pid, signal.SIGKILL)
    # it holds a whole core; whatever else the machine runs only adds to that
    assert final[contract.CPU_OTHER_CORES] >= 0.7, final.get(contract.CPU_OTHER_CORES)
    assert "measured under contention: other processes kept" in str(verdict(final, {"num_workers": 1, "batch_size": 64}))
    off = train(TrialConfig(**{**base, "telemetry_period_s": 0}), ListReporter(), torch.device("cpu"))  # type: ignore[arg-type]
    assert contract.CPU_OTHER_CORES not in off  # not measured: absent, never 0


def test_other_processes_on_the_ranks_gpu_are_counted() -> None:
    nvml = FakeNvml([FakeGpu("GPU-aaaa", util=90.0, processes=1)])
    sampler = Sampler([NvmlDevice(nvml, GpuIdentity(uuid="aaaa"))])
    sampler.sample_once()
    nvml.gpus[0].processes = 3  # another user's two processes arrived
    sampler.sample_once()
    s = summarize(sampler.window())
    assert s[contract.GPU_OTHER_PROCS] == 2.0
    assert combine_ranks([s, {**s, contract.GPU_OTHER_PROCS: 0.0}])[contract.GPU_OTHER_PROCS] == 2.0  # the most
    assert contended(s) == "2 other process(es) ran on its GPU"
    nvml.gpus[0].failing = {"processes"}
    alone = Sampler([NvmlDevice(nvml, GpuIdentity(uuid="aaaa"))])
    alone.sample_once()
    assert contract.GPU_OTHER_PROCS not in summarize(alone.window())


SPEC = """
name: shared
trainable: {name: mlp-tabular}
space: {batch_size: {type: categorical, choices: [16, 64]}}
search: {algorithm: grid}
budget: {num_trials: 2, num_steps: 20}
"""


def _row(n: int, tput: float, others: float | None) -> TrialRow:
    metrics = {"throughput/samples_per_s": tput, **({contract.CPU_OTHER_CORES: others} if others is not None else {})}
    return TrialRow(f"t{n}", n, {"batch_size": 16 * n}, f"r{n}", "ok", "", "", metrics)


def test_the_answer_says_which_ranking_rests_on_contended_trials() -> None:
    spec = parse_spec(SPEC)
    clean = SweepOutcome(spec, "p", "u", [_row(1, 900.0, 0.1), _row(2, 1000.0, 0.05)], 1.0)
    assert contention_sentence(clean) == ""
    shared = SweepOutcome(spec, "p", "u", [_row(1, 900.0, 0.1), _row(2, 1000.0, 1.2)], 1.0)
    said = contention_sentence(shared)
    assert said.startswith("The ranking rests on contended trials: trial 2 (other processes kept 1.2 core(s)"), said
    unknown = SweepOutcome(spec, "p", "u", [_row(1, 900.0, None), _row(2, 1000.0, None)], 1.0)
    assert "is not known" in contention_sentence(unknown)
