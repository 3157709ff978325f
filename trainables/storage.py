"""Where a sweep keeps what it writes under `storage_path`: a local folder, or a URI pyarrow opens.

A URI of any filesystem pyarrow opens (`s3://bucket/prefix`, an S3-compatible store as
`s3://bucket/prefix?endpoint_override=HOST:PORT&scheme=http&region=us-east-1`, `gs://bucket/prefix`; a
`file://` URI is a local folder).

`Storage` owns one such root. Everything the sweep reads or writes there goes through it, by keys
relative to the root (`"sweep-1/sweep.json"`), so nothing else calls `open`, `Path` or `glob` on a
URI (which once made `s3://bucket/x` a local folder `./s3:/bucket/x`). A local root behaves as the
code it replaces: `pathlib` and `os`, a relative path resolved against `base` (the working directory
unless told), writes through a temporary file and a rename, the sweep's lock an `fcntl` lock. A URI
goes through `pyarrow.fs` (`FileSystem.from_uri`, the same resolution Ray Tune gives a URI
`storage_path`), opened on first use, so a `Storage` is cheap to build and pickles to any node. An
object store writes an object whole or not at all, so a write there is one upload.

A URI that cannot be reached or written raises `StorageError`: one line naming the URI, and the
credentials variables that are not set where the store refused. The lock on a URI (`lock`) is a
lease: `trainables.storage_lease`.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import json
import mmap
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from trainables.storage_lease import Lease, LockHeld

if TYPE_CHECKING:
    import pyarrow.fs

__all__ = ["LockHeld", "Storage", "StorageError", "is_uri"]

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # as the spec's check of storage_path
# the variables a store's client reads its credentials from, by scheme (a role or a key file may stand in)
CREDENTIALS = {"s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), "gs": ("GOOGLE_APPLICATION_CREDENTIALS",),
               "gcs": ("GOOGLE_APPLICATION_CREDENTIALS",)}
_SECRETS = ("access_key", "secret_key", "session_token")  # masked in a query (pyarrow 25 takes keys as KEY:SECRET@)
# how pyarrow (the AWS SDK's curl, Google's client) says it got no answer at all
_NO_ANSWER = ("NETWORK_CONNECTION", "curlCode", "Could not connect", "Couldn't connect", "Couldn't resolve",
              "Could not resolve", "Connection refused", "timed out", "Timeout")


class StorageError(OSError):
    """A storage URI that cannot be opened, reached or written; the message says which, in one line."""


def is_uri(path: str) -> bool:
    """Whether `path` is a URI (`s3://...`, `file://...`) rather than a plain path."""
    return bool(_SCHEME.match(path))


def shown(uri: str) -> str:
    """`uri` as it may be printed: a secret key in it (`s3://KEY:SECRET@bucket`, `?secret_key=`) masked."""
    parts = urlsplit(uri)
    if parts.password:
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1))
    if any(k in _SECRETS for k, _ in parse_qsl(parts.query)):
        parts = parts._replace(query=urlencode([(k, "***" if k in _SECRETS else v) for k, v in parse_qsl(parts.query)],
                                               safe=":*"))
    return urlunsplit(parts)


class Storage:
    """One storage root: a local folder or a URI. Keys are `/`-separated paths below the root."""

    def __init__(self, root: str, base: Path | None = None) -> None:
        self._local: Path | None = None
        self._fs: pyarrow.fs.FileSystem | None = None
        self._base = ""  # the root's path on that filesystem, once opened
        if root.startswith("file://"):
            root = unquote(urlsplit(root).path)
        if is_uri(root):
            parts = urlsplit(root)
            self.root = urlunsplit(parts._replace(path=parts.path.rstrip("/")))
        else:  # as `storage_root` resolved it: against the working directory (or `base`), links resolved
            self._local = ((base if base is not None else Path.cwd()) / root).resolve()
            self.root = str(self._local)

    def __repr__(self) -> str:
        return f"Storage({shown(self.root)!r})"

    def __str__(self) -> str:
        return shown(self.root)

    def __getstate__(self) -> dict[str, Any]:  # a pyarrow filesystem is opened again where it is used
        return {**self.__dict__, "_fs": None}

    @property
    def is_local(self) -> bool:
        return self._local is not None

    # --- names -------------------------------------------------------------------------------------------

    def uri(self, *parts: str) -> str:
        """Return the full name of a key: what Ray Tune and a new `Storage` take.

        On a local root an absolute path, else the root's URI with the key appended to its path and its query
        kept."""
        key = _key(*parts)
        if self._local is not None:
            return str(self._local / key) if key else str(self._local)
        if any(c in key for c in "?#%"):  # would be read as the URI's query, fragment or an escape
            raise ValueError(f"{key!r}: a key below a URI holds no '?', '#' or '%'")
        split = urlsplit(self.root)
        return urlunsplit(split._replace(path=f"{split.path}/{key}" if key else split.path))

    def child(self, *parts: str) -> Storage:
        """The storage rooted at a key below this one."""
        return Storage(self.uri(*parts))

    def ray_storage(self, *parts: str) -> tuple[str, pyarrow.fs.FileSystem | None]:
        """Return what to hand Ray Tune or Ray Train for a folder under this root.

        That is `RunConfig(storage_path=..., storage_filesystem=...)`: the URI itself and no filesystem: Ray opens it with `FileSystem.from_uri`
        in every process that writes there (its query, e.g. `endpoint_override`, is read there too), with
        that node's own credentials; `Tuner.restore`/`can_restore` take the same URI."""
        return self.uri(*parts), None

    # --- reads and writes ----------------------------------------------------------------------------------

    def exists(self, *parts: str) -> bool:
        if self._local is not None:
            return (self._local / _key(*parts)).exists()
        import pyarrow.fs as pafs

        with self._errors("read", parts):
            return bool(self._remote().get_file_info(self._path(*parts)).type != pafs.FileType.NotFound)

    def read_bytes(self, *parts: str) -> bytes:
        """A file's bytes; FileNotFoundError where there is none."""
        if self._local is not None:
            return (self._local / _key(*parts)).read_bytes()
        with self._errors("read", parts), self._remote().open_input_stream(self._path(*parts), compression=None) as f:
            return bytes(f.read())

    def read_text(self, *parts: str) -> str:
        return self.read_bytes(*parts).decode()

    def write_bytes(self, key: str, data: bytes) -> None:
        """Write a file whole: a kill midway leaves the old one or the new one, never half of one.

        Locally a temporary file renamed over it; on an object store a single upload."""
        if self._local is not None:
            path = self._local / _key(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
            return
        with self._errors("write", (key,)), self._remote().open_output_stream(self._path(key), compression=None) as f:
            f.write(data)  # one call: the object is committed (at close) whole, or its upload fails

    def write_text(self, key: str, text: str) -> None:
        self.write_bytes(key, text.encode())

    def append_text(self, key: str, text: str) -> None:
        """Add to the end of a file (a journal, a log).

        An object store cannot append: the object is read and written again, so one process appends at a time."""
        if self._local is not None:
            path = self._local / _key(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(text)
            return
        try:
            before = self.read_bytes(key)
        except FileNotFoundError:
            before = b""
        self.write_bytes(key, before + text.encode())

    def list(self, key: str = "", pattern: str = "*") -> list[str]:
        """Return the names one level below `key` that match `pattern` (`fnmatch`), sorted.

        [] where there is no such folder."""
        if self._local is not None:
            folder = self._local / _key(key)
            names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        else:
            import pyarrow.fs as pafs

            selector = pafs.FileSelector(self._path(key), allow_not_found=True, recursive=False)
            with self._errors("list", (key,)):
                names = [PurePosixPath(i.path).name for i in self._remote().get_file_info(selector)]
        return sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))

    def delete(self, *parts: str) -> None:
        """Remove a file, or a folder and all below it; nothing to remove is no error."""
        if self._local is not None:
            path = self._local / _key(*parts)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            return
        import pyarrow.fs as pafs

        fs, path_ = self._remote(), self._path(*parts)
        with self._errors("delete", parts):
            kind = fs.get_file_info(path_).type
            if kind == pafs.FileType.Directory:
                fs.delete_dir(path_)
            elif kind == pafs.FileType.File:
                fs.delete_file(path_)

    def move(self, src: str, dst: str) -> None:
        """Rename a file or folder (`--restart` moves an old sweep aside).

        Locally one rename; an object store has none: its objects are copied, then the old ones removed."""
        if self._local is not None:
            (self._local / _key(src)).rename(self._local / _key(dst))
            return
        import pyarrow.fs as pafs

        fs = self._remote()
        with self._errors("move", (src,)):
            if fs.get_file_info(self._path(src)).type == pafs.FileType.File:
                fs.copy_file(self._path(src), self._path(dst))
            else:
                pafs.copy_files(self._path(src), self._path(dst), source_filesystem=fs, destination_filesystem=fs)
        self.delete(src)

    # --- folders to and from this machine ------------------------------------------------------------------

    def upload(self, local: Path, key: str) -> None:
        """Copy a local file to `key`, or a local folder's files (all below it) under `key`.

        Each file is written whole (`write_bytes`)."""
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for f in files:
            rel = f.relative_to(local).as_posix() if f != local else ""
            target = f"{key}/{rel}" if rel else key
            if self._local is not None:
                dest = self._local / _key(target)
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(dest.name + ".tmp")
                shutil.copyfile(f, tmp)
                tmp.replace(dest)
            else:
                self._upload_file(f, target)

    def _upload_file(self, local: Path, key: str) -> None:
        """One file to an object, in one `write` call (of a memory map: a checkpoint may be large). pyarrow cannot
        abort an upload, and closing its stream, as an exception leaving a `with` does, commits what was written
        so far; one call leaves no "so far": the object holds the whole file, or its upload failed."""
        with self._errors("write", (key,)), open(local, "rb") as src, \
                self._remote().open_output_stream(self._path(key), compression=None) as out:
            if os.fstat(src.fileno()).st_size:
                with mmap.mmap(src.fileno(), 0, access=mmap.ACCESS_READ) as view:
                    out.write(view)

    def download(self, key: str, local: Path) -> Path:
        """Copy the files below `key`, or the file `key`, into the local folder `local`; return `local`.

        `local` is made if need be; the files' paths below `key` are kept. FileNotFoundError where `key` is
        nothing."""
        local.mkdir(parents=True, exist_ok=True)
        if self._local is not None:
            src = self._local / _key(key)
            if src.is_dir():
                shutil.copytree(src, local, dirs_exist_ok=True)
            else:
                shutil.copyfile(src, local / src.name)
            return local
        import pyarrow.fs as pafs

        fs, path = self._remote(), self._path(key)
        with self._errors("read", (key,)):
            kind = fs.get_file_info(path).type
            if kind == pafs.FileType.NotFound:
                raise FileNotFoundError(f"{self.uri(key)}: no such file or folder")
            dest = local / PurePosixPath(path).name if kind == pafs.FileType.File else local
            pafs.copy_files(path, str(dest), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
        return local

    @contextlib.contextmanager
    def fetched(self, key: str) -> Iterator[Path]:
        """Give a local folder holding what is below `key` while inside.

        On a local root the folder itself (no copy), else a temporary copy removed on exit (a rank reading a checkpoint, the driver handing a
        trial's traces to MLflow). FileNotFoundError where `key` is nothing."""
        if self._local is not None:
            if not (self._local / _key(key)).exists():
                raise FileNotFoundError(f"{self.uri(key)}: no such file or folder")
            yield self._local / _key(key)
            return
        with tempfile.TemporaryDirectory(prefix="fetched-") as tmp:
            yield self.download(key, Path(tmp))

    # --- checks and the lock -------------------------------------------------------------------------------

    def check_writable(self) -> None:
        """Write a small marker at the root, read it back, find it listed and remove it.

        Before a sweep starts, an unreachable store, missing credentials or permissions (write, read, list, delete), or a
        read-only folder fail here, in one line. (The lock on a URI needs the listing: `storage_lease`.)"""
        marker, token = f".write-check-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex.encode()
        try:
            self.write_bytes(marker, token)
            if self.read_bytes(marker) != token:
                raise StorageError(f"cannot use {self}: a marker written there read back different")
            if self.list(pattern=marker) != [marker]:
                raise StorageError(f"cannot use {self}: a marker written there was not listed; the sweep's lock "
                                   "needs a store that lists what was just written (S3, GCS do)")
            self.delete(marker)
        except StorageError:
            raise
        except OSError as exc:  # a local folder (a URI's errors are StorageErrors already)
            raise StorageError(f"cannot write to {self} ({exc.strerror or exc}): point storage_path at a "
                               "writable folder") from None

    @contextlib.contextmanager
    def lock(self, name: str, holder: dict[str, Any], ttl_s: float = 60.0) -> Iterator[Lease | None]:
        """Hold the lock `name` (a key at the root) while inside, or raise `LockHeld` at once.

        `LockHeld` carries what the holder wrote (`holder`: who this is, as the refusal names it). A local root: an `fcntl` lock on the
        file `name` that the operating system releases when the holder ends, however it ends; the file
        stays with the last holder's `holder` in it; yields None. A URI: a lease (`storage_lease.Lease`),
        renewed while held, which a holder killed outright leaves to expire after `ttl_s` (at once for a
        process of this machine that is gone); yields the lease, whose `lost` says if it was taken away."""
        if self._local is None:
            lease = Lease(self._remote(), self._path(name), holder, ttl_s, self._errors)
            lease.acquire()
            try:
                yield lease
            finally:
                lease.release()
            return
        path = self._local / _key(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    held = json.loads(path.read_text() or "{}")
                except (OSError, ValueError):
                    held = {}
                raise LockHeld(held if isinstance(held, dict) else {}) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder).encode(), 0)
            yield None
        finally:
            os.close(fd)

    # --- the filesystem behind a URI -----------------------------------------------------------------------

    def _remote(self) -> pyarrow.fs.FileSystem:
        if self._fs is None:
            import pyarrow.fs as pafs

            try:
                self._fs, self._base = pafs.FileSystem.from_uri(self.root)
            except (OSError, ValueError) as exc:  # an unknown scheme, a bad query, a bucket's region unresolved
                raise StorageError(f"cannot open {self} ({_one_line(exc)}): give a local path or a URI pyarrow "
                                   "opens (s3://bucket/prefix, gs://bucket/prefix, ...)") from None
        return self._fs

    def _path(self, *parts: str) -> str:
        """A key's path on the URI's filesystem (`bucket/prefix/key`: what `from_uri` left of the URI)."""
        self._remote()
        key = _key(*parts)
        return f"{self._base.rstrip('/')}/{key}" if key else self._base

    @contextlib.contextmanager
    def _errors(self, action: str, parts: tuple[str, ...]) -> Iterator[None]:
        """A store's failure as one line naming the URI; FileNotFoundError and StorageError pass as they are."""
        try:
            yield
        except (FileNotFoundError, StorageError):
            raise
        except OSError as exc:
            raise StorageError(self._why(action, _key(*parts), exc)) from None

    def _why(self, action: str, key: str, exc: BaseException) -> str:
        detail = _one_line(exc)
        what = f"{action} {key} at {self}" if key else f"{action} at {self}"
        if any(s in detail for s in _NO_ANSWER):
            return f"cannot {what}: the store did not answer ({detail}); check the URI's host, endpoint and network"
        scheme = urlsplit(self.root).scheme
        in_uri = bool(urlsplit(self.root).username) or "access_key" in dict(parse_qsl(urlsplit(self.root).query))
        unset = [v for v in CREDENTIALS.get(scheme, ()) if not os.environ.get(v)] if not in_uri else []
        if unset:
            return (f"cannot {what}: the store refused ({detail}) and {' and '.join(unset)} "
                    f"{'is' if len(unset) == 1 else 'are'} not set: set {'it' if len(unset) == 1 else 'them'} "
                    "on this machine and every node of the cluster")
        return f"cannot {what}: the store refused ({detail})"


def _key(*parts: str) -> str:
    """`parts` as one key below a root: `/`-joined, no `..`, no absolute part."""
    key = "/".join(p.strip("/") for p in parts if p.strip("/"))
    if any(seg in ("..", ".") for seg in key.split("/")) or key.startswith("/"):
        raise ValueError(f"{key!r}: a storage key is a path below the root, without '.' or '..'")
    return key


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
