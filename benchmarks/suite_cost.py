"""What `make test` costs: the pytest total and its slowest tests, read from a run's output.

    .venv/bin/python benchmarks/suite_cost.py --log LOG [--origin "how LOG was made"]

LOG is what `make test` (or `CI=true bash .ci/run` on a clean clone) printed: its last line holds the
count and total (`468 passed, 1 warning in 1151.00s`), and `--durations=30` lists the slowest test
phases. Appends one results.jsonl entry (the machine is this one: run it where the log was made)
and prints the slowest tests grouped by file. The suite is not run here: a full run takes ~8-10 min
on 2 vCPU, and the log of the clean-clone run is the figure that counts.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import append_entry, machine, make_entry, table  # noqa: E402

_TOTAL = re.compile(r"^(?P<counts>(?:\d+ \w+(?:, )?)+) in (?P<s>[\d.]+)s")
_DURATION = re.compile(r"^(?P<s>[\d.]+)s (?P<phase>call|setup|teardown)\s+(?P<test>\S.*)$")


def parse(text: str) -> dict:
    """The total, the counts and the listed slowest phases of a pytest run's output."""
    total, counts, slowest = None, {}, []
    for raw in text.splitlines():
        line = raw.removeprefix("> ").strip()
        if m := _DURATION.match(line):
            slowest.append({"test": m["test"], "phase": m["phase"], "s": float(m["s"])})
        elif (m := _TOTAL.match(line.strip("= "))) and ("passed" in line or "failed" in line):
            total = float(m["s"])
            counts = {k: int(n) for n, k in (c.split(" ", 1) for c in m["counts"].split(", "))}
    if total is None:
        raise SystemExit("no pytest summary line ('N passed ... in Xs') in the log: was it cut short?")
    return {"total_s": total, "counts": counts, "slowest": slowest}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", type=Path, required=True, help="what `make test` printed")
    ap.add_argument("--origin", default="", help="how the log was made, recorded with the entry")
    ap.add_argument("--git-sha", default="", help="the commit whose suite LOG ran, where it is not this checkout's")
    ap.add_argument("--no-record", action="store_true", help="print only")
    args = ap.parse_args(argv)
    got = parse(args.log.read_text(errors="replace"))
    by_file: dict[str, float] = defaultdict(float)
    for s in got["slowest"]:
        by_file[s["test"].split("::", 1)[0]] += s["s"]
    listed = sum(s["s"] for s in got["slowest"])
    print(f"pytest total {got['total_s']:.0f} s ({got['total_s'] / 60:.1f} min), {got['counts']}; the "
          f"{len(got['slowest'])} slowest phases listed sum to {listed:.0f} s")
    print(table(["file", "s in the listed phases"], [[f, f"{s:.1f}"] for f, s in sorted(by_file.items(), key=lambda x: -x[1])]))
    if not args.no_record:
        rows = [{"figure": "total", "s": got["total_s"], **got["counts"]},
                *({"figure": "phase", **s} for s in got["slowest"])]
        info = machine() | ({"git_sha": args.git_sha} if args.git_sha else {})
        line = append_entry(make_entry("suite_cost", f"benchmarks/suite_cost.py --log {args.log}", rows,
                                       machine_info=info, origin=args.origin))
        print(f"results.jsonl line {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
