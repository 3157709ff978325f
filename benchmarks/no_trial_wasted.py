"""Issue 41's case, before and after in one run: a user's own character-level LM (`benchmarks/char_lm/`),
16 configurations (num_workers [1, 2] x batch_size [16, 64] x precision [32, bf16-mixed] x params.d_model
[32, 64]), TPE, 12 trials, on a local Ray instance, as `sweeps run` runs it for a new user.

Per revision (`before`: the code at `--before`, checked out into a temporary git worktree; `after`: this
tree): the distinct configurations among the trials, the worker groups started, the sweep's wall time, the
first ETA's error against the time that really remained (first_eta_error_pct = (ETA - remaining) /
remaining x 100, remaining = sweep wall - elapsed at the first trial's line), and the service's own
seconds from the overhead line. Goals (issue 41): 12 distinct, at most 3 groups, |first ETA error| <= 25%.

    .venv/bin/python benchmarks/no_trial_wasted.py [--before 5f4ba0f] [--modes before,after] [--trials 12]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, record, table

HERE = Path(__file__).resolve().parent / "char_lm"
_STARTED = re.compile(r"^\[trial (\d+)/\d+\] \S+ started: (.*)$")
_ETA = re.compile(r"^\[trial \d+/\d+\] .*\| elapsed (\d+)s, ETA (\d+)s")
_WALL = re.compile(r"^Sweep \S+ (?:finished in|stopped before its end after) (\d+)s: (\d+)/(\d+) trials ok")
_GROUPS = re.compile(r"warm worker groups: (\d+) started for (\d+) trial")
_SERVICE = re.compile(r"the service's own ([\d.]+) s")


def run(mode: str, before: str, trials: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="wasted-") as tmp:
        work = Path(tmp) / "project"
        work.mkdir()
        shutil.copy(HERE / "char_lm.py", work)
        spec = (HERE / "spec.yaml").read_text().replace("num_trials: 12", f"num_trials: {trials}")
        (work / "spec.yaml").write_text(spec)
        env = {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / "cache")}
        env.pop("RAY_ADDRESS", None)
        if mode == "before":
            code = Path(tmp) / "code"
            subprocess.run(["git", "worktree", "add", "--detach", str(code), before], cwd=REPO, check=True,
                           capture_output=True)
            env["PYTHONPATH"] = str(code)
        try:
            proc = subprocess.run([sys.executable, "-m", "sweeps", "run", "spec.yaml"], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=3600)
        finally:
            if mode == "before":
                subprocess.run(["git", "worktree", "remove", "--force", str(code)], cwd=REPO, capture_output=True)
        out = proc.stdout.splitlines()
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{mode}: the sweep failed ({proc.returncode}):\n" + "\n".join(out[-40:]) + proc.stderr[-3000:])
        configs = [m.group(2) for line in out if (m := _STARTED.match(line))]
        elapsed, eta = next((int(m.group(1)), int(m.group(2))) for line in out if (m := _ETA.match(line)))
        wall, ok, total = next((int(m.group(1)), int(m.group(2)), int(m.group(3))) for line in out
                               if (m := _WALL.match(line)))
        overhead = next((line for line in out if "warm worker groups:" in line), "")
        groups = _GROUPS.search(overhead)
        service = _SERVICE.search(overhead)
        remaining = wall - elapsed
        return {"mode": mode, "code": before if mode == "before" else "this tree", "trials": len(configs),
                "distinct": len(set(configs)), "ok": ok, "groups": int(groups.group(1)) if groups else None,
                "wall_s": wall, "first_eta_s": eta, "remaining_s": remaining,
                "first_eta_error_pct": round((eta - remaining) / remaining * 100, 1) if remaining > 0 else None,
                "service_s": float(service.group(1)) if service else None, "overhead_line": overhead,
                "exhausted": next((line for line in out if "SPACE EXHAUSTED" in line), "")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--before", default="5f4ba0f", help="the revision to compare against")
    p.add_argument("--modes", default="before,after")
    p.add_argument("--trials", type=int, default=12)
    a = p.parse_args()
    rows = [run(mode, a.before, a.trials) for mode in a.modes.split(",")]
    print(table(["code", "trials", "distinct", "ok", "groups", "wall", "first ETA vs left", "service"],
                [[r["code"], str(r["trials"]), str(r["distinct"]), str(r["ok"]), str(r["groups"]), f"{r['wall_s']} s",
                  f"{r['first_eta_s']} s vs {r['remaining_s']} s ({r['first_eta_error_pct']}%)",
                  f"{r['service_s']} s"] for r in rows]))
    for r in rows:
        print(f"{r['code']}: {r['overhead_line']}")
    record("no_trial_wasted", f"benchmarks/no_trial_wasted.py --before {a.before} --modes {a.modes} --trials {a.trials}",
           rows)


if __name__ == "__main__":
    main()
