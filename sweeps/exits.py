"""How a `sweeps` command ends: one exit code per kind of outcome, and the errors that carry one.

Every failure a user can act on raises one of the classes below; the CLI prints its message as one
line (the cause and the fix) and exits with its class's code. A traceback is printed only with
`sweeps --debug`; otherwise it goes to a log file whose path the line names. `EXIT_CODES` is the
reference the documentation is generated from.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar


class ExitCode(IntEnum):
    OK = 0
    NO_TRIAL_FINISHED = 1
    BAD_INPUT = 2
    STORE_UNUSABLE = 3
    RESUMABLE = 4
    ENVIRONMENT = 5
    INTERNAL = 6


EXIT_CODES: dict[ExitCode, str] = {
    ExitCode.OK: "`run`/`resume`: a best configuration was found. Other commands: they did what they say.",
    ExitCode.NO_TRIAL_FINISHED: "`run`/`resume`: the sweep ended and no trial finished (each trial's reason is in "
                                "the table). `cluster-check`: a file has findings. `doctor`: a check failed. "
                                "`wait-head`: the head did not accept a job in time.",
    ExitCode.BAD_INPUT: "Bad input, nothing run: a spec that does not validate, a name that clashes with another "
                        "sweep, a sweep that is already running (its lock is held), an unknown sweep name.",
    ExitCode.STORE_UNUSABLE: "The MLflow store cannot be used: a server that does not answer or refuses the login "
                             "(the line says which of `MLFLOW_TRACKING_USERNAME`/`PASSWORD`/`TOKEN` are set), a "
                             "sqlite file that is not a database, is corrupt, half-created or read-only, a folder that "
                             "cannot be written, an unsupported `file://` store, a database such as `postgresql://` "
                             "without a server in front of it, a missing database driver, a schema that needs "
                             "`mlflow db upgrade`, no store where a read was asked.",
    ExitCode.RESUMABLE: "The sweep stopped before its end and can be resumed (`sweeps resume NAME`): Ctrl+C, "
                        "SIGTERM (`timeout`, systemd, SLURM, Kubernetes), a full disk, a wait for resources longer than "
                        "`budget.max_queue_s`.",
    ExitCode.ENVIRONMENT: "The machine or cluster is not usable: Ray cannot start or a Ray address does not answer, "
                          "a read-only HOME, an unusable TMPDIR, a `storage_path` some node cannot see, a "
                          "`storage_path` URI that cannot be reached or written (or whose credentials are not set).",
    ExitCode.INTERNAL: "An unexpected error (a bug): the line names the log file that holds its traceback.",
}


class SweepsError(Exception):
    """A failure the user can act on; its message says the cause and the fix in one line."""

    exit_code: ClassVar[ExitCode] = ExitCode.INTERNAL


class InputError(SweepsError, ValueError):
    """Bad input: the spec, the sweep's name, or a sweep that another process is running."""

    exit_code = ExitCode.BAD_INPUT


class StoreUnusable(SweepsError, ValueError):
    """The MLflow tracking store cannot be used as asked."""

    exit_code = ExitCode.STORE_UNUSABLE


class EnvironmentProblem(SweepsError, RuntimeError):
    """The machine or the cluster cannot run the command (Ray, HOME, TMPDIR, storage_path)."""

    exit_code = ExitCode.ENVIRONMENT


class StorageProblem(EnvironmentProblem):
    """`storage_path` cannot be used.

    A URI that cannot be opened, reached or written, or whose credentials are not set
    (`trainables.storage.StorageError`, whose one line names the URI and the variables)."""
