"""One holder at a time on an object store, from plain writes and one listing: a lease.

A local folder has `fcntl` locks, which the operating system drops when their holder dies, however it dies.
An object store has no lock and outlives every process, so the lock there is a lease: an object its holder
keeps writing, which others read as free once nobody renewed it for `ttl_s`.

**Taking it.** Each process that asks writes its own object, `<name>/<random>.json` (its holder and its
lease's terms), then lists `<name>/`. Another candidate there whose lease is alive means the lock is taken:
this one removes its own object and refuses (`LockHeld`, naming that holder). A store that lists what was
written before (S3 and GCS are strongly consistent, list included) cannot let two askers both see
themselves alone: of two writes, the later one's listing sees the earlier. Two asking at the same moment
may both refuse, never both hold.

**Alive.** A candidate's age is the store's own clock: its object's modification time against the asker's
freshly written object's, so the machines' clocks do not matter. A lease not renewed for its `ttl_s` (its
holder was killed outright: SIGKILL, a lost node) is dead, and so is one whose holder ran on this machine
(same host name, boot and pid namespace) in a process that is gone: a driver killed here frees its sweep at
once. The asker removes a dead candidate's object.

**Holding it.** A daemon thread rewrites the holder's object every `ttl_s / 6` seconds. If its object is
gone (another process found the lease dead), or a renewal came too late to be sure nobody found it dead
first (`_renew`), `lost` says so; the holder should stop, since another process may now hold the lock.
Releasing removes the object. A lease is not a fence: a holder stalled for longer than `ttl_s` (a stopped
process, a partition) learns that it lost the lock only when it runs again.

Conditional writes (S3's `If-None-Match: *`, GCS's `ifGenerationMatch=0`) would replace the listing on one
store each, but pyarrow writes no conditional object, and a dead holder's object would still need the
lease's expiry.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow.fs

logger = logging.getLogger(__name__)

_MTIME_SLACK_S = 1.0  # object stores keep modification times to the second


class LockHeld(Exception):
    """The lock is held by another process.

    `holder` is what its holder wrote (empty where unreadable); `age_s`, on a store, how long ago its lease
    was renewed; `ttl_s` when it expires unrenewed."""

    def __init__(self, holder: dict[str, Any], age_s: float | None = None, ttl_s: float | None = None) -> None:
        super().__init__(f"held by {holder or 'another process'}")
        self.holder, self.age_s, self.ttl_s = holder, age_s, ttl_s


def this_process() -> dict[str, Any]:
    """What names this process on this machine: a holder gone from it frees its lease at once."""
    return {"host": socket.gethostname(), "boot_id": _read("/proc/sys/kernel/random/boot_id"),
            "pid_ns": _pid_namespace(), "pid": os.getpid()}


class Lease:
    """The lease `prefix/` on `fs` (module doc).

    `errors(action, parts)` turns the store's failures into one-line `StorageError`s naming the URI."""

    def __init__(self, fs: pyarrow.fs.FileSystem, prefix: str, holder: dict[str, Any], ttl_s: float,
                 errors: Callable[[str, tuple[str, ...]], contextlib.AbstractContextManager[None]]) -> None:
        self.fs, self.prefix, self.ttl_s, self._errors = fs, prefix.rstrip("/"), ttl_s, errors
        self.path = f"{self.prefix}/{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}.json"
        self.body = json.dumps({"holder": holder, "lease": {**this_process(), "ttl_s": ttl_s}}).encode()
        self.lost = ""  # why this holder no longer holds the lock ("" while it does)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lease or raise `LockHeld` (module doc)."""
        import pyarrow.fs as pafs

        name = self.prefix.rsplit("/", 1)[-1]
        with self._errors("write", (name,)):
            self._write()
            mine = self.fs.get_file_info(self.path).mtime
            others = [i for i in self.fs.get_file_info(pafs.FileSelector(self.prefix, allow_not_found=True))
                      if i.path != self.path and i.type == pafs.FileType.File]
        live: list[tuple[float, dict[str, Any]]] = []
        for info in others:
            body = self._read_body(info.path)
            if body is None:  # released meanwhile
                continue
            age = (mine - info.mtime).total_seconds() if mine and info.mtime else 0.0
            lease = body.get("lease") or {}
            if age > float(lease.get("ttl_s", self.ttl_s)) + _MTIME_SLACK_S or _gone_from_here(lease):
                with contextlib.suppress(OSError):  # a dead holder's object: whoever sees it first removes it
                    self.fs.delete_file(info.path)
                continue
            live.append((age, body))
        if live:
            with contextlib.suppress(OSError):
                self.fs.delete_file(self.path)
            age, body = max(live, key=lambda x: x[0])  # the oldest: the holder, not another asker
            lease = body.get("lease") or {}
            holder = body.get("holder")
            raise LockHeld(holder if isinstance(holder, dict) else {}, max(age, 0.0), float(lease.get("ttl_s", self.ttl_s)))
        self._thread = threading.Thread(target=self._renew, name=f"lease-{name}", daemon=True)
        self._thread.start()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)
        if not self.lost:
            with contextlib.suppress(OSError):
                self.fs.delete_file(self.path)

    def _write(self) -> None:
        with self.fs.open_output_stream(self.path, compression=None) as f:
            f.write(self.body)

    def _read_body(self, path: str) -> dict[str, Any] | None:
        try:
            with self.fs.open_input_stream(path, compression=None) as f:
                body = json.loads(f.read() or b"{}")
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            body = {}
        return body if isinstance(body, dict) else {}

    def _renew(self) -> None:
        """Rewrite the lease every `ttl_s / 6` seconds. A contender removes it only once it is older than
        `ttl_s` (and a second), so a holder whose last renewal is at most `ttl_s - period` old at the end of
        each renewal still holds it; one that went longer unrenewed (a store that did not answer, a stalled
        process) may not, and says so (`lost`), its object removed."""
        import pyarrow.fs as pafs

        period = self.ttl_s / 6
        last = time.monotonic()
        while not self._stop.wait(period):
            try:
                if self.fs.get_file_info(self.path).type == pafs.FileType.NotFound:
                    self.lost = "its lease object was removed: another process found it expired"
                else:
                    self._write()
            except OSError as exc:
                logger.warning("could not renew the lease %s: %s", self.path, exc)
            else:
                if not self.lost and time.monotonic() - last <= self.ttl_s - period:
                    last = time.monotonic()
                    continue
            if not self.lost and time.monotonic() - last > self.ttl_s - period:
                self.lost = (f"it went {time.monotonic() - last:.0f}s unrenewed (ttl_s {self.ttl_s:g}): another "
                             "process may have taken it")
            if self.lost:
                with contextlib.suppress(OSError):
                    self.fs.delete_file(self.path)
                logger.error("the lock %s is no longer held: %s", self.prefix, self.lost)
                return


def _gone_from_here(lease: dict[str, Any]) -> bool:
    """Whether a lease's holder ran on this machine (host, boot, pid namespace) in a process that is gone."""
    here = this_process()
    if not here["boot_id"] or any(lease.get(k) != here[k] for k in ("host", "boot_id", "pid_ns")):
        return False
    try:
        os.kill(int(lease["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, KeyError, ValueError, TypeError):  # alive (another user's), or unreadable
        return False
    return False


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""
