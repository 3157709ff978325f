"""Time to quality, measured and predicted: `examples/time_to_target.yaml` (gpt-lm tiny, batch size x
precision, equal token budget, target loss/val) as a real sweep, then per trial the measured
`time/to_target_s`, the noise-scale model's `predict/time_to_target_s` (leave-one-out, see
sweeps/quality.py) and their error, and the Spearman rank correlation between the two.

    .venv/bin/python benchmarks/time_to_target.py [--target 2.3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, record, table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", type=float, default=None, help="override the spec's loss/val target")
    a = ap.parse_args()
    import ray
    import yaml

    from sweeps.results.quality import prediction_error, spearman
    from sweeps.service import resources
    from sweeps.service.runner import run_sweep
    from sweeps.spec import parse_spec

    data = yaml.safe_load((REPO / "examples" / "time_to_target.yaml").read_text())
    if a.target is not None:
        data["objective"]["target"]["max"] = a.target
    (REPO / ".cache").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=REPO / ".cache") as tmp:
        data.update(tracking={"uri": f"sqlite:///{tmp}/mlflow.db", "experiment": "ttt"}, storage_path=f"{tmp}/r",
                    data_dir=str(REPO / ".cache" / "datasets"))
        text = yaml.safe_dump(data)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(REPO), **resources.LEAN_TRAIN_ENV}})
        try:
            outcome = run_sweep(parse_spec(text), text, echo=lambda _: None)
        finally:
            ray.shutdown()
    rows, pairs = [], []
    for t in outcome.trials:
        m = t.metrics
        measured, predicted, err = m.get("time/to_target_s"), m.get("predict/time_to_target_s"), prediction_error(t)
        rows.append({"trial": t.number, "batch_size": t.params["batch_size"], "precision": t.params["precision"],
                     "global_batch_size": t.params["global_batch_size"], "lr_effective": t.params["lr_effective"],
                     "status": t.status, "time_to_target_s": measured, "predicted_s": predicted, "rel_error": err,
                     "steps_to_target": m.get("progress/steps_to_target"), "grad_noise_scale": m.get("stats/grad_noise_scale"),
                     "step_ms": m.get("time/step_ms"), "loss_val": m.get("loss/val")})
        if measured is not None and predicted is not None:
            pairs.append((measured, predicted))
    rho = spearman([p[0] for p in pairs], [p[1] for p in pairs])
    best_measured = min(pairs, key=lambda p: p[0]) if pairs else None
    best_predicted = min(pairs, key=lambda p: p[1]) if pairs else None
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    print(table(["trial", "batch", "precision", "lr_eff", "status", "measured s", "predicted s", "error", "steps",
                 "B_noise (tokens)", "step ms"],
                [[str(r["trial"]), str(r["batch_size"]), r["precision"], fmt(r["lr_effective"], ".4g"), r["status"],
                  fmt(r["time_to_target_s"], ".2f"), fmt(r["predicted_s"], ".2f"),
                  fmt(None if r["rel_error"] is None else 100 * r["rel_error"], "+.0f") + "%",
                  fmt(r["steps_to_target"], ".0f"), fmt(r["grad_noise_scale"], ".0f"), fmt(r["step_ms"], ".1f")]
                 for r in rows]))
    print(f"\nSpearman rank correlation measured vs predicted over {len(pairs)} trials: {fmt(rho, '.2f')}; "
          f"best by measured == best by predicted: {best_measured is best_predicted}")
    record("time_to_target", "python benchmarks/time_to_target.py " + " ".join(sys.argv[1:]),
           [{"trials": rows, "spearman": rho, "n": len(pairs), "same_best": best_measured is best_predicted}])


if __name__ == "__main__":
    main()
