"""The grace period a scheduler must allow a sweep: seconds from SIGTERM to the process's exit.

Runs `sweeps run` of a small warm-group sweep on a local Ray instance (as `timeout`, systemd, SLURM or
Kubernetes would see it), sends SIGTERM while its second trial trains, and times the exit (it must be 4,
"stopped, resumable"); with `--twice`, a second SIGTERM 0.5 s after the first ("stop at once"). The
sweep's trials report every `--report-interval-s` (a warm trial stops at its next report).

    .venv/bin/python benchmarks/sigterm_grace.py [--rounds 3] [--report-interval-s 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import record, table

SPEC = """\
name: grace
trainable: {{name: mlp-tabular}}
space: {{batch_size: {{type: categorical, choices: [16, 32, 64]}}}}
search: {{algorithm: grid}}
budget: {{num_trials: 3, num_steps: 1000000, num_warmup_steps: 3, max_window_s: 30, report_interval_s: {every}}}
scaling: {{num_workers: 1}}
"""


def one(every: float, twice: bool) -> tuple[float, int]:
    with tempfile.TemporaryDirectory(prefix="grace-") as tmp:
        Path(tmp, "s.yaml").write_text(SPEC.format(every=every))
        log = Path(tmp, "out.log")
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "sweeps", "run", "s.yaml"], cwd=tmp, stdout=out,
                                    stderr=subprocess.STDOUT, env={**os.environ, "XDG_CACHE_HOME": str(Path(tmp, "c"))})
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and "[trial 2/3]" not in log.read_text():
                time.sleep(0.2)
            time.sleep(3.0)  # the trial trains
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            if twice:
                time.sleep(0.5)
                proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=300)
            return time.monotonic() - t0, code


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--report-interval-s", type=float, default=10.0)
    a = p.parse_args()
    rows = []
    for twice in (False, True):
        runs = [one(a.report_interval_s, twice) for _ in range(a.rounds)]
        seconds = [s for s, _ in runs]
        rows.append({"signals": 2 if twice else 1, "report_interval_s": a.report_interval_s,
                     "exit_codes": [c for _, c in runs], "grace_s": seconds, "median_s": statistics.median(seconds),
                     "max_s": max(seconds)})
    print(table(["SIGTERMs", "report every", "exit codes", "seconds to exit (median, max)"],
                [[str(r["signals"]), f"{r['report_interval_s']:g} s", str(r["exit_codes"]),
                  f"{r['median_s']:.1f}, {r['max_s']:.1f}"] for r in rows]))
    record("sigterm_grace", f"benchmarks/sigterm_grace.py --rounds {a.rounds} --report-interval-s {a.report_interval_s:g}",
           rows)


if __name__ == "__main__":
    main()
