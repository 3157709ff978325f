"""Where a run's CPU went: every process sampled from /proc once a second, its CPU time by kind.

    .venv/bin/python benchmarks/suite_cpu.py --out CPU.json -- bash .ci/run     # watch a command to its end
    .venv/bin/python benchmarks/suite_cpu.py --summary CPU.json [--record]      # the table; a results.jsonl row

`make test` on a 2-core machine is bound by its CPU (`vmstat` through a clean clone's pytest part: 4-5% idle),
so its time is cut only by work it stops doing: this says which processes did it. A process's kind is what it
last called itself (Ray's workers rename themselves `ray::<actor class>` once they host an actor): a Ray Train
rank, controller, a Tune trial's actor, Ray's own daemons, the pytest processes (the drivers of in-process
sweeps), `python -m sweeps` drivers, torchrun ranks, pip and so on. Each process's CPU (user + system) is
counted once, from its last sample, so a process that lived under a second, or its last second, is missed:
the summary says what share of the machine's busy CPU (/proc/stat) the processes account for. Sampling costs
~1-2% of one core here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import append_entry, machine, make_entry, table  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")
# (what a command line contains, its kind), the first that matches wins
_KINDS = (("ray::", None), ("raylet", "ray: raylet"), ("gcs_server", "ray: gcs_server"),
          ("dashboard/agent.py", "ray: dashboard agent"), ("dashboard.py", "ray: dashboard"),
          ("runtime_env/agent", "ray: runtime env agent"), ("log_monitor.py", "ray: log monitor"),
          ("autoscaler/_private/monitor.py", "ray: monitor"), ("default_worker.py", "ray: worker starting"),
          ("ray/scripts/scripts.py", "ray: cli"), ("bin/ray ", "ray: cli"),
          ("torch.distributed.run", "torchrun agent"), ("trainables.launch", "torchrun rank"),
          ("-m sweeps", "python -m sweeps (driver)"), ("pytest", "pytest"), ("execnet", "pytest (xdist worker)"),
          ("exec(eval(sys.stdin.readline()))", "pytest (xdist worker)"), ("mlflow", "mlflow server"),
          ("gunicorn", "mlflow server"), ("uvicorn", "mlflow server"), ("moto", "moto s3"),
          ("postgres", "postgres"), ("-m pip", "pip"), ("bin/pip", "pip"), ("chrom", "chromium"), ("mkdocs", "mkdocs"))


def kind_of(cmdline: str, comm: str) -> str:
    """The kind of a process, from its command line (or its name, where it has none: a process ending).

    A Ray actor by its class (`ray::TrainController.run` is a TrainController)."""
    for mark, kind in _KINDS:
        if mark in cmdline:
            return kind if kind is not None else _ACTOR + cmdline.split()[0].removeprefix("ray::").split(".")[0]
    if "python" in cmdline or comm == "python":
        return "python (other)"
    return _ACTOR + comm.removeprefix("ray::") + _CUT if comm.startswith("ray::") else comm or "?"


_ACTOR, _CUT = "ray actor: ", "..."  # a name the kernel cut to 15 characters


def merged(kinds: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The kinds, each process's cut name counted with the whole one it begins (where one does)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"cpu_s": 0.0, "processes": 0})
    def whole(name: str) -> str:  # files written before actors were named by their class alone had methods
        return _ACTOR + name.removeprefix(_ACTOR).split(".")[0] if name.startswith(_ACTOR) else name

    for name, v in kinds.items():
        if name.startswith("ray::") or name == "python":  # a file written before processes ending kept their kind
            name = kind_of("", name)
        if name.endswith(_CUT):
            name = next((whole(k) for k in kinds if k.startswith(name.removesuffix(_CUT))
                         and not k.endswith(_CUT) and not k.startswith("ray::")), name)
        else:
            name = whole(name)
        out[name]["cpu_s"] += v["cpu_s"]
        out[name]["processes"] += v["processes"]
    return dict(out)


def _sample() -> dict[tuple[int, int], tuple[str, float]]:
    """Every process now: (pid, start tick) -> (kind, CPU seconds so far)."""
    out: dict[tuple[int, int], tuple[str, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
        out[(int(name), int(fields[19]))] = (kind_of(cmd, comm), cpu)
    return out


def _busy_s() -> float:
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICK


def watch(command: list[str], out: Path, period_s: float = 1.0) -> int:
    """Run `command`, sampling every process until it ends; write what each kind used to `out`."""
    before = set(_sample())
    seen: dict[tuple[int, int], tuple[str, float]] = {}
    busy0, t0 = _busy_s(), time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        for key, (kind, cpu) in _sample().items():
            if key not in before:  # a process ending has no command line left: it keeps the kind it had
                seen[key] = (seen[key][0] if key in seen and kind.endswith(_CUT) else kind, cpu)
        time.sleep(period_s)
    by_kind: dict[str, dict[str, float]] = defaultdict(lambda: {"cpu_s": 0.0, "processes": 0})
    for kind, cpu in seen.values():
        by_kind[kind]["cpu_s"] += cpu
        by_kind[kind]["processes"] += 1
    result = {"command": command, "returncode": proc.returncode, "wall_s": time.monotonic() - t0,
              "busy_cpu_s": _busy_s() - busy0, "period_s": period_s, "kinds": dict(by_kind)}
    out.write_text(json.dumps(result, indent=1))
    return proc.returncode


def summary(result: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """A table of the kinds by CPU seconds, and the rows a results.jsonl entry holds."""
    kinds = sorted(merged(result["kinds"]).items(), key=lambda kv: -kv[1]["cpu_s"])
    counted = sum(v["cpu_s"] for _, v in kinds)
    busy = result["busy_cpu_s"]
    rows = [{"kind": k, "cpu_s": round(v["cpu_s"], 1), "processes": int(v["processes"]),
             "share_pct": round(100 * v["cpu_s"] / busy, 1)} for k, v in kinds]
    head = (f"wall {result['wall_s']:.0f} s, the machine busy {busy:.0f} CPU-s; the processes sampled account for "
            f"{counted:.0f} CPU-s ({100 * counted / busy:.0f}%)")
    shown = [[r["kind"], f"{r['cpu_s']:.0f}", str(r["processes"]), f"{r['share_pct']:.1f}"] for r in rows if r["cpu_s"] >= 1]
    return head + "\n" + table(["kind", "CPU s", "processes", "% of busy"], shown), rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="watch the command after --, write the figures here")
    ap.add_argument("--summary", type=Path, help="print a written file's table")
    ap.add_argument("--record", action="store_true", help="with --summary: append a results.jsonl entry")
    ap.add_argument("--origin", default="", help="how the run was made, recorded with the entry")
    ap.add_argument("--git-sha", default="", help="with --record: the commit the run ran, where it is not this checkout's")
    ap.add_argument("command", nargs="*")
    args = ap.parse_args(argv)
    if args.out:
        if not args.command:
            ap.error("--out watches a command: give it after --")
        return watch(args.command, args.out)
    if not args.summary:
        ap.error("give --out FILE -- COMMAND, or --summary FILE")
    result = json.loads(args.summary.read_text())
    text, rows = summary(result)
    print(text)
    if args.record:
        totals = {"figure": "total", "wall_s": round(result["wall_s"], 1), "busy_cpu_s": round(result["busy_cpu_s"], 1),
                  "returncode": result["returncode"]}
        info = machine() | ({"git_sha": args.git_sha} if args.git_sha else {})
        line = append_entry(make_entry("suite_cpu", f"benchmarks/suite_cpu.py --summary {args.summary}",
                                       [totals, *rows], machine_info=info, origin=args.origin))
        print(f"results.jsonl line {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
