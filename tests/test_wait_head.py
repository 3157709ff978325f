"""`sweeps wait-head`: between `ray start --head` and `ray job submit`, wait until the head's job
agent accepts a job (right after start, the dashboard answers before it does)."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.image_folder import prepare
from sweeps.cli import main
from tests.test_job_submit import BIN, _client_env, head  # noqa: F401 - `head`: a real head, its own ports and dir


class _NoAgentYet(http.server.BaseHTTPRequestHandler):
    """A head whose dashboard is up but whose job agent is not: what `ray job submit` met."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b'{"version": "4", "ray_version": "2.60.0", "ray_commit": "x", "session_name": "s"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        body = b"No available agent to submit job, please try again later."
        self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def no_agent_head() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoAgentYet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_head_without_its_job_agent_times_out_saying_what_it_answered(
        no_agent_head: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["wait-head", "--address", no_agent_head, "--timeout-s", "2"]) == 1
    err = capsys.readouterr().err
    assert f"the Ray head at {no_agent_head} did not accept a job within 2s" in err
    assert "No available agent to submit job" in err


JOB_SPEC = """\
name: job-workdir
trainable: {{name: "examples.image_folder:build", params: {{root: data/shapes, width: 4}}}}
space: {{batch_size: 4}}
budget: {{num_trials: 1, num_steps: 4, num_warmup_steps: 1, report_interval_s: 0.01}}
scaling: {{num_workers: 2, cpus_per_worker: 1}}
telemetry: {{period_s: 0}}
tracking: {{uri: "sqlite:///{db}", experiment: job-workdir}}
storage_path: {storage}
"""


@pytest.mark.ray
def test_the_readme_steps_wait_for_a_fresh_head_then_a_jobs_ranks_read_its_files(
        head: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """`ray start --head`, `sweeps wait-head`, `ray job submit --working-dir .`: the head accepts the
    job, and its ranks resolve a relative path against the job's working directory."""
    cmd = [sys.executable, "-m", "sweeps", "wait-head", "--address", head["address"], "--timeout-s", "120"]
    refused = subprocess.run(cmd, env=_client_env(tmp_path, None), capture_output=True, text=True, timeout=150)
    assert refused.returncode == 2 and "refused this client" in refused.stderr, refused.stderr[-2000:]

    env = _client_env(tmp_path, head["token_path"])
    ready = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    assert ready.returncode == 0, ready.stderr[-2000:]
    assert f"the Ray head at {head['address']} accepts jobs" in ready.stdout

    project = tmp_path / "project"  # what the user submits: the spec and data/ beside it
    prepare(project / "data" / "shapes", num_per_class=8, image_size=12)
    (project / "sweep.yaml").write_text(JOB_SPEC.format(db=tmp_path / "mlflow.db", storage=tmp_path / "results"))
    job = subprocess.run([str(BIN / "ray"), "job", "submit", "--address", head["address"], "--working-dir", ".",
                          "--", "python", "-m", "sweeps", "run", "sweep.yaml"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=400)
    out = job.stdout + job.stderr
    assert job.returncode == 0 and "1/1 trials ok" in out, out[-4000:]
    probe = ready.stdout.split("no-op job ")[1].split(")")[0]
    status = subprocess.run([str(BIN / "ray"), "job", "status", "--address", head["address"], probe], env=env,
                            capture_output=True, text=True, timeout=60)
    assert f"Job '{probe}' succeeded" in status.stdout, status.stdout[-2000:]  # wait-head's no-op job ran
