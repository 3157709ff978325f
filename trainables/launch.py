"""Run the shared loop without Ray, e.g. on a GPU machine: ``torchrun --nproc-per-node N -m trainables.launch ...``.

Prints one JSON line per report (rank 0). This is also the baseline for benchmarks.

Crash recovery without Ray: with ``--checkpoint-every-steps N --checkpoint-dir DIR``, rank 0 keeps
the latest checkpoint in DIR (one file, replaced atomically) and every start resumes from it, so
``torchrun --max-restarts 1`` restarts a crashed worker group from its last checkpoint. A run that
finishes deletes it. On several nodes DIR must be a shared filesystem.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainables.contract import CHECKPOINT_FILE, TrialConfig
from trainables.knobs import KNOBS
from trainables.loop import train
from trainables.reporting import JsonlReporter, keep_checkpoint
from trainables.train_functions import naming_workdir


class DirCheckpointReporter(JsonlReporter):
    """JSON lines, and each checkpoint the loop hands over copied into `directory` (latest only)."""

    def __init__(self, path: str | None, rank: int, directory: Path) -> None:
        super().__init__(path, rank)
        self.directory = directory

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        if checkpoint_dir is not None:  # rank 0 only
            keep_checkpoint(checkpoint_dir, self.directory)
        super().report(metrics, checkpoint_dir)


def add_knob_flags(p: argparse.ArgumentParser) -> None:
    """A flag per loop knob, from its one declaration (`trainables.knobs`): `--batch-size 32`; a switch
    that is off by default `--pin-memory`, one that is on `--no-persistent-workers`."""
    for name, (kind, default, declared) in KNOBS.items():
        if not declared.flag:
            continue
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            action = "store_false" if default else "store_true"
            p.add_argument(flag if not default else "--no-" + flag[2:], dest=name, action=action, help=declared.help)
        else:
            p.add_argument(flag, type=kind, default=default, choices=declared.choices, help=declared.help)


def _parse(argv: list[str] | None) -> tuple[Path | None, TrialConfig]:
    p = argparse.ArgumentParser(prog="python -m trainables.launch", description=__doc__)
    p.add_argument("--workload", default="image-cnn")
    p.add_argument("--params", default="{}", help="workload params as JSON, e.g. '{\"width\": 32}'")
    add_knob_flags(p)
    p.add_argument("--num-steps", type=int, default=50)
    p.add_argument("--num-warmup-steps", type=int, default=5)
    p.add_argument("--min-window-s", type=float, default=0.0,
                   help="the measured window lasts at least this long: more steps than --num-steps if needed "
                   "(the sweep's budget.min_window_s; 10 is its GPU default)")
    p.add_argument("--max-window-s", type=float, default=0.0,
                   help="the measured window ends once it lasts this long, before --num-steps if need be (never "
                   "fewer than 3 sub-windows; the sweep's budget.max_window_s; 0: off)")
    p.add_argument("--max-warmup-s", type=float, default=0.0,
                   help="warm-up ends once its timed steps (after step 0) last this long (never fewer than 2 steps; "
                   "the sweep's budget.max_warmup_s; 0: off)")
    p.add_argument("--telemetry-period-s", type=float, default=1.0, help="0 turns the NVML/psutil sampler off")
    p.add_argument("--threads-per-worker", type=int, default=1)
    p.add_argument("--report-interval-s", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=".cache/datasets")
    p.add_argument("--metrics-path", default=None, help="append JSON lines here instead of stdout")
    p.add_argument("--loader-timeout-s", type=float, default=120.0, help="longest wait for one batch (0: forever)")
    p.add_argument("--collective-timeout-s", type=float, default=600.0, help="process-group timeout (hung peer)")
    p.add_argument("--checkpoint-every-steps", type=int, default=0, help="save a checkpoint every N measured steps")
    p.add_argument("--num-items", type=int, default=0, help="equal-data budget in the workload's unit, all ranks, "
                   "warm-up included (replaces --num-steps; 0: off)")
    p.add_argument("--eval-every-steps", type=int, default=0, help="evaluate every N optimizer steps (0: at the end)")
    p.add_argument("--target", default=None, help="stop when an evaluation meets it, e.g. 'loss/val<=3.2' or "
                   "'eval/accuracy>=0.9' (needs --eval-every-steps)")
    p.add_argument("--no-grad-noise-scale", dest="grad_noise_scale", action="store_false",
                   help="do not measure stats/grad_noise_scale")
    p.add_argument("--trace-steps", type=int, default=0, help="profile the last N warm-up steps on every rank and "
                   "report where their time went (trace/*; needs --num-warmup-steps >= N + 2)")
    p.add_argument("--trace-dir", default=None, help="keep each rank's gzipped trace here (with --trace-steps)")
    p.add_argument("--usd-per-hour", type=float, default=0.0, help="what this run's devices cost per hour: adds "
                   "cost/usd_per_hour and cost/usd_per_1m_<unit> to every report")
    p.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="keep the latest checkpoint here and resume from it on (re)start (torchrun --max-restarts)")
    a = p.parse_args(argv)
    if a.checkpoint_every_steps and a.checkpoint_dir is None:
        p.error("--checkpoint-every-steps needs --checkpoint-dir (where the latest checkpoint is kept)")
    target: dict[str, Any] = {}
    if a.target is not None:
        for op, key in (("<=", "target_max"), (">=", "target_min")):
            if op in a.target:
                name, value = a.target.split(op, 1)
                target = {"target_metric": name.strip(), key: float(value)}
        if not target:
            p.error("--target: write METRIC<=VALUE or METRIC>=VALUE, e.g. 'loss/val<=3.2'")
    return a.checkpoint_dir, TrialConfig(
        **{k: getattr(a, k) for k, (_, _, declared) in KNOBS.items() if declared.flag},
        workload=a.workload, workload_params=json.loads(a.params), num_steps=a.num_steps,
        num_warmup_steps=a.num_warmup_steps, telemetry_period_s=a.telemetry_period_s,
        use_gpu=torch.cuda.is_available(), threads_per_worker=a.threads_per_worker,
        report_interval_s=a.report_interval_s, seed=a.seed, data_dir=a.data_dir, metrics_path=a.metrics_path,
        loader_timeout_s=a.loader_timeout_s, collective_timeout_s=a.collective_timeout_s,
        checkpoint_every_steps=a.checkpoint_every_steps, num_items=a.num_items, eval_every_steps=a.eval_every_steps,
        min_window_s=a.min_window_s,
        max_window_s=a.max_window_s,
        max_warmup_s=a.max_warmup_s,
        grad_noise_scale=a.grad_noise_scale, trace_steps=a.trace_steps, trace_dir=a.trace_dir,
        usd_per_hour=a.usd_per_hour, **target,
    )


def _attempt_store(world: int, timeout: timedelta) -> dict[str, Any]:
    """Under torchrun, a store whose keys are this restart's own. torchrun's agent store outlives a
    restart, and gloo, reading a peer's address from it, can find the dead previous worker's and fail
    with "connectFullMesh ... Connection refused" (seen with --max-restarts on torch 2.13)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return {"store": dist.PrefixStore(f"/sweeps/attempt_{attempt}", store), "rank": int(os.environ["RANK"]),
            "world_size": world}


def main(argv: list[str] | None = None) -> int:
    checkpoints, cfg = _parse(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cfg.use_gpu:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world > 1:
        timeout = timedelta(seconds=cfg.collective_timeout_s)
        dist.init_process_group("nccl" if cfg.use_gpu else "gloo", timeout=timeout, **_attempt_store(world, timeout))
    try:
        rank = dist.get_rank() if world > 1 else 0
        if checkpoints is None:
            reporter, resume = JsonlReporter(cfg.metrics_path, rank), None
        else:  # a restarted group continues from the checkpoint the crashed one kept
            reporter = DirCheckpointReporter(cfg.metrics_path, rank, checkpoints)
            resume = str(checkpoints) if (checkpoints / CHECKPOINT_FILE).exists() else None
        with naming_workdir("where torchrun started"):  # a missing file's error says where relative paths resolved
            train(cfg, reporter, device, resume_from=resume)
        if world > 1:
            dist.barrier()  # no rank tears the group down while a peer is still in a collective
        if checkpoints is not None and rank == 0:  # finished: the next start is a new run
            (checkpoints / CHECKPOINT_FILE).unlink(missing_ok=True)
    finally:
        if world > 1:
            dist.destroy_process_group()
    return 0


def _leave(code: int) -> None:
    """End a finished run without finalizing the interpreter. Once DDP has used a gloo group, the group
    outlives `destroy_process_group` (torch 2.13 keeps it referenced from C++), and so do its worker
    threads: one that drops the last reference to a collective's Python-owned tensor while the
    interpreter finalizes cannot take the GIL and ends the process by std::terminate (SIGABRT after
    the final report was written: 4 in 14 two-rank runs beside two busy processes on a 2-core machine). A run
    that failed leaves the same way, after its traceback, with exit status 1 (torchrun then names the rank and
    its status, not a SIGABRT). Nothing is left to run here; what was written is flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run() -> int:
    """`main`'s exit status, every way it can end (each then leaves by `_leave`)."""
    try:
        return main()
    except SystemExit as exc:  # argparse's usage error, or a workload's sys.exit()
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except Exception:  # noqa: BLE001 - said in full, then the process leaves as a finished one does
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    _leave(_run())
