"""The CLI (`sweeps/cli.py`) without Ray: `sweeps wait-head` (between `ray start --head` and `ray job submit`,
wait until the head's job agent accepts a job: right after start, the dashboard answers before it does; against a
real head, with the README's steps: tests/e2e/test_job_submit.py), and what a sweep's output ends with."""

from __future__ import annotations

import http.server
from collections.abc import Iterator

import pytest

from sweeps.cli import main
from tests.helpers.http_stub import serving


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
    with serving(_NoAgentYet) as url:
        yield url


def test_a_head_without_its_job_agent_times_out_saying_what_it_answered(
        no_agent_head: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["wait-head", "--address", no_agent_head, "--timeout-s", "2"]) == 1
    err = capsys.readouterr().err
    assert f"the Ray head at {no_agent_head} did not accept a job within 2s" in err
    assert "No available agent to submit job" in err


def test_a_sweep_where_no_trial_finished_ends_its_output_with_the_first_failures_reason(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`ray job status` shows a job log's last line alone: it carries the first failure itself (issue 50, item 8)."""
    from sweeps.cli import _print_outcome
    from sweeps.results.outcome import SweepOutcome, TrialRow
    from sweeps.spec import parse_spec

    spec = parse_spec("name: t\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 2, num_steps: 5}\n")
    why = ("rank 0: WorkloadError: 'data/shapes/classes.txt' is missing: `ray job submit` skips data (in .gitignore). "
           "Fix: remove it from .gitignore")
    rows = [TrialRow("t1", 1, {"batch_size": 32}, "run1", "config", why),
            TrialRow("t2", 2, {"batch_size": 64}, "run2", "config", why)]
    _print_outcome(SweepOutcome(spec, "parent", "sqlite:///mlflow.db", rows, 3.0), "Sweep t finished in 3s")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"Next: no finished trial to learn from; fix the first failure first, trial 1 config: {why}", last
