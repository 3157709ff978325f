"""What `make demo` costs and how well it says so beforehand, on this CPU as it is and with bf16 emulated.

Runs `sweeps run --restart examples/demo.yaml` as a new user would (a fresh working directory, a fresh
speed-of-light cache, local Ray, the embedded MLflow store), once per mode:
- `native`: the machine as it is;
- `emulated`: `ONEDNN_MAX_CPU_ISA=AVX2`, which makes oneDNN run bf16 by converting to fp32 on any x86
  CPU (the class of a CPU without avx512_bf16/AMX);
- `avx2`: that and `ATEN_CPU_CAPABILITY=avx2`, so none of torch's kernels uses AVX-512 (the nearest this
  machine gets to a CPU without AVX-512 at all, such as the AMD EPYC of issue 27; its clock stays this one's).

Per mode: the sweep's wall time ("finished in"), the ETA printed after the first trial against the time
that really remained (first_eta_error_pct = (ETA - remaining) / remaining x 100, remaining = sweep wall -
elapsed at that line), the largest `perf/sol_pct` of any trial, and whether every bf16 verdict names
emulation. Goals (issue 27, on a 2-core CPU without avx512_bf16): sweep <= 180 s, |first ETA error| <=
25%, no sol_pct above 100, the bf16 verdicts name emulation.

    .venv/bin/python benchmarks/demo_cost.py [--modes native,emulated,avx2] [--spec examples/demo.yaml]

`--spec` runs another sweep the same way, e.g. `benchmarks/first_trial_data.yaml`, whose first trial writes
the data every later trial finds made (the first ETA's worst case on a GPU).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, record, table

_ETA = re.compile(r"^\[trial 1/\d+\] .*\| elapsed (\d+)s, ETA (\d+)s")
_WALL = re.compile(r"^Sweep \S+ finished in (\d+)s: (\d+)/(\d+) trials ok")
# what varies between two runs of one demo: run and trial ids, URLs' queries, paths, measured numbers, the
# column widths they make; a verdict's words after its kind (what the trial measured decides them)
_IDS = re.compile(r"[0-9a-f]{32}|\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{5,12}\b|\?\S+|/tmp/\S+")
_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?")
_VERDICT = re.compile(r"^(.*?\b(?:trial #: |trial # is )[a-z-]+)[:;(].*$")


def shape(lines: list[str]) -> list[str]:
    """The demo's printed lines with what varies between runs masked, one each, sorted: two runs of the same code
    give the same shape whatever they measured (the searcher and the machine pick the order and the verdicts)."""
    masked = (_VERDICT.sub(r"\1", " ".join(_NUMBER.sub("#", _IDS.sub("#", line)).split())) for line in lines)
    return sorted({m for m in masked if m})


def run(mode: str, spec: Path, code: Path | None = None) -> dict[str, Any]:
    """The demo in `mode`, run by this tree's code or by the code checked out at `code`."""
    with tempfile.TemporaryDirectory(prefix="demo-cost-") as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")}
        env["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        if code is not None:
            env["PYTHONPATH"] = str(code)
        if mode in ("emulated", "avx2"):
            env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
        if mode == "avx2":
            env["ATEN_CPU_CAPABILITY"] = "avx2"
        cmd = [sys.executable, "-m", "sweeps", "run", "--restart", str(spec)]
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=1800)
        out = proc.stdout.splitlines()
        if proc.returncode != 0:
            raise SystemExit(f"{mode}: the demo failed ({proc.returncode}):\n" + "\n".join(out[-40:]) + proc.stderr[-3000:])
        elapsed, eta = next((int(m.group(1)), int(m.group(2))) for line in out if (m := _ETA.match(line)))
        wall, ok, total = next((int(m.group(1)), int(m.group(2)), int(m.group(3)))
                               for line in out if (m := _WALL.match(line)))
        head = next((line.split() for line in out if line.startswith("rank  trial")), [])
        db = sqlite3.connect(Path(tmp) / "mlflow.db")
        sol = [v for (v,) in db.execute("select value from latest_metrics where key = 'perf/sol_pct'")]
        made = [v for (v,) in db.execute("select value from latest_metrics where key = 'time/data_prep_s'")]
        verdicts = [v for (v,) in db.execute(
            "select t.value from tags t join params p on t.run_uuid = p.run_uuid "
            "where t.key = 'sweep.verdict_reason' and p.key = 'precision' and p.value = 'bf16-mixed'")]
        rates = {prec: sorted(round(v) for (v,) in db.execute(
            "select m.value from latest_metrics m join params p on m.run_uuid = p.run_uuid join params b "
            "on b.run_uuid = m.run_uuid where m.key = 'throughput/samples_per_s' and p.key = 'precision' and "
            "p.value = ? and b.key = 'batch_size' and b.value = '64'", (prec,)) if math.isfinite(v))
                 for prec in ("32", "bf16-mixed")}
        db.close()
    remaining = wall - elapsed
    return {"mode": mode, "shape": shape(out), "table_columns": head, "sweep_s": wall, "trials_ok": ok, "trials": total, "first_eta_s": eta,
            "first_eta_remaining_s": remaining, "first_eta_error_pct": 100.0 * (eta - remaining) / remaining,
            "max_sol_pct": max(sol) if sol else None, "data_prep_s": sum(made) if made else None,
            "bf16_trials": len(verdicts),
            "bf16_verdicts_name_emulation": sum("emulated" in v for v in verdicts),
            "fp32_b64_samples_per_s": rates["32"] or None, "bf16_b64_samples_per_s": rates["bf16-mixed"] or None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="native,emulated")
    ap.add_argument("--spec", default=str(REPO / "examples" / "demo.yaml"))
    ap.add_argument("--before", default=None, help="also run each mode with the code at this revision (a temporary "
                    "git worktree), in the same run: the same table shape, and how fast")
    a = ap.parse_args()
    spec = Path(a.spec).resolve()
    shown = str(spec.relative_to(REPO)) if spec.is_relative_to(REPO) else str(spec)
    rows = []
    with tempfile.TemporaryDirectory(prefix="demo-before-") as wt:
        if a.before:
            subprocess.run(["git", "worktree", "add", "--detach", str(Path(wt) / "code"), a.before], cwd=REPO,
                           check=True, capture_output=True)
        try:
            for mode in a.modes.split(","):
                for code in ([Path(wt) / "code"] if a.before else []) + [None]:
                    label = a.before if code is not None else "this tree"
                    rows.append({"spec": shown, "code": label, **run(mode, spec, code)})
        finally:
            if a.before:
                subprocess.run(["git", "worktree", "remove", "--force", str(Path(wt) / "code")], cwd=REPO,
                               capture_output=True)
    if a.before:
        for mode in a.modes.split(","):
            shapes = {tuple(r["table_columns"]) for r in rows if r["mode"] == mode}
            print(f"{mode}: the same table columns before and after: {len(shapes) == 1} ({' '.join(next(iter(shapes)))})")
            before, after = (r["shape"] for r in rows if r["mode"] == mode)
            gone, new = sorted(set(before) - set(after)), sorted(set(after) - set(before))
            print(f"{mode}: the same printed lines (numbers, ids and paths masked): {not gone and not new}")
            for line in gone:
                print(f"  only before: {line}")
            for line in new:
                print(f"  only after:  {line}")
            for r in rows:
                if r["mode"] == mode:
                    r["lines_only_here"] = gone if r["code"] == a.before else new
    for r in rows:
        r.pop("shape")
    print(table(["code", "mode", "sweep s", "ok", "first ETA s", "remaining s", "ETA error %", "max sol %", "data made s",
                 "bf16 'emulated'", "fp32 / bf16 at batch 64 (samples/s)"],
                [[r.get("code", "this tree"), r["mode"], str(r["sweep_s"]), f"{r['trials_ok']}/{r['trials']}", str(r["first_eta_s"]),
                  str(r["first_eta_remaining_s"]), f"{r['first_eta_error_pct']:+.0f}",
                  f"{r['max_sol_pct']:.1f}" if r["max_sol_pct"] is not None else "-",
                  f"{r['data_prep_s']:.1f}" if r["data_prep_s"] is not None else "-",
                  f"{r['bf16_verdicts_name_emulation']}/{r['bf16_trials']}",
                  f"{r['fp32_b64_samples_per_s'] or '-'} / {r['bf16_b64_samples_per_s'] or '-'}"] for r in rows]))
    extra = f" --spec {rows[0]['spec']}" if spec != REPO / "examples" / "demo.yaml" else ""
    extra += f" --before {a.before}" if a.before else ""
    record("demo_cost", f"benchmarks/demo_cost.py --modes {a.modes}{extra}", rows)


if __name__ == "__main__":
    main()
