"""Two-rank CPU trials that pin what the loop does (run under torchrun by tests/loop/test_loop_spine.py).

Each scenario's summary (rank 0): the final report's keys, its step and item counts, the number of
reports and the union of the interim reports' keys; for a failure, the exception type and where
the ranks stopped. Timings are left out: they differ run to run, the counts and keys must not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainables import contract
from trainables.contract import TrialConfig
from trainables.launch import leave
from trainables.loop import train
from trainables.reporting import ListReporter, keep_checkpoint

CPU = torch.device("cpu")
MLP = {"num_train_rows": 2048, "num_val_rows": 256}


class KeepingReporter(ListReporter):
    """Every report in memory and the latest checkpoint copied into `directory` (rank 0)."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
        if checkpoint_dir is not None:
            keep_checkpoint(checkpoint_dir, self.directory)
        super().report(metrics, None)


def _cfg(data_dir: str, **kw: Any) -> TrialConfig:
    base: dict[str, Any] = dict(workload="mlp-tabular", workload_params=MLP, batch_size=32, precision="32",
                                lr=1e-3, num_steps=8, num_warmup_steps=3, report_interval_s=1e-6,
                                telemetry_period_s=0, data_dir=data_dir)
    base.update(kw)
    return TrialConfig(**base)


def _summary(rep: ListReporter, final: dict[str, Any]) -> dict[str, Any]:
    counts = (contract.STEPS, contract.seen_key("samples"), contract.RESTORED_FROM, contract.STEPS_TO_TARGET,
              contract.EVALS, contract.WORLD_SIZE, contract.FINAL)
    return {"final_keys": sorted(final), "counts": {k: final[k] for k in counts if k in final},
            "reports": len(rep.reports),
            "interim_keys": sorted({k for r in rep.reports[:-1] for k in r})}


def _run(cfg: TrialConfig, rep: ListReporter | None = None, resume_from: str | None = None) -> dict[str, Any]:
    rep = rep if rep is not None else ListReporter()
    try:
        final = train(cfg, rep, CPU, resume_from=resume_from)
    except Exception as exc:  # noqa: BLE001 - the failure is what this scenario pins
        return {"error": type(exc).__name__, "where": list(getattr(exc, "sweeps_where", ())),
                "reports": len(rep.reports)}
    return _summary(rep, final)


def scenarios(data_dir: str, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["fixed"] = _run(_cfg(data_dir, grad_accum_steps=2, lr_schedule="cosine", lr_warmup_steps=2,
                             max_grad_norm=1.0))
    out["fixed_bf16"] = _run(_cfg(data_dir, precision="bf16-mixed", num_steps=5))
    out["fixed_fp16_scaler"] = _run(_cfg(data_dir, precision="16-mixed", num_steps=5, max_grad_norm=1.0))
    # equal data: batch 30 x accum 2 per rank, budget 1001 items over 2 ranks: the last step is cut
    out["equal_data_tail"] = _run(_cfg(data_dir, batch_size=30, grad_accum_steps=2, num_items=1001))
    mw = _run(_cfg(data_dir, num_steps=2, min_window_s=0.5, report_interval_s=10.0))
    out["min_window"] = {k: v for k, v in mw.items() if k not in ("counts", "reports")}  # steps: the clock's
    out["min_window"]["longer_than_num_steps"] = mw["counts"][contract.STEPS] > 2
    ckpt = work / "ckpt"
    out["checkpointed"] = _run(_cfg(data_dir, checkpoint_every_steps=4), KeepingReporter(ckpt))
    dist.barrier()
    out["resumed"] = _run(_cfg(data_dir, checkpoint_every_steps=4), resume_from=str(ckpt))
    out["probe_fits"] = _run(_cfg(data_dir, workload="tests.helpers.faulty:oom_on_rank1_above", workload_params={"limit": 64},
                                  probe=True, num_steps=3, num_warmup_steps=1))
    out["probe_oom"] = _run(_cfg(data_dir, workload="tests.helpers.faulty:oom_on_rank1_above", workload_params={"limit": 16},
                                 probe=True, num_steps=3, num_warmup_steps=1))
    out["target"] = _run(_cfg(data_dir, num_steps=40, eval_every_steps=4, target_metric=contract.LOSS_VAL,
                              target_max=10.0))
    out["target_curve"] = _run(_cfg(data_dir, num_steps=12, eval_every_steps=4, target_metric=contract.LOSS_VAL,
                                    target_max=1e-9, report_evals=True, report_interval_s=10.0))
    return out


def main() -> None:
    dist.init_process_group("gloo")
    data_dir, path = sys.argv[1], Path(sys.argv[2])
    work = path.parent / "work"  # one folder both ranks see: rank 0 writes the checkpoint, every rank resumes
    result = scenarios(data_dir, work)
    if dist.get_rank() == 0:
        path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    dist.barrier()  # as trainables.launch: no rank tears the group down while a peer is still in it
    dist.destroy_process_group()
    # Every scenario has run and rank 0 wrote them. Under load, one process in a few aborted in the
    # interpreter's teardown after that ("terminate called without an active exception", no Python
    # frame: a C++ thread left joinable at exit, after a dozen trainings in one process): skip the
    # teardown, which is not what this harness pins.
    leave(0)


if __name__ == "__main__":
    main()
