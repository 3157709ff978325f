"""Two ranks under plain torchrun, rank 0's checkpoint hand-off slowed (run by tests/loop/test_loop.py).

Rank 0 takes `SLOW_S` to hand on each checkpoint while rank 1, whose report is instant, goes on to its next
step and waits there for rank 0. Prints rank 0's view of the final report as JSON: `time/window_s` (max over
ranks) and how many checkpoints were handed on. argv: data_dir, checkpoints (1: every 4 measured steps, 0: none).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from trainables import contract
from trainables.contract import TrialConfig
from trainables.launch import leave
from trainables.loop import train
from trainables.reporting import ListReporter

SLOW_S = 2.0  # 3 hand-offs: 6 s a leaking window would count, far above a busy machine's stalls (CI runs 2 tests at once)


class SlowCheckpointReporter(ListReporter):
    def __init__(self) -> None:
        super().__init__()
        self.checkpoints = 0

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        if checkpoint_dir is not None:  # rank 0 only
            self.checkpoints += 1
            time.sleep(SLOW_S)
        super().report(metrics, None)


def main() -> None:
    dist.init_process_group("gloo")
    data_dir, every = sys.argv[1], int(sys.argv[2]) * 4
    cfg = TrialConfig(workload="mlp-tabular", workload_params={"num_train_rows": 2048, "num_val_rows": 256},
                      batch_size=32, precision="32", lr=1e-3, num_steps=16, num_warmup_steps=3, report_interval_s=10.0,
                      telemetry_period_s=0, data_dir=data_dir, checkpoint_every_steps=every)
    rep = SlowCheckpointReporter()
    final = train(cfg, rep, torch.device("cpu"))
    if dist.get_rank() == 0:
        print(json.dumps({"window_s": final[contract.WINDOW_S], "checkpoints": rep.checkpoints}), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    leave(0)  # skip a gloo teardown that can abort at exit under load


if __name__ == "__main__":
    main()
