"""Run the shared loop without Ray, e.g. on a GPU machine: ``torchrun --nproc-per-node N -m trainables.launch ...``.

Prints one JSON line per report (rank 0). This is also the baseline for benchmarks.

Crash recovery without Ray: with ``--checkpoint-every-steps N --checkpoint-dir DIR``, rank 0 keeps
the latest checkpoint in DIR (one file, replaced atomically; a sharded model: its DCP shard files beside it, each
rank copying its own) and every start resumes from it, so
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
from trainables.knobs import DECLARED, REQUIRED, SAME
from trainables.loop import train
from trainables.reporting import JsonlReporter, keep_checkpoint
from trainables.train_functions import naming_workdir


class DirCheckpointReporter(JsonlReporter):
    """JSON lines, and each checkpoint the loop hands over copied into `directory` (latest only)."""

    def __init__(self, path: str | None, rank: int, directory: Path) -> None:
        super().__init__(path, rank)
        self.directory = directory

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        if checkpoint_dir is not None:  # rank 0; a sharded model: every rank, its own shard files
            keep_checkpoint(checkpoint_dir, self.directory)
        super().report(metrics, checkpoint_dir)


def add_flags(p: argparse.ArgumentParser) -> None:
    """Add a flag per setting of the trial's config to `p`, from its one declaration (`trainables.knobs`).

    A value takes a flag such as `--batch-size 32`; a switch that is off by default `--pin-memory`, one that is
    on `--no-persistent-workers`; a mapping as JSON. Those declared `flag=False` the launcher sets itself, or a
    flag of its own does (`--target`)."""
    for name, (kind, default, declared) in DECLARED.items():
        if not declared.flag:
            continue
        flag = "--" + (declared.flag if isinstance(declared.flag, str) else name).replace("_", "-")
        if kind is bool:
            action = "store_false" if default else "store_true"
            said = " (on unless this flag turns it off)" if default else ""
            p.add_argument(flag if not default else "--no-" + flag[2:], dest=name, action=action,
                           help=declared.help + said)
            continue
        value = declared.torchrun_default(default)
        said = "" if declared.sweep is SAME else f" (default here {value!r}; a sweep's {declared.sweep!r})"
        p.add_argument(flag, dest=name, type=json.loads if kind is dict else kind, default=value,
                       required=value is REQUIRED, choices=declared.choices, help=declared.help + said)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainables.launch", description=__doc__)
    add_flags(p)
    p.add_argument("--target", default=None, help="stop when an evaluation meets it, e.g. 'loss/val<=3.2' or "
                   "'eval/accuracy>=0.9' (needs --eval-every-steps)")
    p.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="keep the latest checkpoint here and resume from it on (re)start (torchrun --max-restarts)")
    return p


def _parse(argv: list[str] | None) -> tuple[Path | None, TrialConfig]:
    p = build_parser()
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
    flagged = {name: getattr(a, name) for name, (_, _, declared) in DECLARED.items() if declared.flag}
    return a.checkpoint_dir, TrialConfig(**flagged, use_gpu=torch.cuda.is_available(), **target)


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


def leave(code: int) -> None:
    """End a finished run without finalizing the interpreter.

    Once DDP has used a gloo group, the group outlives `destroy_process_group` (torch 2.13 keeps it referenced
    from C++), and so do its worker threads: one that drops the last reference to a collective's Python-owned
    tensor while the interpreter finalizes cannot take the GIL and ends the process by std::terminate (SIGABRT
    after the final report was written: 4 in 14 two-rank runs beside two busy processes on a 2-core machine).
    A run that failed leaves the same way, after its traceback, with exit status 1 (torchrun then names the
    rank and its status, not a SIGABRT). Nothing is left to run here; what was written is flushed first. The test
    helpers that run ranks under torchrun or spawn leave by it too."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run() -> int:
    """`main`'s exit status, every way it can end (each then leaves by `leave`)."""
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
    leave(_run())
