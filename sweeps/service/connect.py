"""Which Ray cluster a sweep runs on, said before it connects, and the signals a sweep answers.

`ray.init()` joins whatever cluster it finds: `RAY_ADDRESS`, else the address the last `ray start`
left in `<ray temp dir>/ray_current_cluster`, else it starts a new local instance. A head that died
leaves that file behind, and `ray.init()` then retries the dead address for minutes. So a sweep
resolves the address itself, says where it came from, and fails in seconds, in one line, when
nothing answers there. A new local instance gets a dashboard port of its own, which every process
of that instance is told (`RAY_API_SERVER_ADDRESS`): with two local instances on one machine, Ray
Train's placement-group cleaner otherwise looks for "the" cluster, finds two and dies.

SIGTERM -- what `timeout`, systemd, SLURM and Kubernetes send -- is handled as Ctrl+C: Tune stops
gracefully and keeps its state, the sweep exits "stopped, resumable"; a second signal stops at once.
Ray's own handler for it (installed by `ray.init`) aborts the process, so the sweep installs its
own after connecting.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from sweeps.exits import EnvironmentProblem

logger = logging.getLogger(__name__)

_ANSWER_S = 3.0  # a live GCS accepts a TCP connection at once


def ray_address_file() -> str:
    """Return where `ray start` leaves the address of the cluster it started (Ray's default temp dir).

    Ray has no public name for it: a private access, pinned in tests/service/test_ray_private.py."""
    from ray._common.utils import get_ray_address_file

    return str(get_ray_address_file(None))


def ray_address() -> tuple[str | None, str]:
    """(the address `ray.init()` would join, where it came from); None: it would start a local instance."""
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env:
        return (None, "RAY_ADDRESS=local") if env == "local" else (env, "RAY_ADDRESS")
    path = ray_address_file()
    try:
        with open(path) as f:
            found = f.read().strip()
    except OSError:
        return None, "no running cluster found"
    return (found or None), f"{path}, left by `ray start`"


def answers(address: str, timeout_s: float = _ANSWER_S) -> bool:
    """Tell whether anything accepts a connection at a `host:port` Ray address.

    A `ray://` or `http(s)://` one is taken as given: its own client says what is wrong."""
    if "://" in address:
        return True
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except (OSError, ValueError):
        return False
    return True


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def connect_ray(runtime_env: Callable[[dict[str, str]], dict[str, Any] | None],
                echo: Callable[[str], None]) -> bool:
    """Connect this process to its Ray cluster unless it is connected.

    Returns True when it started (and must stop) a local instance. `runtime_env(extra_env)`: the runtime env of a
    new local instance, with `extra_env` among its variables. Every failure is an `EnvironmentProblem`."""
    import ray

    if ray.is_initialized():
        return False
    address, source = ray_address()
    if address is not None:
        if not answers(address):
            fix = ("start that head again, or point RAY_ADDRESS at a live one" if source == "RAY_ADDRESS" else
                   f"start it again (ray start --head), remove the stale file {ray_address_file()}, or run on a new "
                   "local instance: RAY_ADDRESS=local")
            raise EnvironmentProblem(f"the Ray cluster at {address} ({source}) does not answer; {fix}")
        if not os.environ.get("RAY_JOB_ID"):  # a job runs where it was submitted: nothing to say
            echo(f"joining the Ray cluster at {address} ({source}); RAY_ADDRESS=local runs on a new local instance")
        _init(lambda: ray.init(address=address))
        return False
    port = _free_port()
    _init(lambda: ray.init(runtime_env=runtime_env({"RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{port}"}),
                           dashboard_port=port, dashboard_host="127.0.0.1"))
    return True


def _init(start: Callable[[], Any]) -> None:
    """Run `ray.init`, turning what the machine refuses into an `EnvironmentProblem`."""
    from ray.exceptions import AuthenticationError

    try:
        start()
    except AuthenticationError as exc:  # Ray's own words run to several sentences and a link: its first, and the fix
        said = str(exc).split(". ")[0].strip() or type(exc).__name__
        named = os.environ.get("RAY_AUTH_TOKEN_PATH")
        fix = (f"put the cluster's token in {named} (`ray get-auth-token` prints it on the head), or unset "
               "RAY_AUTH_TOKEN_PATH to run on a new local instance, which makes its own token in ~/.ray/auth_token"
               if named else "set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token, which "
               "`ray get-auth-token` prints on the head")
        raise EnvironmentProblem(f"Ray refused this process's credentials ({said}): {fix}") from None
    except (ConnectionError, TimeoutError) as exc:
        raise EnvironmentProblem(f"could not connect to Ray: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                                 "; check RAY_ADDRESS, or run on a new local instance: RAY_ADDRESS=local") from None
    except OSError as exc:
        where = exc.filename or ""
        home = os.path.expanduser("~")
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC) and str(where).startswith(home):
            raise EnvironmentProblem(
                f"Ray could not write {where} ({exc.strerror}): HOME ({home}) is not writable. Point "
                "RAY_AUTH_TOKEN_PATH at a writable file (Ray keeps its auth token there), or HOME at a writable "
                "folder, or on a single-user machine set RAY_AUTH_MODE=disabled") from None
        raise EnvironmentProblem(f"Ray could not start: {type(exc).__name__}: {exc}. Check that {where or 'its temp dir'} "
                                 "is writable and has space (RAY_TMPDIR / TMPDIR move Ray's temp dir)") from None


@contextlib.contextmanager
def sigterm_as_sigint() -> Iterator[None]:
    """Handle SIGTERM as SIGINT while inside.

    A first SIGTERM is handled as SIGINT (Ctrl+C) is -- Tune, once running, stops gracefully and saves its
    state; elsewhere a KeyboardInterrupt -- and a second one stops at once (KeyboardInterrupt wherever the
    sweep is: its wind-down skips the report figures). Only from the main thread (signals are delivered
    there); elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = 0

    def _as_sigint(signum: int, frame: Any) -> None:
        nonlocal received
        received += 1
        if received > 1:
            logger.warning("a second SIGTERM: stopping at once")
            raise KeyboardInterrupt
        logger.warning("SIGTERM received: stopping as on Ctrl+C (a second signal stops at once)")
        signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGTERM, _as_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
