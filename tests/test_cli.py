"""`sweeps wait-head`: between `ray start --head` and `ray job submit`, wait until the head's job
agent accepts a job (right after start, the dashboard answers before it does). Against a real head,
with the README's steps: tests/test_job_submit.py."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from sweeps.cli import main


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
