"""Does a trace slow the steps after it? (issue 45) No traced step is ever measured, but a profiler that
left something behind (callbacks, buffers, a fragmented heap) would slow the measured window that follows
it in the same processes. This measures exactly that, with the product's own `Tracer`.

`--nproc` gloo ranks under `torchrun`, each on a core of its own with one thread, train a small CNN
(`--model cnn`: DDP, AdamW, batch 16 of 32x32 images, in memory) or one linear layer on 4 samples
(`--model tiny`: a dispatch-bound step of ~25 us, where a leftover per-operator cost would show most): `--stretches` timed stretches of `--steps` steps ("before"), then 4 steps that the `traced` arm
profiles as a trial's warm-up does (`trainables.trace.Tracer`: one profiler warm-up step, 2 traced, the
trace gzipped and split, the splits all-reduced) and the `plain` arm just runs, then `--stretches` timed
stretches again ("after"). The arms alternate, `--runs` processes each.

- `after_over_before` = median of a process's "after" stretches / median of its "before" stretches (the
  first 2 left out: the process still warms up), mean over the arm's processes: a lasting cost shows as a
  traced ratio above the plain one, whose ratio holds the drift alone;
- `lingering_pct` = (traced ratio / plain ratio - 1) x 100, with `ci95_pct` = 1.96 x its standard error
  (the two arms' standard errors combined, a process the unit).

    .venv/bin/python benchmarks/trace_after.py [--nproc 2] [--model cnn] [--runs 8] [--stretches 10] [--steps 100]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def child() -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from trainables.trace import Tracer
    from trainables.window import all_reduce

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    traced, steps, stretches = os.environ["ARM"] == "traced", int(os.environ["STEPS"]), int(os.environ["STRETCHES"])
    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})  # a core and a thread per rank: less noise
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if os.environ["MODEL"] == "tiny":  # a step of ~25 us on one core: dispatch-bound, where a profiler's
        # leftover per-operator cost would show most
        model = DistributedDataParallel(nn.Linear(32, 10))
        x, y = torch.randn(4, 32), torch.randint(0, 10, (4,))
    else:
        model = DistributedDataParallel(nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, 10)))
        x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    opt = torch.optim.AdamW(model.parameters())

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def timed() -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        dist.barrier()
        return (time.perf_counter() - t0) / steps * 1000

    for _ in range(20):
        step()
    before = [timed() for _ in range(stretches)]
    with tempfile.TemporaryDirectory() as keep:
        tracer = Tracer(2 if traced else 0, keep, rank, world, torch.device("cpu"))
        for s in range(1, 5):  # warm-up steps 1..4 of 5: the profiler's warm-up step 2, traced 3-4
            tracer.before(s, 5)
            step()
            tracer.after(s)
        said = tracer.finish(all_reduce)
        tracer.close()
        assert not traced or "trace/compute_pct" in said, said
    out = [before, [timed() for _ in range(stretches)]]
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def main() -> None:
    from common import record, table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--model", choices=("cnn", "tiny"), default="cnn")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--stretches", type=int, default=10)
    ap.add_argument("--steps", type=int, default=100)
    a = ap.parse_args()
    if a.runs < 2 or a.stretches < 3:
        raise SystemExit("--runs >= 2 and --stretches >= 3: a spread needs two processes an arm, a 'before' 3 stretches")
    ratios: dict[str, list[float]] = {"plain": [], "traced": []}
    for r in range(a.runs):
        for arm in (("plain", "traced") if r % 2 == 0 else ("traced", "plain")):
            env = {**os.environ, "ARM": arm, "STEPS": str(a.steps), "STRETCHES": str(a.stretches), "MODEL": a.model, "TRACE_AFTER_CHILD": "1"}
            proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(a.nproc),
                                   __file__], env=env, capture_output=True, text=True, timeout=900)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                raise SystemExit(f"{arm} run failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
            before, after = json.loads(line[7:])
            ratios[arm].append(statistics.median(after) / statistics.median(before[2:]))
            print(f"run {r + 1}: {arm} done", flush=True)
    mean = {arm: statistics.fmean(v) for arm, v in ratios.items()}
    se = {arm: statistics.stdev(v) / math.sqrt(len(v)) for arm, v in ratios.items()}
    lingering = 100.0 * (mean["traced"] / mean["plain"] - 1)
    ci95 = 100.0 * 1.96 * math.hypot(se["traced"], se["plain"]) / mean["plain"]
    rows = [{"arm": arm, "processes": len(ratios[arm]), "after_over_before": mean[arm], "sd": statistics.stdev(ratios[arm])}
            for arm in ("plain", "traced")]
    summary = {"summary": True, "nproc": a.nproc, "model": a.model, "runs": a.runs, "stretches": a.stretches, "steps": a.steps, "lingering_pct": lingering,
               "ci95_pct": ci95}
    print(table(["arm", "processes", "after / before", "sd"],
                [[r["arm"], str(r["processes"]), f"{r['after_over_before']:.3f}", f"{r['sd']:.3f}"] for r in rows]))
    print(f"lingering cost {lingering:+.1f}% (95% CI +/- {ci95:.1f}%)")
    record("trace_after", f"benchmarks/trace_after.py --nproc {a.nproc} --model {a.model} --runs {a.runs} --stretches {a.stretches} --steps {a.steps}",
           [*rows, summary])


if __name__ == "__main__":
    if os.environ.get("TRACE_AFTER_CHILD"):
        child()
    else:
        main()
