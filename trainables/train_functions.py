"""Ray Train's train functions for a trial: `pool_worker` for a warm group, `cold_worker` for a trial alone.

A warm worker group is one long-lived Ray Train run whose ranks serve trial after trial.
Rank 0 takes the next trial from the sweep's queue (a Ray actor the Tune trials feed) and
broadcasts it; every rank resets what a previous trial could leak, builds the workload afresh
and runs the shared loop unchanged, reporting to the queue instead of `ray.train.report`. After
each trial the ranks tell the queue how it ended; the queue decides whether the group may serve
again (every rank finished, or every rank failed cleanly: a config error, an unsupported
precision, divergence, out of memory) or must retire (a rank crashed, hung, or failed alone while
its peers wait in a collective). A retiring group raises out of the train function: Ray Train
tears every rank down and the sweep's supervisor starts a fresh group.

Every rank works in the directory the sweep's driver runs in (`enter_workdir`): the one `sweeps
run` started in, or inside `ray job submit` the job's working directory, as under torchrun,
Lightning or Accelerate; Ray Train alone would move each rank into its own run folder. A file the
trial does not find fails it as a `WorkloadError` that says where relative paths resolved.

Imports Ray core and Ray Train lazily, never Ray Tune.
"""

from __future__ import annotations

import contextlib
import fnmatch
import gc
import importlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from trainables.contract import POOL_CLOSED as CLOSED
from trainables.contract import POOL_RESIZE as RESIZE
from trainables.contract import TRIAL_IN_GROUP, TrialConfig
from trainables.loop_errors import DivergedError, UnsupportedError, WorkloadError
from trainables.reporting import keep_checkpoint

logger = logging.getLogger(__name__)

# Failures that leave every process healthy when *every* rank raised one (nothing is stuck in a
# collective): the group cleans up and serves the next trial.
_CLEAN = (WorkloadError, UnsupportedError, DivergedError, torch.OutOfMemoryError, MemoryError)


class TrialCancelled(Exception):
    """The trial's driver went away (Tune stopped it: ASHA, the breaker, the time budget)."""


class RetireGroup(RuntimeError):
    """This group must not serve another trial; Ray Train tears it down, a fresh one follows."""


# The key of a train function's config that holds the driver's working directory.
WORKDIR = "workdir"
# The key of a warm group's config that says its trials load torch's compiler stack (a trace's profiler, compile).
COMPILER = "loads_compiler"
_DRIVER_DIR = "where `sweeps run` started; in a job: its working directory"


def enter_workdir(workdir: str | None) -> str:
    """Make `workdir` (the sweep driver's working directory) this process's, if it is on this node.

    Else Ray's run folder stays, with a warning. Returns what relative paths resolve against, in words."""
    if workdir is None:
        return "Ray's run folder"
    if os.path.isdir(workdir):
        os.chdir(workdir)
        return _DRIVER_DIR
    logger.warning("%s, the directory the sweep's driver runs in, is not on this node: relative paths resolve "
                   "against Ray's run folder %s", workdir, os.getcwd())
    return f"Ray's run folder: {workdir}, where `sweeps run` started, is not on this node"


def missing_file(exc: FileNotFoundError, origin: str) -> WorkloadError:
    """Build a `WorkloadError` (kind `config`) naming the missing file and where relative paths resolve.

    The directory relative paths resolve against is named. A DataLoader worker's error arrives re-raised with its
    traceback as text: its last line says it."""
    if exc.filename is not None:
        what = f"{exc.strerror or 'No such file or directory'}: {exc.filename!r}"
    else:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        what = lines[-1] if lines else "FileNotFoundError"
    where = f"relative paths resolve against {os.getcwd()} ({origin})"
    ignored = _ignored_hint(exc.filename)  # the likely cause, and every way out, first: a progress line shortens
    error = WorkloadError(f"{exc.filename!r} is missing: {ignored} ({what}; {where})" if ignored else
                          f"{what} — {where}; give paths from there, or absolute ones on storage every node mounts")
    stopped = getattr(exc, "sweeps_where", None)  # where the loop stopped: the warm group compares it across ranks
    if stopped is not None:
        error.sweeps_where = stopped  # type: ignore[attr-defined]
    return error


def _ignored_hint(filename: str | None) -> str:
    """Where the missing path's first folder is listed in the working directory's .gitignore: `ray job submit
    --working-dir` leaves out of its upload what .gitignore lists, the likely cause; else ""."""
    if not filename:
        return ""
    path = os.path.relpath(os.path.abspath(filename))
    top = path.split(os.sep, 1)[0]
    if top in ("", ".", "..") or not os.path.isfile(".gitignore"):
        return ""
    with open(".gitignore", errors="replace") as f:
        patterns = [p.strip().strip("/") for p in f if p.strip() and not p.lstrip().startswith(("#", "!"))]
    if not any(fnmatch.fnmatch(top, p) or fnmatch.fnmatch(path, p) for p in patterns if p):
        return ""
    return (f"`ray job submit` skips {top} (in .gitignore). Fix: remove it from .gitignore, set "
            "RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1 when submitting, or use an absolute path on shared storage")


@contextlib.contextmanager
def naming_workdir(origin: str) -> Iterator[None]:
    """Turn a FileNotFoundError out of the trial into `missing_file`'s error.

    The error may come from the user's build, dataset or loader workers. `missing_file`'s error says where
    relative paths resolved (`origin`: what that is)."""
    try:
        yield
    except FileNotFoundError as exc:
        raise missing_file(exc, origin) from exc


def clean_failure(exc: BaseException | None) -> bool:
    return exc is None or isinstance(exc, (*_CLEAN, TrialCancelled))


def reset_between_trials(device: torch.device) -> None:
    """Clear what one trial could leave for the next in a warm group's process.

    Compiled graphs and their caches, cached device memory and its peak statistics, garbage holding the old
    model. Seeds, TF32/matmul flags, thread counts, loader workers, the sampler thread and the model's hooks are
    set up (or torn down) by the loop itself for every trial."""
    gc.collect()
    if "torch._dynamo" in sys.modules:  # else nothing was compiled here: importing it would cost ~1.6 s of a core
        torch.compiler.reset()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


class QueueReporter:
    """Sends rank 0's reports to the trial's driver through the queue.

    Every rank learns at each report whether the driver cancelled the trial (so all of them stop at the same
    step)."""

    def __init__(self, queue: Any, trial_id: str, rank: int, world: int, checkpoint_dir: str) -> None:
        """`checkpoint_dir`: where rank 0 keeps the trial's checkpoint, a path or a URI (`keep_checkpoint`)."""
        self.queue, self.trial_id, self.rank, self.world = queue, trial_id, rank, world
        self.checkpoint_dir = checkpoint_dir

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        import ray

        cancelled = False
        # rank 0's checkpoint, and with a sharded model every rank's shards, each from its own node; the trial
        # hears of the checkpoint once every rank's files are there
        kept = keep_checkpoint(checkpoint_dir, self.checkpoint_dir) if checkpoint_dir is not None else None
        if self.world > 1:  # every rank reports together: one barrier, whether or not this report checkpoints
            dist.barrier()
        if self.rank == 0:
            event: dict[str, Any] = {"metrics": dict(metrics)}
            if kept is not None:
                event["checkpoint"] = kept
            cancelled = bool(ray.get(self.queue.post.remote(self.trial_id, event)))
        if self.world > 1:
            flag = [cancelled]
            dist.broadcast_object_list(flag, src=0)
            cancelled = bool(flag[0])
        if cancelled:
            raise TrialCancelled(f"trial {self.trial_id} was stopped by the sweep")


def _next_item(take: Any, rank: int, world: int, device: torch.device) -> Any:
    """The next trial for a group of this shape (or CLOSED, or RESIZE), from `take` (rank 0 asks the queue).
    Every rank loops together, one short wait at a time: an idle group never sits in one collective for
    longer than the process-group timeout."""
    while True:
        item = take() if rank == 0 else None
        if world > 1:
            box = [item]
            dist.broadcast_object_list(box, src=0, device=device if device.type == "cuda" else None)
            item = box[0]
        if item is not None:
            return item


def cold_worker(config: dict[str, Any]) -> None:
    """Ray Train's train function for a trial in a Train run of its own (`scaling.reuse_workers: false`).

    It runs the shared loop (`trainables.ray_worker`) in the driver's working directory (`config`: the trial's
    config under "trial", the directory under `WORKDIR`)."""
    from trainables.ray_worker import train_worker

    origin = enter_workdir(config.get(WORKDIR))
    with naming_workdir(origin):
        train_worker(config["trial"])


def pool_worker(config: dict[str, Any]) -> None:
    """Ray Train's train function for a warm group.

    `config`: the queue handle, the slot, the group number, the driver's working directory."""
    import ray
    import ray.train
    import ray.train.torch

    from trainables.loop import train
    from trainables.ray_worker import quiet_ray_exit

    quiet_ray_exit()  # the group's placement group removed at its end: this rank's SIGTERM prints nothing
    queue, slot, group = config["queue"], int(config["slot"]), str(config["group"])
    origin = enter_workdir(config.get(WORKDIR))
    home = os.getcwd()
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    node = ray.get_runtime_context().get_node_id()
    if config.get(COMPILER):  # its trials will trace or compile: the group's start pays the import, not its first trial
        importlib.import_module("torch._dynamo")
    reset_between_trials(device)
    served = 0
    # the trials it serves: of its shape (its ranks, its accelerator type), asked one short poll at a time
    shape, poll_s = config.get("shape") or (world, ""), float(config.get("idle_poll_s", 2.0))

    def take() -> Any:
        return ray.get(queue.take.remote(slot, poll_s, tuple(shape)))

    while True:
        item = _next_item(take, rank, world, device)
        if item in (CLOSED, RESIZE):  # the sweep is over, or its waiting trials need another shape
            return
        trial_id, cfg_dict, resume_from, checkpoint_dir = item
        cfg = TrialConfig.from_dict(cfg_dict)
        served += 1
        reset_between_trials(device)
        reporter = QueueReporter(queue, trial_id, rank, world, checkpoint_dir)
        facts = {"device/ray_node_id": node, "pool/group": group, TRIAL_IN_GROUP: str(served)}
        error: BaseException | None = None
        try:
            with naming_workdir(origin):
                os.chdir(home)  # a trial that changed directory does not move the next one
                train(cfg, reporter, device, facts=facts, resume_from=resume_from)
        except BaseException as exc:  # noqa: BLE001 - every way a trial ends goes to the queue
            error = exc
        where = getattr(error, "sweeps_where", None) if error is not None else None
        keep = ray.get(queue.rank_done.remote(trial_id, rank, world, _portable(error), clean_failure(error),
                                              str(where)))
        failed = type(error).__name__ if error is not None else "finished"
        error = None  # the traceback holds the trial's model, optimizer and loaders: free them before the next
        if not keep:
            raise RetireGroup(f"trial {trial_id} left this group unhealthy (rank {rank}: {failed}); a fresh "
                              "group takes the next trial")
        logger.debug("rank %d: trial %s done in group %s (pid %d)", rank, trial_id, group, os.getpid())


def _portable(exc: BaseException | None) -> BaseException | None:
    """The exception as it can cross to the driver (some carry unpicklable state)."""
    if exc is None:
        return None
    import pickle

    try:
        pickle.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001 - keep the type name and message at least
        return RuntimeError(f"{type(exc).__name__}: {exc}")
