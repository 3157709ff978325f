"""The README's first picture: GPT-2 small on one NVIDIA H200 (2026-11-26, project commit bf89804), tokens per second
by precision x batch size, drawn by the report's own heatmap (`sweeps.results.plots`) from the trials as that run's
MLflow store held them (`h200-2026-11-26/trials-h200-2026-11-26.json`; results.jsonl line 60). Nothing is
estimated: each cell is one measured trial.

    .venv/bin/python benchmarks/gpu/readme_figure.py   # writes docs/img/h200-gpt2-throughput-heatmap.png
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend

from sweeps.results.outcome import TrialRow  # noqa: E402
from sweeps.results.plots import _heatmap  # noqa: E402 - the report's own figure, drawn from recorded trials

HERE = Path(__file__).resolve().parent
OUT = HERE.parents[1] / "docs" / "img" / "h200-gpt2-throughput-heatmap.png"
METRIC = "throughput/tokens_per_s"


def main() -> None:
    recorded = json.loads((HERE / "h200-2026-11-26" / "trials-h200-2026-11-26.json").read_text())
    rows = [TrialRow(t["run"], i, {"precision": t["precision"], "batch_size": int(t["batch_size"])}, status="ok",
                     metrics={METRIC: float(t[METRIC])})
            for i, t in enumerate(recorded["sweeps"]["gpu-gpt"], 1) if t["status"] == "FINISHED"]
    fig = _heatmap(plt, rows, METRIC, "tokens/s (1 GPU)",
                   "GPT-2 small (124M), 1x NVIDIA H200, 2026-11-26\ntokens/s by precision x batch size", True)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT} from {len(rows)} trials")


if __name__ == "__main__":
    main()
