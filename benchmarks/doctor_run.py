"""One `sweeps doctor` run of this machine, recorded: every figure, what was skipped and why, the wall time.

    cd benchmarks && ../.venv/bin/python doctor_run.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, record, table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "doctor.json"
        cmd = [sys.executable, "-m", "sweeps", "doctor", *(["--quick"] if args.quick else []), "--no-mlflow", "--json", str(out)]
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        report = json.loads(out.read_text())
    node = report["nodes"][0]
    rows = [{"figure": k, "value": v} for k, v in sorted(node["figures"].items())]
    rows += [{"figure": "doctor/wall_s", "value": wall}]
    rows += [{"figure": k, "skipped": why} for k, why in sorted(node["skipped"].items())]
    print(table(["figure", "value"], [[r["figure"], f"{r['value']:.4g}" if "value" in r else r["skipped"]] for r in rows]))
    record("doctor_run", f"benchmarks/doctor_run.py{' --quick' if args.quick else ''}", rows)


if __name__ == "__main__":
    main()
