"""What the service prints and logs, pinned while its house is rebuilt (issue 42): the demo's validated
spec, its planned cost, a trial's resolved config and MLflow params, the table, answer and best-config
fragment of a fixed demo-shaped outcome, the verdicts of a fixed set of trials, the spec's refusals and
the torchrun launcher's flags -- the same before and after every move
(tests/data/pinned_outputs.json, written by the code before the move; SWEEPS_WRITE_GOLDEN=1 rewrites it
when a change is meant, said in its commit)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "pinned_outputs.json"
TPUT = "throughput/samples_per_s"

BAD = {
    "unknown space key": "space: {batchsize: 32}",
    "lr not positive": "space: {lr: {type: float, low: 0, high: 1}}",
    "prefetch below 1": "space: {prefetch_factor: 0}",
    "float batch": "space: {batch_size: {type: float, low: 1, high: 8}}",
    "bad precision": "space: {precision: fp8}",
    "bad schedule": "space: {lr_schedule: linear}",
    "accum as text": "space: {grad_accum_steps: '2'}",
    "two lengths": "budget: {num_trials: 1, num_steps: 2, num_samples: 8}",
    "grid size": "search: {algorithm: grid}\nspace: {batch_size: {type: categorical, choices: [1, 2]}}",
    "es multi": "objective: {metric: [throughput/samples_per_s, loss/val], mode: [max, min]}\n"
                "search: {early_stopping: {grace_steps: 1}}",
    "target without eval": "objective: {metric: time/to_target_s, target: {metric: loss/val, max: 1.0}}",
    "probe without search": "search: {probe_batch_size: true}",
    "workers twice": "space: {num_workers: 2}\nscaling: {num_workers: 2}",
}


def _outcome() -> Any:
    from sweeps.results.outcome import SweepOutcome, TrialRow
    from sweeps.results.verdict import verdict
    from sweeps.spec import parse_spec

    spec = parse_spec((REPO / "examples" / "demo.yaml").read_text())
    rows = []
    grid = [("32", 16, 0, 1010.0), ("32", 16, 1, 980.0), ("32", 64, 0, 1100.0), ("32", 64, 1, 1500.0),
            ("bf16-mixed", 16, 0, 1700.0), ("bf16-mixed", 16, 1, 1650.0), ("bf16-mixed", 64, 0, 1900.0),
            ("bf16-mixed", 64, 1, 2300.0)]
    for i, (precision, batch, loaders, tput) in enumerate(grid, 1):
        params = {"batch_size": batch, "global_batch_size": 2 * batch, "precision": precision, "lr": 0.001,
                  "num_dataloader_workers": loaders, "pin_memory": False, "prefetch_factor": 2,
                  "persistent_workers": True, "compile": False, "num_workers": 2, "cpus_per_worker": 1,
                  "cpus_per_loader_worker": 0.0, "use_gpu": False, "workload": "image-cnn"}
        metrics = {TPUT: tput, "throughput/samples_per_s_cv_pct": 3.0 + i / 10, "loss/val": 2.0 + i / 100,
                   "time/step_ms": 20.0 + i, "time/data_wait_pct": 30.0 - 3 * i, "cpu/worker_util_mean_pct": 60.0 + 5 * i,
                   "cpu/loader_util_mean_pct": 40.0 * loaders, "perf/sol_pct": 10.0 + i,
                   "device/cpu_isa": "avx2 avx512f avx512_bf16", "device/type": "cpu"}
        rows.append(TrialRow(f"t{i}", i, params, f"run{i}", "ok", "", str(verdict(metrics, params)), metrics))
    rows.append(TrialRow("t9", 9, {**rows[0].params, "batch_size": 256}, "run9", "oom", "rank 0: OutOfMemoryError: x"))
    return SweepOutcome(spec, "parent", "sqlite:///mlflow.db", rows, 61.0)


def pinned() -> dict[str, Any]:
    from sweeps.results.report import answer, best_fragment, trials_table
    from sweeps.results.verdict import revise_verdicts
    from sweeps.service.progress import planned_cost
    from sweeps.spec import SpecError, parse_spec

    out: dict[str, Any] = {}
    demo_text = (REPO / "examples" / "demo.yaml").read_text()
    spec = parse_spec(demo_text)
    out["demo spec"] = json.loads(spec.model_dump_json())
    out["planned"] = planned_cost(spec, 8.0)
    try:
        from sweeps.search.trials import resolve_trial, trial_params
    except ImportError:  # after the move
        from sweeps.search.searcher.trials import resolve_trial, trial_params  # type: ignore[no-redef]
    cfg = resolve_trial(spec, {"precision": "bf16-mixed", "batch_size": 64, "num_dataloader_workers": 1})
    out["trial config"] = cfg.to_dict()
    out["trial params"] = {k: str(v) for k, v in trial_params(spec, cfg).items()}
    outcome = _outcome()
    out["verdicts"] = [t.verdict for t in outcome.trials]
    revise_verdicts(outcome)
    out["revised"] = [t.verdict for t in outcome.trials]
    out["table"] = trials_table(outcome)
    out["answer"] = answer(outcome)
    out["fragment"] = best_fragment(outcome)
    refusals = {}
    head = "name: b\ntrainable: {name: mlp-tabular}\n"
    for name, body in BAD.items():
        text = head + body + ("\n" if "budget:" in body else "\nbudget: {num_trials: 1, num_steps: 2}\n")
        try:
            parse_spec(text)
            refusals[name] = "accepted"
        except SpecError as exc:
            refusals[name] = [str(p) for p in exc.problems]
    out["refusals"] = refusals
    from trainables.launch import _parse

    _, launched = _parse(["--workload", "mlp-tabular", "--prefetch-factor", "3", "--no-persistent-workers",
                          "--pin-memory", "--lr-schedule", "cosine", "--grad-accum-steps", "2"])
    out["launched"] = {k: v for k, v in launched.to_dict().items() if k != "use_gpu"}
    return out


def test_the_service_says_and_resolves_what_it_did_before_the_move() -> None:
    got = json.loads(json.dumps(pinned(), default=str))
    if os.environ.get("SWEEPS_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key] == want[key], key
