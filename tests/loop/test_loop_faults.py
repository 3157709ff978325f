"""Faults provoked for real, below Ray: a dataloader worker that dies or hangs, a DDP peer that
hangs in a collective. Each must end in a readable failure within its timeout, leaving nothing
running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import torch

from sweeps.service.failures import classify
from trainables.contract import TrialConfig
from trainables.loop import train
from trainables.reporting import ListReporter

REPO = Path(__file__).resolve().parents[2]


def _cfg(data_dir: Path, workload: str, **kw: object) -> TrialConfig:
    base: dict[str, object] = dict(workload=workload, batch_size=16, precision="32", lr=1e-3, num_steps=40,
                                   num_warmup_steps=2, num_dataloader_workers=1, data_dir=str(data_dir))
    base.update(kw)
    return TrialConfig(**base)  # type: ignore[arg-type]


def _own_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize("workload,expected,timeout_s", [
    ("tests.helpers.faulty:loader_dies", "DataLoader worker (pid", 120.0),
    ("tests.helpers.faulty:loader_hangs", "DataLoader timed out after 3.0 seconds", 3.0),
])
def test_dataloader_worker_death_or_hang_fails_readably(data_dir: Path, workload: str, expected: str, timeout_s: float) -> None:
    before = _own_children()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        train(_cfg(data_dir, workload, loader_timeout_s=timeout_s), ListReporter(), torch.device("cpu"))
    assert time.monotonic() - t0 < 60
    kind, reason = classify(info.value)
    assert kind == "dataloader" and expected in reason and "shared memory" in reason, reason
    deadline = time.monotonic() + 10
    while _own_children() - before and time.monotonic() < deadline:  # loader workers are reaped
        time.sleep(0.2)
    assert not _own_children() - before


def test_hung_ddp_peer_times_out_and_leaves_no_process(tmp_path: Path) -> None:
    # Rank 1 never returns from its 4th forward; rank 0 waits in DDP's all-reduce until the
    # process-group timeout (2 s here; 600 s by default, budget.collective_timeout_s) fires.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "trainables.launch", "--workload", "tests.helpers.faulty:rank1_hangs", "--num-steps", "50",
           "--batch-size", "16", "--collective-timeout-s", "2", "--metrics-path", str(tmp_path / "m.jsonl")]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks = []
    try:
        deadline = time.monotonic() + 30
        while len(ranks) < 2 and time.monotonic() < deadline:
            ranks = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
            time.sleep(0.2)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0 and elapsed < 90, elapsed
    assert "Timed out" in err or "timed out" in err, err[-2000:]
    assert ranks and not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in ranks)


def test_a_failing_torchrun_run_exits_1_after_its_traceback_not_by_a_signal(tmp_path: Path) -> None:
    # Both ranks diverge (NaN loss at batch 16) after DDP's all-reduces ran: each says why and leaves with
    # status 1. Left to the interpreter's exit, the gloo group's threads could end a rank by SIGABRT
    # ("terminate called without an active exception"; trainables.launch.leave), hiding the status.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "trainables.launch", "--workload", "tests.helpers.faulty:nan_at_16_oom_above_32", "--num-steps", "8",
           "--num-warmup-steps", "2", "--batch-size", "16", "--metrics-path", str(tmp_path / "m.jsonl")]
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=120)
    # (torchrun may stop the second rank before it prints: one traceback is what is sure)
    assert done.returncode != 0 and "DivergedError: training loss became nan" in done.stderr, done.stderr[-3000:]
    assert "exitcode  : 1 " in done.stderr and "SIGABRT" not in done.stderr and "exitcode  : -6" not in done.stderr, \
        done.stderr[-3000:]


def test_a_rank_crashing_once_under_torchrun_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    # Without Ray: torchrun restarts the worker group once; the launcher resumes it from the
    # checkpoint it kept in --checkpoint-dir (rank 1 dies at measured step 13, after the one at 10).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
           "-m", "trainables.launch", "--workload", "tests.helpers.faulty:crash_once",
           "--params", json.dumps({"marker": str(tmp_path / "crashed")}), "--num-steps", "20", "--num-warmup-steps", "2",
           "--batch-size", "16", "--checkpoint-every-steps", "5", "--checkpoint-dir", str(tmp_path / "ckpt"),
           "--metrics-path", str(tmp_path / "m.jsonl")]
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "crashed").exists()  # the fault fired
    final = [r for r in map(json.loads, (tmp_path / "m.jsonl").read_text().splitlines()) if r.get("progress/final") == 1]
    assert len(final) == 1 and final[0]["progress/restored_from_step"] == 10 and final[0]["progress/steps"] == 20
    assert not list((tmp_path / "ckpt").iterdir())  # a finished run leaves no checkpoint behind


def test_checkpoint_round_trip_in_one_process(tmp_path: Path, data_dir: Path) -> None:
    from trainables import contract

    cfg = _cfg(data_dir, "mlp-tabular", num_dataloader_workers=0, num_steps=12, checkpoint_every_steps=5,
               report_interval_s=1e9)
    first = ListReporter()
    train(cfg, first, torch.device("cpu"))
    assert len(first.checkpoints) == 2  # at measured steps 5 and 10, never at the end
    (tmp_path / contract.CHECKPOINT_FILE).write_bytes(first.checkpoints[-1])
    again = ListReporter()
    final = train(cfg, again, torch.device("cpu"), resume_from=str(tmp_path))
    assert final[contract.RESTORED_FROM] == 10 and final[contract.STEPS] == 12 and final[contract.FINAL] == 1
    assert abs(final[contract.LOSS_VAL] - first.reports[-1][contract.LOSS_VAL]) < 0.5  # continued, not restarted


BOTH_MODES = pytest.mark.parametrize("reuse", ["true", "false"], ids=["warm", "cold"])  # scaling.reuse_workers


@pytest.mark.ray
@BOTH_MODES
def test_a_crashed_rank_resumes_a_hung_peer_times_out_and_a_full_disk_halts_the_sweep_which_resume_finishes(
        ray_cluster: None, tmp_path: Path, reuse: str, new_store: Callable[[Path], Path]) -> None:
    from mlflow.tracking import MlflowClient

    from sweeps.service.runner import run_sweep
    from sweeps.spec import parse_spec

    new_store(tmp_path / "mlflow.db")
    # Three faults, a trial each, in one sweep (grid order): rank 0 finds the disk full, which halts the
    # sweep before the other two start; resumed, rank 1 crashes once, then rank 1 hangs. The 4 s
    # process-group timeout is what the hung trial costs; outside the faults no rank waits that long in a
    # collective: at most 0.2 s measured (2 cores, a third process kept them busy), and a warm group's
    # idle ranks meet every 1 s (timeout / 4).
    flag = tmp_path / "disk-is-full"
    flag.touch()
    text = ("name: faults\ntrainable: {name: 'tests.helpers.faulty:crash_hang_or_disk_full', "
            f"params: {{marker: '{tmp_path / 'crashed'}', flag: '{flag}'}}}}\n"
            "space: {params.fault: {type: categorical, choices: [disk, crash, hang]}}\nsearch: {algorithm: grid}\n"
            "budget: {num_trials: 3, num_steps: 20, num_warmup_steps: 2, checkpoint_every_steps: 5, max_retries: 1,\n"
            "         collective_timeout_s: 4}\n"
            f"scaling: {{reuse_workers: {reuse}}}\n"
            f"tracking: {{uri: 'sqlite:///{tmp_path / 'mlflow.db'}'}}\nstorage_path: {tmp_path / 'r'}\n")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    lines: list[str] = []
    first = run_sweep(parse_spec(text), text, echo=lines.append)
    # The full disk halts the sweep at once (the next trial would hit the same full disk), saying why and what to do.
    assert first.interrupted.startswith("halted: trial 1 disk_full: rank 0: OSError: [Errno 28] No space left on device")
    assert "free space" in first.interrupted
    [halted] = first.trials  # no other trial started
    assert halted.status == "interrupted" and "No space left on device" in halted.reason
    assert any(line.startswith("HALTING the sweep") for line in lines)
    assert any("sweeps resume faults --storage-path" in line for line in lines), lines
    assert client.get_run(halted.run_id).info.status == "KILLED"
    assert client.get_run(first.parent_run_id).info.status == "KILLED"

    flag.unlink()  # space freed
    second = run_sweep(parse_spec(text), text, echo=lines.append)  # finishes the budget
    assert not second.interrupted, second.interrupted
    assert (tmp_path / "crashed").exists()  # the fault fired
    trials = {t.params["workload.fault"]: t for t in second.trials}
    assert {f: t.status for f, t in trials.items()} == {"disk": "ok", "crash": "ok", "hang": "error"}, \
        [(t.status, t.reason) for t in second.trials]
    crashed, hung = trials["crash"], trials["hang"]
    run = client.get_run(crashed.run_id)
    # Rank 1 died at its 15th forward = measured step 13. The retry resumes from the last checkpoint
    # Ray Train's controller had registered by then: step 10, or 5 if the step-10 report was still
    # in flight (the controller drains reports every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S).
    assert run.data.metrics["progress/restored_from_step"] in (5, 10) and run.data.metrics["progress/steps"] == 20
    assert run.data.metrics["throughput/samples_per_s"] > 0 and "loss/val" in run.data.metrics
    # The hung peer: rank 0 waits in DDP's all-reduce until the 4 s process-group timeout fails the
    # trial (not retried: not a crash); no process is left (conftest checks)
    assert hung.status == "error" and "rank 0" in hung.reason and "imed out" in hung.reason, hung.reason
    # ...after the 4 s asked for, not the 600-s default: the trial's own run, start to end (the whole resumed sweep's
    # wall, 120-160 s beside another test process, was a bound too close to what the machine's load decides)
    hung_run = client.get_run(hung.run_id).info
    assert (hung_run.end_time - hung_run.start_time) / 1000 < 300, hung_run
    assert second.parent_run_id == first.parent_run_id and trials["disk"].run_id == halted.run_id  # same runs
    exp = client.get_run(first.parent_run_id).info.experiment_id
    children = client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{first.parent_run_id}'")
    assert len({r.data.tags["sweep.trial_id"] for r in children}) == len(children) == 3  # none duplicated
    # The halted trial continued from the checkpoint it had saved before the disk filled up.
    resumed = client.get_run(halted.run_id).data
    assert resumed.metrics["progress/restored_from_step"] in (5, 10) and resumed.metrics["progress/steps"] == 20
    assert resumed.tags["sweep.status"] == "ok" and "sweep.failure_reason" not in resumed.tags
    assert client.get_run(first.parent_run_id).info.status == "FINISHED"
    # disk: only the latest checkpoint is kept while a trial runs, none once it is over
    assert not [p for p in (tmp_path / "r" / "faults" / "trials").rglob("checkpoint_*") if p.is_dir()]


def test_a_full_disk_on_the_driver_says_so_and_how_to_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from sweeps.cli import main
    from sweeps.exits import ExitCode
    from sweeps.service import runner

    def fills_the_disk(*args: object, **kwargs: object) -> None:  # e.g. writing sweep.json or Tune's state
        with open("/dev/full", "w") as f:
            f.write("{}")  # the kernel answers ENOSPC when the buffer is flushed

    monkeypatch.setattr(runner, "run_sweep", fills_the_disk)
    (tmp_path / "s.yaml").write_text(f"name: full\ntrainable: {{name: mlp-tabular}}\nbudget: {{num_trials: 1, num_steps: 5}}\n"
                                     f"storage_path: {tmp_path / 'r'}\n")
    assert main(["run", str(tmp_path / "s.yaml")]) == ExitCode.RESUMABLE
    err = capsys.readouterr().err
    assert "the disk is full (No space left on device" in err and f"sweeps resume full --storage-path {tmp_path / 'r'}" in err
