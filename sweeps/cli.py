"""`sweeps` command line: validate a spec, run a sweep."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import tempfile
import time
import traceback
from typing import Any

from sweeps.exits import ExitCode, StorageProblem, SweepsError
from sweeps.spec import SpecError, load_spec


def _validate(args: argparse.Namespace) -> int:
    spec, _ = load_spec(args.spec)
    fits = ""
    if args.cpus is not None or args.gpus is not None or args.here:
        from sweeps.service.resources import refuse_if_never_fits, refuse_missing_types, this_machine, this_node

        have = this_machine() if args.here else {}
        have.update({k: float(v) for k, v in (("CPU", args.cpus), ("GPU", args.gpus)) if v is not None})
        refuse_if_never_fits(spec, have)
        if args.here:  # the accelerator types its trials are pinned to must be this machine's
            refuse_missing_types(spec, [this_node()])
        fits = f"; its largest trial fits {have.get('CPU', 0):g} CPUs and {have.get('GPU', 0):g} GPUs"
        if args.here:
            from sweeps.service.shared_storage import storage_here

            fits += storage_here(spec.storage_path)
    searched = ", ".join(spec.space.searched()) or "nothing"
    print(f"{args.spec}: OK — sweep {spec.name!r}, {spec.budget.num_trials} trials of {spec.trainable.name}, searching {searched}{fits}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from sweeps.service.runner import run_sweep
    from sweeps.service.saved_state import load_for_resume, resume_command
    from trainables.storage import StorageError

    try:
        spec, text = load_for_resume(args.storage_path, args.name) if args.command == "resume" else load_spec(args.spec)
    except StorageError as exc:  # a storage_path URI: one line naming it (and the credentials variables)
        raise StorageProblem(str(exc)) from None
    try:
        outcome = run_sweep(spec, text, restart=getattr(args, "restart", False))
    except StorageError as exc:  # a storage_path URI: one line naming it (and the credentials variables)
        raise StorageProblem(str(exc)) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"error: the disk is full ({exc.strerror}: {exc.filename or 'writing the sweep state'}). Free space "
              f"there (old sweeps under {spec.storage_path}, Ray's logs under /tmp/ray), then: {resume_command(spec)}",
              file=sys.stderr)
        return ExitCode.RESUMABLE
    if outcome.from_store:  # it had already ended: its answer as `sweeps report` prints it
        _print_outcome(outcome, f"\nSweep {spec.name} (parent run {outcome.parent_run_id})")
    else:
        ended = "stopped before its end after" if outcome.interrupted else "finished in"
        _print_outcome(outcome, f"\nSweep {spec.name} {ended} {outcome.elapsed_s:.0f}s")
    if outcome.interrupted:
        return ExitCode.RESUMABLE
    return ExitCode.OK if outcome.best is not None else ExitCode.NO_TRIAL_FINISHED


def _print_outcome(outcome: Any, title: str) -> None:
    from sweeps.results.memory_trade import memory_sentence
    from sweeps.results.money import money_sentence
    from sweeps.results.payback import payback_sentence
    from sweeps.results.report import (
        best_fragment,
        compared_run_ids,
        configuration,
        next_steps,
        pareto_table,
        trials_table,
    )
    from sweeps.service.saved_state import resume_command
    from sweeps.tracking import experiment_of, ui_links

    spec = outcome.spec
    print(f"{title}: {len(outcome.ranked())}/{len(outcome.trials)} trials ok (objective: {spec.objective.describe()})\n")
    print(trials_table(outcome))
    if outcome.stopped_reason:
        print(f"\nSTOPPED EARLY: {outcome.stopped_reason}; {spec.budget.num_trials - len(outcome.trials)} trials not run")
    if outcome.exhausted:
        left = spec.budget.num_trials - len(outcome.trials)
        print(f"\nSPACE EXHAUSTED: {outcome.exhausted}" + (f"; {left} of the budget's trials not run" if left else "")
              + ("" if spec.search.when_exhausted == "replicate" or not left else
                 " (search.when_exhausted: replicate spends them on the close calls)"))
    if outcome.interrupted:
        print(f"\nNOT FINISHED: {outcome.interrupted}. Finished trials are kept; continue with: {resume_command(spec)}")
    if spec.objective.multi:
        print("\n" + pareto_table(outcome))
    print(f"\nBest configuration{' by ' + spec.objective.primary if spec.objective.multi else ''}:\n" + best_fragment(outcome))
    if outcome.best is not None:
        print("\nNext: " + next_steps(outcome))
    money = money_sentence(outcome, lambda t: configuration(outcome, t), md=False)
    if money:
        print("\nIn money: " + money)
    memory = memory_sentence(outcome, lambda t: configuration(outcome, t))
    if memory:
        print("\n" + memory)
    compiled = payback_sentence(outcome)
    if compiled:
        print("\n" + compiled)
    uri, parent = outcome.tracking_uri, outcome.parent_run_id
    print("\n" + "\n".join(ui_links(uri, experiment_of(uri, parent), parent, compared_run_ids(outcome))))
    if outcome.best is None:  # last: a job's status shows the log's last line alone, and it says the first failure
        print("\nNext: " + next_steps(outcome))


def _report(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from sweeps.exits import InputError
    from sweeps.results.report import load_outcome, to_json
    from sweeps.store import open_store

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one small spec.yaml: no bar on stderr
    client = open_store(args.tracking_uri, create=False)  # reading: never creates a store
    try:
        outcome = load_outcome(client, args.sweep)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if args.out:
        from sweeps.results.plots import publish

        publish(outcome, client, Path(args.out), log=False)
    if args.format == "json":
        print(json.dumps(to_json(outcome), indent=2, default=str))
        return 0
    _print_outcome(outcome, f"Sweep {outcome.spec.name} (parent run {outcome.parent_run_id})")
    if args.out:
        print(f"\nFigures, summary.html and pareto.csv/json written to {args.out}")
    return 0


def _cluster_check(args: argparse.Namespace) -> int:
    from sweeps.ops.clustercheck import check_file

    failed = 0
    for path in args.files:
        findings = check_file(path)
        failed += bool(findings)
        print(f"{path}: " + ("OK" if not findings else f"{len(findings)} finding(s)"))
        for f in findings:
            print(f"  {f}")
    return 1 if failed else 0


def _doctor(args: argparse.Namespace) -> int:
    from sweeps.ops.doctor import Ask, doctor

    flags = [f for f, on in (("--quick", args.quick), ("--gpu-checks", args.gpu_checks), ("--no-mlflow", args.no_mlflow)) if on]
    flags += [f"--address {args.address}"] if args.address else []
    return doctor(Ask(args.quick, args.gpu_checks, args.address, args.json,
                      None if args.no_mlflow else args.tracking_uri, args.storage_path,
                      " ".join(["sweeps doctor", *flags])))


# wait-head's no-op job: the name it keeps in `ray job list` (deleting it right after it ends races Ray's
# own bookkeeping, which then records the deleted job again as FAILED)
_PROBE_JOB = "sweeps-wait-head-"


def wait_for_head(address: str, timeout_s: float, poll_s: float = 1.0) -> tuple[float, str]:
    """Wait until the Ray head at `address` runs a job, and return (seconds it took, the job's id).

    A no-op job is submitted through Ray's public `JobSubmissionClient`, so the head's job agent must answer,
    not only its dashboard. Then waits (within `timeout_s`, at least 5 s) for the job to end: a `RuntimeError` if it
    failed. `TimeoutError` says what the head last answered; an `AuthenticationError` is raised at once."""
    import time
    import uuid

    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobStatus, JobSubmissionClient

    t0 = time.monotonic()
    while True:
        try:
            client = JobSubmissionClient(address)
            job = client.submit_job(entrypoint="true", submission_id=_PROBE_JOB + uuid.uuid4().hex[:8],
                                    entrypoint_num_cpus=0)
            break
        except AuthenticationError:
            raise
        except Exception as exc:  # noqa: BLE001 - not up yet (no dashboard, no job agent): the next try tells
            last = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        left = timeout_s - (time.monotonic() - t0)
        if left <= 0:
            raise TimeoutError(f"the Ray head at {address} did not accept a job within {timeout_s:g}s (last try: "
                               f"{last}); is it up, and is this its dashboard address?")
        time.sleep(min(poll_s, left))
    waited = time.monotonic() - t0
    end = max(t0 + timeout_s, time.monotonic() + 5.0)
    while not client.get_job_status(job).is_terminal() and time.monotonic() < end:
        time.sleep(0.5)
    info = client.get_job_info(job)
    if info.status == JobStatus.FAILED:
        raise RuntimeError(f"the Ray head at {address} accepted a job, but the job failed: {info.message}")
    return waited, job


def _wait_head(args: argparse.Namespace) -> int:
    from ray.exceptions import AuthenticationError

    try:
        waited, job = wait_for_head(args.address, args.timeout_s)
    except AuthenticationError as exc:
        print(f"error: the Ray head at {args.address} refused this client: {exc}", file=sys.stderr)
        return 2
    except (TimeoutError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"the Ray head at {args.address} accepts jobs (after {waited:.0f}s; no-op job {job})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (the documentation's CLI page is generated from it)."""
    parser = argparse.ArgumentParser(prog="sweeps", description="Find the fastest correct way to train a model.")
    parser.add_argument("--debug", action="store_true", help="print the traceback of a failure (otherwise one line "
                        "says the cause and the fix)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check a sweep spec (needs neither Ray nor a GPU)")
    p.add_argument("spec", help="the sweep spec, a YAML file (the spec reference lists its keys)")
    p.add_argument("--here", action="store_true", help="also check that its largest trial fits this machine "
                   "(its CPUs and NVIDIA GPUs), as a local `sweeps run` would, and its storage_path: a URI written "
                   "to from here; a local folder, on the Ray cluster a run here would join, seen by every node")
    p.add_argument("--cpus", type=float, default=None, help="also check that its largest trial fits a cluster "
                   "of this many CPUs (with --gpus)")
    p.add_argument("--gpus", type=float, default=None, help="... and this many GPUs (default 0)")
    p.set_defaults(func=_validate)
    p = sub.add_parser("run", help="run a sweep on the Ray cluster ray.init() finds, or a local one")
    p.add_argument("spec", help="the sweep spec, a YAML file")
    p.add_argument("--restart", action="store_true",
                   help="start afresh even if this sweep already ran: its Ray Tune folder is moved aside "
                        "(by default a sweep of the same name and spec is resumed, and one that already ended "
                        "prints its stored answer)")
    p.set_defaults(func=_run)
    p = sub.add_parser("resume", help="continue an interrupted sweep: finished trials and MLflow runs are kept (a "
                                      "sweep that already ended runs nothing and prints its stored answer)")
    p.add_argument("name", help="the sweep's name (a folder under the storage path)")
    p.add_argument("--storage-path", default="ray_results", help="the spec's storage_path (default: ray_results)")
    p.set_defaults(func=_run)
    p = sub.add_parser("report", help="a finished (or running) sweep's trials, best config, verdicts, figures")
    p.add_argument("sweep", help="sweep name (latest parent run of that name) or parent run id")
    p.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"),
                   help="the MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--out", help="also write the figures and summary.html into this folder")
    p.set_defaults(func=_report)
    p = sub.add_parser("cluster-check", help="validate Ray cluster-launcher YAMLs and KubeRay manifests offline "
                                             "and flag exposures")
    p.add_argument("files", nargs="+", help="cluster/*.yaml (ray up) or cluster/kubernetes/*.yaml (kubectl apply)")
    p.set_defaults(func=_cluster_check)
    p = sub.add_parser("doctor", help="measure what this machine (or each cluster node) can do; --gpu-checks: every GPU path")
    p.add_argument("--quick", action="store_true", help="about 20 s per node instead of about 2 min")
    p.add_argument("--gpu-checks", action="store_true",
                   help="also run every GPU path the service uses (DDP, fp16/bf16/tf32, compile, NVML, OOM, MFU) and "
                        "write the evidence file next to --json (on a CPU node: the CPU subset)")
    p.add_argument("--address", default=None, help="a Ray cluster (or 'auto' inside ray job submit): one check per node")
    p.add_argument("--json", default="doctor.json", help="write the report here (default: doctor.json)")
    p.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"),
                   help="the MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    p.add_argument("--storage-path", default="ray_results", help="where sweeps keep their state: its free disk is checked (a URI: that each node can write there)")
    p.add_argument("--no-mlflow", action="store_true", help="do not log the figures to MLflow")
    p.set_defaults(func=_doctor)
    p = sub.add_parser("wait-head", help="wait until a Ray head accepts jobs (run it between `ray start --head` "
                                         "and `ray job submit`); exit 1 when it did not in time, 2 when it refused "
                                         "this client (token auth)")
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265"),
                   help="the head's dashboard, as for `ray job submit` (default: $RAY_ADDRESS, else http://127.0.0.1:8265)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="give up after this long (default: 60)")
    p.set_defaults(func=_wait_head)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(_guarded(args))


def _guarded(args: argparse.Namespace) -> int:
    """Run the command; every failure ends in one line on stderr and its exit code (`sweeps.exits`)."""
    from sweeps.service.connect import sigterm_as_sigint

    try:
        with sigterm_as_sigint():  # a scheduler's SIGTERM is a Ctrl+C
            return int(args.func(args))
    except SweepsError as exc:
        if args.debug:
            traceback.print_exc()
        print(exc if isinstance(exc, SpecError) else f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `sweeps report X | head`: the reader went away, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK
    except KeyboardInterrupt:
        if args.debug:
            traceback.print_exc()
        print("stopped by a signal; what had finished is kept: run the same command again to continue (a sweep "
              "resumes where it stopped)", file=sys.stderr)
        return ExitCode.RESUMABLE
    except Exception as exc:  # noqa: BLE001 - a bug: one line here, the whole traceback in a file
        if args.debug:
            raise
        print(f"error: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''} "
              f"(an unexpected error; {_traceback_file()}; `sweeps --debug ...` prints it)", file=sys.stderr)
        return ExitCode.INTERNAL


def _traceback_file() -> str:
    """Write the current exception's traceback to a log file; says where (or that it could not)."""
    text = traceback.format_exc()
    for folder in (tempfile.gettempdir(), os.getcwd()):
        path = os.path.join(folder, f"sweeps-error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            continue
        return f"its traceback is in {path}"
    return "its traceback could not be written anywhere"
