"""Where a bare Ray Train run's time goes: start-up (fit() -> rank 0's train function starts) and
teardown (rank 0's function returns -> fit() returns), and which actors each run starts.

A warm local Ray (2 CPUs, the lean settings `sweeps run` uses), N runs each, alternating, of a 2-worker
gloo trainer whose train function only records the time: Ray's `TorchTrainer` (`stock`), and the one
`sweeps` starts (`lean`: without Ray Data's callback when there are no datasets, and without the
placement-group cleaner where the cluster has no State API, `sweeps.service.trial`). `--no-dashboard` starts
Ray without one (so without its State API), as the test suite's cluster.

    .venv/bin/python benchmarks/train_startup.py [--runs 3] [--no-dashboard]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, record, summary, table


def _mark_start(config: dict[str, Any]) -> None:
    import ray.train

    if ray.train.get_context().get_world_rank() == 0:
        Path(config["stamp"]).write_text(repr(time.time()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-dashboard", action="store_true", help="a local Ray without its dashboard (no State API)")
    args = parser.parse_args()
    import ray
    import ray.train
    from ray._private.state import state  # the GCS's actor table: answers with or without a dashboard
    from ray.train.torch import TorchConfig, TorchTrainer

    from sweeps.service.resources import LEAN_TRAIN_ENV

    ray.init(num_cpus=2, include_dashboard=not args.no_dashboard, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), **LEAN_TRAIN_ENV}})
    from sweeps.service.trial import _lean_torch_trainer

    kinds = {"stock": TorchTrainer, "lean": _lean_torch_trainer()}
    stats: dict[str, dict[str, list[float]]] = {k: {"start-up": [], "teardown": [], "total": []} for k in kinds}
    actors: dict[str, Counter[str]] = {}
    try:
        for i in range(args.runs):
            for kind, trainer in (list(kinds.items()) if i % 2 == 0 else list(kinds.items())[::-1]):  # neither always first
                before = Counter(a["ActorClassName"] for a in state.actor_table(None).values())
                with tempfile.TemporaryDirectory() as tmp:
                    stamp = Path(tmp) / "start"
                    t0 = time.time()
                    trainer(_mark_start, train_loop_config={"stamp": str(stamp)}, torch_config=TorchConfig(backend="gloo"),
                            scaling_config=ray.train.ScalingConfig(num_workers=2),
                            run_config=ray.train.RunConfig(name="bare", storage_path=tmp)).fit()
                    t1 = time.time()
                    started = float(stamp.read_text())
                for key, value in (("start-up", started - t0), ("teardown", t1 - started), ("total", t1 - t0)):
                    stats[kind][key].append(value)
                after = Counter(a["ActorClassName"] for a in state.actor_table(None).values())
                actors.setdefault(kind, Counter()).update(after - before)
                print(f"run {i + 1} {kind}: start-up {started - t0:.2f} s, teardown {t1 - started:.2f} s", flush=True)
    finally:
        ray.shutdown()
    rows = []
    for kind in kinds:
        print(table(["phase", f"{kind}: s, median (min-max)"],
                    [[k, f"{summary(v)['median']:.2f} ({summary(v)['min']:.2f}-{summary(v)['max']:.2f})"]
                     for k, v in stats[kind].items()]))
        print(f"actors {kind} started over {args.runs} runs: " + ", ".join(f"{n} x{c}" for n, c in sorted(actors[kind].items())))
        rows += [{"trainer": kind, "figure": k, **summary(v)} for k, v in stats[kind].items()]
        rows.append({"trainer": kind, "actors": dict(actors[kind])})
    ratio = summary(stats["lean"]["start-up"])["median"] / summary(stats["stock"]["start-up"])["median"]
    print(f"start-up, lean / stock (medians): {ratio:.2f}")
    rows.append({"figure": "start-up lean/stock", "ratio": ratio})
    flag = " --no-dashboard" if args.no_dashboard else ""
    record("train_startup", f"benchmarks/train_startup.py --runs {args.runs}{flag}", rows)

if __name__ == "__main__":
    main()
