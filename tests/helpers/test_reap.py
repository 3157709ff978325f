"""The tests' own process checks: what a pytest process counts as started by itself (`make test` runs two)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from tests.helpers.reap import TAG, started_here

SLEEP = [sys.executable, "-c", "import time; time.sleep(30)"]


def _execed(pid: int) -> bool:
    try:
        return psutil.Process(pid).cmdline() == SLEEP
    except psutil.Error:
        return False


def test_a_process_counts_as_ours_by_its_inherited_tag_and_not_by_another_ones() -> None:
    assert os.environ[TAG] == str(os.getpid()) and started_here(psutil.Process())
    env = {k: v for k, v in os.environ.items() if k != TAG}
    procs = {"ours": subprocess.Popen(SLEEP),  # inherits this process's environment, its tag with it
             "other pytest's": subprocess.Popen(SLEEP, env={**env, TAG: "1"}),
             "untagged": subprocess.Popen(SLEEP, env=env)}
    try:
        # a child read between fork and exec still shows this process's environment (the tag with it): wait until
        # each one runs its own program (seen once under load: "untagged" read as ours)
        deadline = time.monotonic() + 30
        while not all(_execed(p.pid) for p in procs.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {k: started_here(psutil.Process(p.pid)) for k, p in procs.items()} == {
            "ours": True, "other pytest's": False, "untagged": False}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
