"""Loop parity and reporting overhead, side by side in one run.

Per round, in this order (rotated every round so no variant always runs first):
- A:  our loop (`trainables.loop`) in a real Ray Train `TorchTrainer`, 2 gloo workers x 1 thread,
      reporting at the default cadence (`report_interval_s` 10; with --steps 300 the window is ~13 s here),
- A0: the same with no interim reports (only the final one),
- B:  a hand-written DDP loop of the same step under `torchrun` (`benchmarks/plain_ddp.py`),
      same workload, batch, world size and threads per rank.
Throughput is each side's steady state (after warm-up, summed over ranks). Ratios are per round:
parity A/B (goal >= 0.98), reporting overhead A0/A (goal <= 1.02).

    .venv/bin/python benchmarks/loop_parity.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, record, run_plain, summary, table

WORKLOAD = "image-cnn"
PARAMS = {"image_size": 32, "num_train_images": 2048, "num_val_images": 64, "width": 8}
BATCH, WARMUP = 32, 10


def ray_train(steps: int, report_interval_s: float, data_dir: str) -> float:
    from sweeps.service.trial import make_trainer
    from sweeps.spec import ScalingSpec
    from trainables.contract import TrialConfig

    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrialConfig(workload=WORKLOAD, workload_params=PARAMS, batch_size=BATCH, precision="32", lr=1e-3,
                          num_steps=steps, num_warmup_steps=WARMUP, report_interval_s=report_interval_s,
                          telemetry_period_s=1.0, threads_per_worker=1, data_dir=data_dir,
                          metrics_path=str(Path(tmp) / "m.jsonl"))
        make_trainer(cfg, ScalingSpec(num_workers=2), f"parity-{os.getpid()}", str(Path(tmp) / "runs"), []).fit()
        lines = (Path(tmp) / "m.jsonl").read_text().splitlines()
        return float(json.loads(lines[-1])["throughput/samples_per_s"])


def plain_torchrun(steps: int, data_dir: str) -> float:
    args = ["--workload", WORKLOAD, "--params", json.dumps(PARAMS), "--batch-size", str(BATCH), "--num-steps",
            str(steps), "--num-warmup-steps", str(WARMUP), "--threads", "1", "--data-dir", data_dir]
    return float(run_plain("plain_ddp.py", args)["throughput"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300, help="measured steps per run")
    args = parser.parse_args()
    import ray

    data_dir = str(REPO / ".cache" / "datasets")
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}},
             log_to_driver=False)
    runs: dict[str, list[float]] = {"A": [], "A0": [], "B": []}
    variants = {
        "A": lambda: ray_train(args.steps, 10.0, data_dir),
        "A0": lambda: ray_train(args.steps, 1e9, data_dir),
        "B": lambda: plain_torchrun(args.steps, data_dir),
    }
    try:
        plain_torchrun(20, data_dir)  # generate the dataset once, outside the measurement
        order = ["A", "A0", "B"]
        for r in range(args.rounds):
            for name in order[r % 3:] + order[:r % 3]:
                runs[name].append(variants[name]())
                print(f"round {r + 1} {name}: {runs[name][-1]:.1f} samples/s", flush=True)
    finally:
        ray.shutdown()
    parity = [a / b for a, b in zip(runs["A"], runs["B"], strict=True)]
    overhead = [a0 / a for a0, a in zip(runs["A0"], runs["A"], strict=True)]
    fmt = lambda s: f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})"  # noqa: E731
    rows = [[k, fmt(summary(v)).replace(".000", "")] for k, v in runs.items()]
    print(table(["variant", "samples/s median (min-max)"], rows))
    print(f"parity A/B per round: {fmt(summary(parity))}  (goal >= 0.98)")
    print(f"reporting overhead A0/A per round: {fmt(summary(overhead))}  (goal <= 1.02)")
    result: list[dict[str, Any]] = [{"variant": k, **summary(v), "values": v} for k, v in runs.items()]
    result += [{"ratio": "parity A/B", **summary(parity)}, {"ratio": "reporting A0/A", **summary(overhead)}]
    record("loop_parity", f"benchmarks/loop_parity.py --rounds {args.rounds} --steps {args.steps}", result)


if __name__ == "__main__":
    main()
