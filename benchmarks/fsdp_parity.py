"""Loop parity for the sharded strategies on CPU: our loop against a hand-written FSDP2 loop, side by side.

Per round, in alternating order: our loop (`trainables.launch --strategy fsdp` under torchrun: the sweep's per-rank
loop, with its telemetry, reports and the one-sample memory measurement in the build) and `benchmarks/plain_fsdp.py`
(FSDP2 set up by hand, torchtitan's order), the same GPT, micro-batch, precision, activation checkpointing, steps
and 2 gloo ranks x 1 thread. Throughput is each side's steady state (after warm-up, summed over ranks); the ratio is
per round, ours / plain (goal >= 0.98 on a GPU, as for DDP; on a CPU gloo's reduce-scatter is an all-reduce
underneath, so the absolute speed says nothing about FSDP2 on GPUs: only the ratio, the loops' own overhead, does).

    .venv/bin/python benchmarks/fsdp_parity.py [--rounds 3] [--steps 60] [--ac none|full]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, record, run_loop, run_plain, summary, table  # noqa: E402

PARAMS = {"n_layer": 4, "n_embd": 128, "seq_len": 128}
BATCH, WARMUP = 8, 5


def _same(steps: int, ac: str, data_dir: str) -> list[str]:
    return ["--workload", "gpt-lm", "--params", json.dumps(PARAMS), "--batch-size", str(BATCH), "--precision",
            "bf16-mixed", "--num-steps", str(steps), "--num-warmup-steps", str(WARMUP), "--strategy", "fsdp",
            "--activation-checkpointing", ac, "--data-dir", data_dir]


def ours(steps: int, ac: str, data_dir: str) -> float:
    final = run_loop([*_same(steps, ac, data_dir), "--telemetry-period-s", "1.0"], nproc=2)
    return float(final["throughput/tokens_per_s"])


def plain(steps: int, ac: str, data_dir: str) -> float:
    return float(run_plain("plain_fsdp.py", [*_same(steps, ac, data_dir), "--threads", "1"])["throughput"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60, help="measured steps per run")
    ap.add_argument("--ac", choices=("none", "full"), default="none", help="activation checkpointing on both sides")
    args = ap.parse_args()
    data_dir = str(REPO / ".cache" / "datasets")
    plain(5, args.ac, data_dir)  # the token shards once, outside the measurement
    runs: dict[str, list[float]] = {"ours": [], "plain": []}
    sides = {"ours": ours, "plain": plain}
    for r in range(args.rounds):
        for side in (["ours", "plain"] if r % 2 == 0 else ["plain", "ours"]):
            runs[side].append(sides[side](args.steps, args.ac, data_dir))
            print(f"round {r + 1} {side}: {runs[side][-1]:.0f} tokens/s", flush=True)
    ratios = [a / b for a, b in zip(runs["ours"], runs["plain"], strict=True)]
    fmt = lambda s: f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})"  # noqa: E731
    print(table(["side", "tokens/s median (min-max)"], [[k, fmt(summary(v))] for k, v in runs.items()]))
    print(f"parity ours/plain per round: {fmt(summary(ratios))}  (goal >= 0.98 on a GPU)")
    rows: list[dict[str, Any]] = [{"side": k, **summary(v), "values": v} for k, v in runs.items()]
    rows.append({"ratio": "ours/plain", **summary(ratios), "values": ratios, "formula": "per round: ours / plain"})
    record("fsdp_parity", f"benchmarks/fsdp_parity.py --rounds {args.rounds} --steps {args.steps} --ac {args.ac}",
           rows)


if __name__ == "__main__":
    main()
