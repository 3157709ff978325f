"""Does the memory probe find the true frontier, and in how many candidates?

One warm pool (2 gloo workers) serves every probe; the workload `tests.helpers.faulty:oom_on_rank1_above`
runs out of memory on rank 1 only (an injected limit) above `limit` samples per rank. For each
limit and precision, the probe's answer is compared with the truth (the largest candidate <= limit)
and its number of candidates with ceil(log2(n)) + 1 (n batch sizes in the space).

    .venv/bin/python benchmarks/probe_frontier.py [--limits 4 48 300 5000]
"""

from __future__ import annotations

import argparse
import math
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, record, table

SPEC = """\
name: probe-bench
trainable: {{name: 'tests.helpers.faulty:oom_on_rank1_above', params: {{limit: {limit}}}}}
space:
  batch_size: {{type: categorical, choices: {choices}}}
  precision: {{type: categorical, choices: ["32", "bf16-mixed"]}}
search: {{probe_batch_size: true}}
budget: {{num_trials: 1, num_steps: 4}}
"""
CHOICES = [8, 16, 32, 64, 128, 256, 512, 1024]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limits", type=int, nargs="+", default=[4, 48, 300, 5000])
    a = ap.parse_args()
    import ray

    from sweeps.service import resources
    from sweeps.service.pool import WarmPool
    from sweeps.service.probe import probe_frontier
    from sweeps.spec import parse_spec

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), **resources.LEAN_TRAIN_ENV}})
    rows, out = [], []
    budget = math.ceil(math.log2(len(CHOICES))) + 1
    try:
        pool = WarmPool(parse_spec(SPEC.format(limit=1, choices=CHOICES)), "/tmp/probe-bench", uuid.uuid4().hex)
        try:
            for limit in a.limits:
                lines: list[str] = []
                probe_frontier(parse_spec(SPEC.format(limit=limit, choices=CHOICES)), pool.queue, uuid.uuid4().hex,
                               lines.append)
                truth = max((c for c in CHOICES if c <= limit), default=None)
                for line in lines:
                    precision = line.split(":")[0].removeprefix("memory probe ")
                    found_text = line.split("fits ")[1].split(",")[0].split(" ")[0]
                    found = None if found_text == "none" else int(found_text)
                    tried = int(line.split("(")[1].split(" of ")[0])
                    rows.append({"limit": limit, "precision": precision, "truth": truth, "found": found,
                                 "candidates_tried": tried, "n": len(CHOICES), "budget": budget})
                    out.append([str(limit), precision, str(truth), str(found), f"{tried} (<= {budget})"])
        finally:
            pool.join()
    finally:
        ray.shutdown()
    print(table(["limit", "precision", "true frontier", "found", "candidates tried"], out))
    record("probe_frontier", "benchmarks/probe_frontier.py --limits " + " ".join(map(str, a.limits)), rows)


if __name__ == "__main__":
    main()
