"""The demo sweep's cost beyond training: `examples/demo.yaml` as `make demo` runs it, warm vs cold.

sweep wall (from `run_sweep`'s start, Ray already up) / sum of the trials' own loop times
(`time/loop_total_s`), per mode, alternating; goal (issue 15) <= 1.3 warm.

    .venv/bin/python benchmarks/demo_ratio.py [--rounds 1] [--modes warm,cold]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, record, summary, table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--modes", default="warm,cold")
    a = ap.parse_args()
    import ray
    import yaml

    from sweeps.service import resources
    from sweeps.service.runner import run_sweep
    from sweeps.spec import parse_spec

    base = yaml.safe_load((REPO / "examples" / "demo.yaml").read_text())
    modes = a.modes.split(",")
    stats: dict[str, dict[str, list[float]]] = {m: {"ratio": [], "wall": [], "loops": [], "trials": []} for m in modes}
    for r in range(a.rounds):
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
            with tempfile.TemporaryDirectory() as tmp:
                data = {**base, "scaling": {**base["scaling"], "reuse_workers": mode == "warm"},
                        "tracking": {"uri": f"sqlite:///{tmp}/mlflow.db", "experiment": "demo"},
                        "storage_path": f"{tmp}/r", "data_dir": str(REPO / ".cache" / "datasets")}
                text = yaml.safe_dump(data)
                ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                         runtime_env={"env_vars": {"PYTHONPATH": str(REPO), **resources.LEAN_TRAIN_ENV}})
                try:
                    t0 = time.monotonic()
                    outcome = run_sweep(parse_spec(text), text, echo=lambda _: None)
                    wall = time.monotonic() - t0
                finally:
                    ray.shutdown()
            loops = [float(t.metrics["time/loop_total_s"]) for t in outcome.trials if "time/loop_total_s" in t.metrics]
            st = stats[mode]
            st["ratio"].append(wall / sum(loops))
            st["wall"].append(wall)
            st["loops"].append(sum(loops))
            st["trials"].append(len(loops))
            print(f"round {r + 1} {mode}: {len(loops)} trials, sweep {wall:.1f} s, loops {sum(loops):.1f} s, "
                  f"ratio {wall / sum(loops):.2f}", file=sys.stderr)
    fmt = lambda s: f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"  # noqa: E731
    print(table(["figure", *modes], [[k, *[fmt(summary(stats[m][k])) for m in modes]] for k in ("ratio", "wall", "loops")]))
    record("demo_ratio", f"benchmarks/demo_ratio.py --rounds {a.rounds} --modes {a.modes}",
           [{"mode": m, "figure": k, **summary(v)} for m in modes for k, v in stats[m].items()])


if __name__ == "__main__":
    main()
