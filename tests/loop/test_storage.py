"""The storage layer (`trainables.storage`): every operation on a local root and on an S3 root (a moto server
on loopback, `tests.helpers.s3_server`), each checked through a view that does not go through the layer
(the local folder itself; boto3 on the bucket); on S3, no local folder named after the URI appears; the
errors an unreachable or refusing store gives; the sweep's lock on both (`fcntl` locally, a lease on S3)."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.s3_server import S3Server, free_port, s3_server
from trainables.storage import LockHeld, Storage, StorageError, is_uri, shown

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


@dataclass
class Root:
    """A storage root under test, and what is really there, seen without the layer."""

    storage: Storage
    files: Callable[[], list[str]]  # every file's key below the root, sorted
    raw: Callable[[str], bytes]  # a file's bytes


def _no_uri_folder(*places: Path) -> list[Path]:
    """Folders a URI turned into by `Path(uri)` (`./s3:/bucket/...`)."""
    return [p for place in places if place.exists() for p in [place, *place.rglob("*")] if p.name.startswith("s3:")]


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Root]:
    monkeypatch.chdir(tmp_path)  # a URI taken for a relative path would land here
    if request.param == "local":
        folder = tmp_path / "store"
        yield Root(Storage("store"),
                   lambda: sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()),
                   lambda key: (folder / key).read_bytes())
        return
    server: S3Server = request.getfixturevalue("s3")
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    yield Root(Storage(server.uri(prefix)),
               lambda: [k.removeprefix(f"{prefix}/") for k in server.keys(f"{prefix}/")],
               lambda key: server.client().get_object(Bucket=server.bucket, Key=f"{prefix}/{key}")["Body"].read())
    assert not _no_uri_folder(tmp_path, REPO / "s3:"), "a write to S3 made a local folder"


def test_files_round_trip_and_are_where_the_store_says(root: Root) -> None:
    s = root.storage
    s.write_text("sweep-1/sweep.json", '{"token": "t"}')
    trace = gzip.compress(b"{}" * 1000)  # a gzipped trace: kept as it is, never compressed again
    s.write_bytes("sweep-1/trials/t1/traces/rank-0.pt.trace.json.gz", trace)
    assert root.files() == ["sweep-1/sweep.json", "sweep-1/trials/t1/traces/rank-0.pt.trace.json.gz"]
    assert root.raw("sweep-1/trials/t1/traces/rank-0.pt.trace.json.gz") == trace
    assert s.read_text("sweep-1/sweep.json") == '{"token": "t"}'
    assert s.read_bytes("sweep-1", "trials/t1/traces/rank-0.pt.trace.json.gz") == trace
    assert s.exists("sweep-1/sweep.json") and s.exists("sweep-1") and not s.exists("sweep-1/tuner.pkl")
    with pytest.raises(FileNotFoundError):
        s.read_text("sweep-1/tuner.pkl")
    s.write_text("sweep-1/sweep.json", '{"token": "u"}')  # a rewrite replaces it
    assert root.raw("sweep-1/sweep.json") == b'{"token": "u"}'
    with pytest.raises(ValueError, match="below the root"):
        s.read_text("../elsewhere")


def test_a_key_has_one_full_name_that_ray_and_a_new_storage_open(root: Root, tmp_path: Path) -> None:
    s = root.storage
    s.write_text("sweep-1/sweep.json", "{}")
    name = s.uri("sweep-1", "sweep.json")
    if s.is_local:
        assert name == str(tmp_path / "store" / "sweep-1" / "sweep.json")
    else:
        assert is_uri(name) and "/sweep-1/sweep.json?endpoint_override=127.0.0.1:" in name
    assert Storage(s.uri("sweep-1")).read_text("sweep.json") == "{}"
    assert s.child("sweep-1").exists("sweep.json")
    assert s.ray_storage("sweep-1") == (s.uri("sweep-1"), None)
    again = pickle.loads(pickle.dumps(s))  # as Ray ships it to a rank: the filesystem is opened there again
    assert again.read_text("sweep-1/sweep.json") == "{}" and again.uri() == s.uri()


def test_ray_tune_finds_the_experiment_where_the_storage_wrote_it(root: Root) -> None:
    """What `ray_storage` hands Ray is where Ray looks (its own `FileSystem.from_uri` of the URI and query)."""
    from ray import tune

    root.storage.write_bytes("sweep-1/tuner.pkl", b"not read by can_restore")
    assert tune.Tuner.can_restore(root.storage.ray_storage("sweep-1")[0])
    assert not tune.Tuner.can_restore(root.storage.ray_storage("sweep-2")[0])


_WRITER = """
import sys
from trainables.storage import Storage
s, size = Storage(sys.argv[1]), 24 * 1024 * 1024
payloads = [bytes([65]) * size, bytes([66]) * size]
s.write_bytes("sweep.json", payloads[0])
print("writing", flush=True)
n = 1
while True:
    s.write_bytes("sweep.json", payloads[n % 2])
    n += 1
"""


def test_a_kill_midway_leaves_the_old_file_or_the_new_one_never_half(root: Root) -> None:
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, root.storage.uri()], stdout=subprocess.PIPE,
                              cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"writing\n"
        time.sleep(1.5)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    data = root.raw("sweep.json")
    assert len(data) == 24 * 1024 * 1024 and data.count(data[:1]) == len(data), "half a file"
    assert root.files() in (["sweep.json"], ["sweep.json", "sweep.json.tmp"])  # locally a tmp file may stay


def test_append_adds_to_the_end(root: Root) -> None:
    root.storage.append_text("sweep-1/mlflow-pending.jsonl", '{"method": "a"}\n')
    root.storage.append_text("sweep-1/mlflow-pending.jsonl", '{"method": "b"}\n')
    assert root.raw("sweep-1/mlflow-pending.jsonl") == b'{"method": "a"}\n{"method": "b"}\n'


def test_list_is_one_level_and_a_pattern_picks_names(root: Root) -> None:
    s = root.storage
    for key in ("a/sweep.json", "b/sweep.json", "b/trials/t1/x.txt", "c/tuner.pkl", "a.lock"):
        s.write_text(key, "x")
    assert s.list() == ["a", "a.lock", "b", "c"]
    assert s.list(pattern="*.lock") == ["a.lock"]
    assert s.list("b") == ["sweep.json", "trials"]
    assert s.list("nowhere") == []
    assert [n for n in s.list() if s.exists(n, "sweep.json")] == ["a", "b"]  # the sweeps saved there


def test_folders_go_up_and_come_down_whole(root: Root, tmp_path: Path) -> None:
    s = root.storage
    src = tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "checkpoint.pt").write_bytes(os.urandom(3000))
    (src / "sub" / "extra.bin").write_bytes(b"e")
    (src / "empty").write_bytes(b"")
    s.upload(src, "sweep-1/trials/t1/checkpoint_warm")
    s.upload(src / "sub" / "extra.bin", "sweep-1/one.bin")
    assert root.files() == ["sweep-1/one.bin", "sweep-1/trials/t1/checkpoint_warm/checkpoint.pt",
                            "sweep-1/trials/t1/checkpoint_warm/empty", "sweep-1/trials/t1/checkpoint_warm/sub/extra.bin"]
    assert root.raw("sweep-1/trials/t1/checkpoint_warm/checkpoint.pt") == (src / "checkpoint.pt").read_bytes()
    out = s.download("sweep-1/trials/t1/checkpoint_warm", tmp_path / "out")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == \
        ["checkpoint.pt", "empty", "sub/extra.bin"]
    assert (out / "checkpoint.pt").read_bytes() == (src / "checkpoint.pt").read_bytes()
    assert (s.download("sweep-1/one.bin", tmp_path / "single") / "one.bin").read_bytes() == b"e"
    with pytest.raises(FileNotFoundError):
        s.download("sweep-1/nothing", tmp_path / "none")
    with s.fetched("sweep-1/trials/t1/checkpoint_warm") as here:
        assert (here / "checkpoint.pt").read_bytes() == (src / "checkpoint.pt").read_bytes()
        assert here == tmp_path / "store" / "sweep-1/trials/t1/checkpoint_warm" if s.is_local else here.is_dir()
    assert here.exists() == s.is_local  # a copy is removed; a local root's own folder stays
    with pytest.raises(FileNotFoundError), s.fetched("sweep-1/trials/t2/traces"):
        pass


def test_delete_takes_a_file_or_a_whole_folder_and_nothing_is_fine(root: Root) -> None:
    s = root.storage
    for key in ("sweep-1/trials/t1/checkpoint_warm/checkpoint.pt", "sweep-1/trials/t1/traces/rank-0.gz",
                "sweep-1/sweep.json"):
        s.write_text(key, "x")
    s.delete("sweep-1/trials/t1")
    s.delete("sweep-1/sweep.json")
    s.delete("sweep-1/never-was")
    assert root.files() == [] and not s.exists("sweep-1/trials/t1")


def test_move_sets_a_folder_aside(root: Root) -> None:
    s = root.storage
    s.write_text("sweep-1/sweep.json", "{}")
    s.write_text("sweep-1/trials/t1/x", "x")
    s.move("sweep-1", "sweep-1.old-20261127-120000")
    assert root.files() == ["sweep-1.old-20261127-120000/sweep.json", "sweep-1.old-20261127-120000/trials/t1/x"]
    s.move("sweep-1.old-20261127-120000/sweep.json", "sweep.json")
    assert s.read_text("sweep.json") == "{}"


def test_the_write_check_leaves_nothing_behind(root: Root) -> None:
    root.storage.check_writable()
    assert root.files() == []


def test_a_local_root_resolves_as_storage_root_did(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert Storage("ray_results").root == str(tmp_path / "ray_results")
    assert Storage("ray_results", base=tmp_path / "home").root == str(tmp_path / "home" / "ray_results")
    assert Storage("link/x").root == str(tmp_path / "real" / "x")
    assert Storage(f"file://{tmp_path}/a").root == str(tmp_path / "a") and Storage(f"file://{tmp_path}").is_local
    assert not Storage("s3://bucket/prefix").is_local
    assert Storage("s3://bucket/prefix/").uri("k") == "s3://bucket/prefix/k"
    with pytest.raises(ValueError, match="no '[?]'"):
        Storage("s3://bucket/prefix").uri("a?b")


def test_a_local_root_that_cannot_be_written_fails_the_check(tmp_path: Path) -> None:
    (tmp_path / "ro").mkdir(mode=0o500)
    if os.access(tmp_path / "ro", os.W_OK):
        pytest.skip("running as root: every folder is writable")
    with pytest.raises(StorageError, match=r"cannot write to .*/ro \(Permission denied\)"):
        Storage(str(tmp_path / "ro" / "sweeps")).check_writable()


def test_an_unreachable_endpoint_fails_in_one_line_naming_the_uri(s3: S3Server, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    uri = f"s3://sweeps/x?endpoint_override=127.0.0.1:{free_port()}&scheme=http&region=us-east-1"
    with pytest.raises(StorageError) as got:
        Storage(uri).check_writable()
    said = str(got.value)
    assert "\n" not in said and uri in said and "did not answer" in said, said
    assert "AWS_ACCESS_KEY_ID" not in said  # set: not the cause


def test_missing_credentials_are_named_when_the_store_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with s3_server(enforce_auth=True) as strict:
        uri = strict.uri("sweeps")
        with pytest.raises(StorageError) as refused:  # keys the store never issued
            Storage(uri).check_writable()
        assert "the store refused" in str(refused.value) and "not set" not in str(refused.value)
        # no variables; the SDK finds other credentials (a key file here), which the store refuses too
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        (tmp_path / "credentials").write_text("[default]\naws_access_key_id = AKIAOTHER\naws_secret_access_key = other\n")
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
        with pytest.raises(StorageError) as got:
            Storage(uri).write_text("sweep-1/sweep.json", "{}")
    said = str(got.value)
    assert "\n" not in said and uri in said and "sweep-1/sweep.json" in said, said
    assert "the store refused" in said and "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set" in said, said


def test_a_uri_pyarrow_cannot_open_says_so_and_secrets_are_never_shown(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError, match=r"cannot open s3://sweeps/x\?nonsense=1 .*Unexpected query parameter"):
        Storage("s3://sweeps/x?nonsense=1").exists("a")
    assert "SECRET" not in shown("s3://AKIA:SECRET@bucket/x") + shown("s3://bucket/x?secret_key=SECRET&region=r")
    assert "SECRET" not in repr(Storage("s3://AKIA:SECRET@bucket/x"))


# --- the lock ----------------------------------------------------------------------------------------------------

_ME = {"pid": 1, "host": "here", "since": "2026-11-27 12:00:00 UTC", "command": "sweeps run a.yaml"}


def test_a_second_holder_is_refused_and_told_who_holds_it(root: Root) -> None:
    s = root.storage
    with s.lock("sweep-1.lock", _ME):
        with pytest.raises(LockHeld) as held, s.lock("sweep-1.lock", {**_ME, "pid": 2}):
            pass
        assert held.value.holder == _ME
    with s.lock("sweep-1.lock", {**_ME, "pid": 3}):  # released: free again
        pass
    if s.is_local:  # as before: the file stays, with its last holder
        assert json.loads(root.raw("sweep-1.lock")) == {**_ME, "pid": 3}
    else:  # a lease removes its object
        assert root.files() == []


_HOLDER = """
import sys, time
from trainables.storage import Storage
with Storage(sys.argv[1]).lock("sweep-1.lock", {"pid": "child", "command": "sweeps run"}):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_holder_killed_outright_frees_the_lock_at_once(root: Root) -> None:
    """SIGKILL: no `finally` runs. fcntl: the kernel drops the lock; a lease: its holder's process is gone
    from this machine."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, root.storage.uri()], stdout=subprocess.PIPE,
                              cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(LockHeld) as held, root.storage.lock("sweep-1.lock", _ME):
            pass
        assert held.value.holder == {"pid": "child", "command": "sweeps run"}
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with root.storage.lock("sweep-1.lock", _ME):
        pass


def test_a_lease_nobody_renews_expires(root: Root, s3: S3Server) -> None:
    """A holder on another machine that died: free once its lease's ttl passed on the store's clock."""
    if root.storage.is_local:
        pytest.skip("a local root's lock is the kernel's, which has no lease")
    prefix = root.storage.uri().split("?")[0].removeprefix(f"s3://{s3.bucket}/")
    body = {"holder": {"pid": 7, "host": "elsewhere"}, "lease": {"host": "elsewhere", "pid": 7, "ttl_s": 1}}
    s3.client().put_object(Bucket=s3.bucket, Key=f"{prefix}/sweep-1.lock/dead.json", Body=json.dumps(body).encode())
    with pytest.raises(LockHeld) as held, root.storage.lock("sweep-1.lock", _ME):
        pass
    assert held.value.holder == {"pid": 7, "host": "elsewhere"} and held.value.ttl_s == 1
    time.sleep(3.1)  # its ttl, and a second of the store's clock
    with root.storage.lock("sweep-1.lock", _ME):
        assert root.files() != [] and "sweep-1.lock/dead.json" not in root.files()


def test_a_held_lease_is_renewed_and_says_when_it_is_lost(root: Root, s3: S3Server) -> None:
    if root.storage.is_local:
        pytest.skip("a local root's lock is the kernel's, which has no lease")
    # ttl 3 s: renewed every 0.5 s, lost after 2.5 s without one (the S3 server answers in far less, beside a busy core)
    with root.storage.lock("sweep-1.lock", _ME, ttl_s=3) as lease:
        time.sleep(5.5)  # past its ttl and the store's whole-second clock (ttl + 2 s): alive only if renewed
        with pytest.raises(LockHeld), root.storage.lock("sweep-1.lock", {**_ME, "pid": 2}):
            pass
        assert lease is not None and not lease.lost
        prefix = root.storage.uri().split("?")[0].removeprefix(f"s3://{s3.bucket}/")
        deadline = time.monotonic() + 5.0
        while not lease.lost and time.monotonic() < deadline:  # a renewal under way may write it again
            for key in root.files():  # as another process that found it expired would
                s3.client().delete_object(Bucket=s3.bucket, Key=f"{prefix}/{key}")
            time.sleep(0.3)
        assert "removed" in lease.lost


def test_a_renewal_too_late_to_be_sure_gives_the_lease_up(root: Root, monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder whose renewal came later than `ttl_s - period` after the last one (a stalled process, a store
    that hung) cannot know that nobody found its lease expired meanwhile: it says so and removes its object."""
    if root.storage.is_local:
        pytest.skip("a local root's lock is the kernel's, which has no lease")
    with root.storage.lock("sweep-1.lock", _ME, ttl_s=1.2) as lease:
        assert lease is not None
        write = lease._write

        def stalled() -> None:
            time.sleep(1.2)
            write()

        monkeypatch.setattr(lease, "_write", stalled)
        deadline = time.monotonic() + 5.0
        while not lease.lost and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "unrenewed" in lease.lost
        assert root.files() == []
        with root.storage.lock("sweep-1.lock", {**_ME, "pid": 2}):  # free for the next
            pass
