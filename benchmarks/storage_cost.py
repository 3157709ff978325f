"""What a `storage_path` on an object store costs: the demo with its storage on a local S3 server (moto, on
loopback) against a local folder, side by side in one run.

Per storage: the sweep's wall time and the service's own cost per trial, as the sweep's overhead line says it
(wall less the trials' loops: scheduling, worker start-up, tracking, and now the storage's reads and writes),
and the requests the S3 server answered during the sweep. `--pairs N` runs N pairs in the order local, S3, S3,
local, ... (a drift of the machine over the run weighs on both sides alike) and compares the medians.
Goal (issue 50): within 10% of the local folder.

    .venv/bin/python benchmarks/storage_cost.py [--spec examples/demo.yaml] [--pairs 2]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, record, table

from tests.helpers.s3_server import s3_server

_WALL = re.compile(r"sweep wall ([\d.]+) s = .* the service's own ([\d.]+) s, ([\d.]+) s per trial")
_OK = re.compile(r"^Sweep \S+ finished in (\d+)s: (\d+)/(\d+) trials ok")


def run(label: str, spec_text: str, storage: str) -> dict[str, Any]:
    """The demo with `storage_path: storage`, in a fresh working directory, local Ray, its own MLflow store."""
    with tempfile.TemporaryDirectory(prefix="storage-cost-") as tmp:
        spec = Path(tmp) / "demo.yaml"
        spec.write_text(re.sub(r"(?m)^storage_path: .*$", f"storage_path: '{storage}'", spec_text))
        env = {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / "cache"), "PYTHONPATH": str(REPO)}
        env.pop("RAY_ADDRESS", None)
        proc = subprocess.run([sys.executable, "-m", "sweeps", "run", str(spec)], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=1800)
        out = proc.stdout.splitlines()
        if proc.returncode != 0:
            raise SystemExit(f"{label}: the demo failed ({proc.returncode}):\n" + "\n".join(out[-40:]) + proc.stderr[-3000:])
        wall, service, per_trial = next((float(m.group(1)), float(m.group(2)), float(m.group(3)))
                                        for line in out if (m := _WALL.search(line)))
        ok, total = next((int(m.group(2)), int(m.group(3))) for line in out if (m := _OK.match(line)))
        local_uri_folder = (Path(tmp) / "s3:").exists()
    return {"storage": label, "sweep_s": wall, "service_s": service, "service_s_per_trial": per_trial,
            "trials_ok": ok, "trials": total, "local_s3_folder": local_uri_folder}


def on_s3(text: str, prefix: str) -> dict[str, Any]:
    """The demo with its storage on a fresh moto server, and the requests that server answered."""
    with s3_server() as s3:  # dummy credentials in this process's environment: the local Ray inherits them
        row = run("moto S3 on loopback", text, s3.uri(prefix))
        row["s3_requests"] = s3.requests()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default=str(REPO / "examples" / "demo.yaml"))
    ap.add_argument("--pairs", type=int, default=1, help="local/S3 pairs, in the order local, S3, S3, local, ...")
    a = ap.parse_args()
    text = Path(a.spec).read_text()
    rows = []
    for i in range(2 * a.pairs):
        if (i % 4) in (1, 2):
            rows.append(on_s3(text, f"sweeps{i}"))
        else:
            with tempfile.TemporaryDirectory(prefix="storage-local-") as local:
                rows.append(run("local folder", text, local))
        print(rows[-1], flush=True)
    base = statistics.median(r["sweep_s"] for r in rows if r["storage"] == "local folder")
    for r in rows:
        r["sweep_vs_local_pct"] = 100.0 * (r["sweep_s"] - base) / base
    summary = []
    for label in ("local folder", "moto S3 on loopback"):
        mine = [r for r in rows if r["storage"] == label]
        med = {k: statistics.median(r[k] for r in mine) for k in ("sweep_s", "service_s", "service_s_per_trial")}
        summary.append({"storage": label, "runs": len(mine), **med, "sweep_vs_local_pct": 100.0 * (med["sweep_s"] - base) / base,
                        "sweeps": [r["sweep_s"] for r in mine], "s3_requests": [r["s3_requests"] for r in mine if "s3_requests" in r],
                        "trials_ok": sum(r["trials_ok"] for r in mine), "trials": sum(r["trials"] for r in mine)})
    print(table(["storage", "runs", "sweep s (median; each)", "service s", "service s/trial", "S3 requests", "ok", "vs local"],
                [[r["storage"], str(r["runs"]), f"{r['sweep_s']:.1f} ({', '.join(f'{x:.1f}' for x in r['sweeps'])})",
                  f"{r['service_s']:.1f}", f"{r['service_s_per_trial']:.1f}", ", ".join(map(str, r["s3_requests"])) or "-",
                  f"{r['trials_ok']}/{r['trials']}", f"{r['sweep_vs_local_pct']:+.1f}%"] for r in summary]))
    record("storage_cost", f"python benchmarks/storage_cost.py --pairs {a.pairs}", summary + rows)


if __name__ == "__main__":
    main()
