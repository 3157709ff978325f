"""An S3-compatible store on loopback for the tests: moto's server mode (`moto_server`, from the `dev`
extra) as a process of its own, started and stopped by its own process id.

`s3_server()` starts one on a free port, creates a bucket, sets dummy `AWS_*` credentials (and keeps the
machine's own AWS configuration and the EC2 metadata service out of it) for as long as it runs, and
yields an `S3Server`: `uri(prefix)` is a `storage_path` on it, in the form Ray's own tests use against a
moto server (`s3://bucket/prefix?endpoint_override=127.0.0.1:PORT&scheme=http&region=us-east-1`), and
`keys()` lists what the bucket holds through boto3, a client that shares nothing with the code under test.
With `enforce_auth`, the server checks every request's signature and refuses keys it never issued
(moto's `INITIAL_NO_AUTH_ACTION_COUNT=0`); no bucket is created then.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REGION = "us-east-1"
_DUMMY = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
# what else the AWS SDKs read credentials and settings from: none of this machine's own
_ISOLATED = {"AWS_CONFIG_FILE": "/nonexistent/aws-config", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
             "AWS_EC2_METADATA_DISABLED": "true", "AWS_SESSION_TOKEN": None, "AWS_PROFILE": None,
             "AWS_DEFAULT_REGION": REGION}


@dataclass
class S3Server:
    endpoint: str  # 127.0.0.1:PORT
    bucket: str
    process: subprocess.Popen[bytes]
    log: Path  # the server's output: a line per request it answered

    def requests(self) -> int:
        """How many requests the server has answered so far (its log's request lines)."""
        return sum(1 for line in self.log.read_text(errors="replace").splitlines() if ' HTTP/1.1" ' in line)

    def uri(self, prefix: str = "") -> str:
        path = f"/{prefix.strip('/')}" if prefix.strip("/") else ""
        return f"s3://{self.bucket}{path}?endpoint_override={self.endpoint}&scheme=http&region={REGION}"

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=f"http://{self.endpoint}", region_name=REGION,
                            aws_access_key_id=_DUMMY["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=_DUMMY["AWS_SECRET_ACCESS_KEY"])

    def keys(self, prefix: str = "") -> list[str]:
        """Every object's key under `prefix` in the bucket, sorted (folder markers, keys ending in `/`, left out)."""
        found: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            found += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
        return sorted(found)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def s3_server(bucket: str = "sweeps", enforce_auth: bool = False, timeout_s: float = 30.0) -> Iterator[S3Server]:
    """A moto server on loopback with `bucket` in it, and dummy credentials in this process's environment
    while inside (the environment is restored after); the server is stopped by its own process id."""
    exe = Path(sys.executable).with_name("moto_server")
    if not exe.exists():
        raise RuntimeError(f"{exe} is missing: pip install -e '.[dev]' (moto[server])")
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"} if enforce_auth else dict(os.environ)
    log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)  # noqa: SIM115 - read after exit
    port = free_port()
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    saved = {k: os.environ.get(k) for k in (*_DUMMY, *_ISOLATED)}
    try:
        _wait_listening(proc, port, timeout_s, Path(log.name))
        for key, value in {**_DUMMY, **_ISOLATED}.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server = S3Server(f"127.0.0.1:{port}", bucket, proc, Path(log.name))
        if not enforce_auth:
            server.client().create_bucket(Bucket=bucket)
        yield server
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        os.unlink(log.name)


def _wait_listening(proc: subprocess.Popen[bytes], port: int, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"moto_server did not listen on 127.0.0.1:{port} within {timeout_s:.0f}s: {log.read_text()[-2000:]}")
