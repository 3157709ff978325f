"""Sweep figures (matplotlib PNG) and a self-contained HTML summary, logged on the parent run.

Figures: throughput vs batch size per precision; peak GPU memory vs batch size per precision;
throughput vs dataloader workers; validation loss vs throughput with the Pareto front; the best
trial's utilisation timeline. A figure whose data was not measured (GPU memory on a CPU) is
left out and the summary says so, rather than drawing zeros.
"""

from __future__ import annotations

import base64
import html
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sweeps.outcome import pareto_rows
from sweeps.report import SweepOutcome, TrialRow, best_fragment, pareto_records, trials_table

_MEMORY = "memory/max_reserved_gib"
_LOSS = "loss/val"
_UTIL = ("gpu/util_mean_pct", "cpu/worker_util_mean_pct")


def _by_precision(rows: list[TrialRow], x: str, y: str) -> dict[str, list[tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for t in rows:
        if y in t.metrics and x in t.params:
            series[str(t.params.get("precision"))].append((float(t.params[x]), float(t.metrics[y])))
    return {k: sorted(v) for k, v in series.items()}


def _scatter_lines(ax: Any, series: dict[str, list[tuple[float, float]]], higher_is_better: bool) -> None:
    """Every trial as a point; a line through the best trial at each x, per precision."""
    for name, pts in sorted(series.items()):
        dots = ax.scatter([p[0] for p in pts], [p[1] for p in pts], alpha=0.5)
        best: dict[float, float] = {}
        for x, y in pts:
            best[x] = max(best.get(x, y), y) if higher_is_better else min(best.get(x, y), y)
        xs = sorted(best)
        ax.plot(xs, [best[x] for x in xs], "-o", color=dots.get_facecolor()[0], label=f"precision {name}")
    xs_all = [p[0] for pts in series.values() for p in pts]
    if xs_all and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 4:
        ax.set_xscale("log", base=2)
    ax.legend()
    ax.grid(alpha=0.3)


def figures(outcome: SweepOutcome, history: Callable[[str, str], list[tuple[int, float]]]) -> tuple[dict[str, Any], list[str]]:
    """{file name: matplotlib figure} and the figures left out with why."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [t for t in outcome.trials if t.status == "ok"]
    metric = outcome.spec.objective.primary
    tput = next((k for k in (metric, "throughput/samples_per_s", "throughput/tokens_per_s") if k.startswith("throughput/")
                 and any(k in t.metrics for t in ok)), None)
    figs: dict[str, Any] = {}
    skipped: list[str] = []
    if tput is None:
        return figs, ["all figures: no trial finished with a throughput"]

    for name, x, y, xlabel, ylabel, title in (
        ("throughput_vs_batch_size.png", "batch_size", tput, "batch size per worker", tput, "throughput vs batch size"),
        ("memory_vs_batch_size.png", "batch_size", _MEMORY, "batch size per worker", "peak reserved GPU memory (GiB)",
         "peak GPU memory vs batch size"),
        ("throughput_vs_loader_workers.png", "num_dataloader_workers", tput, "dataloader workers per rank", tput,
         "throughput vs dataloader workers"),
    ):
        series = _by_precision(ok, x, y)
        if not series:
            skipped.append(f"{name}: {y} was not measured (no GPU)" if y == _MEMORY else f"{name}: no data")
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        _scatter_lines(ax, series, higher_is_better=y != _MEMORY)
        ax.set(xlabel=xlabel, ylabel=ylabel, title=f"{outcome.spec.name}: {title}")
        figs[name] = fig

    obj = outcome.spec.objective
    (x, y), modes = (obj.metrics[:2], obj.modes[:2]) if obj.multi else ((tput, _LOSS), ("max", "min"))
    pts = [t for t in ok if x in t.metrics and y in t.metrics]
    if pts:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.scatter([t.metrics[x] for t in pts], [t.metrics[y] for t in pts], label="trials", alpha=0.7)
        front = sorted(pareto_rows(pts, (x, y), modes), key=lambda t: t.metrics[x])
        ax.plot([t.metrics[x] for t in front], [t.metrics[y] for t in front], "r-o", label="Pareto front")
        for t in front:
            ax.annotate(f"{t.number}", (t.metrics[x], t.metrics[y]), textcoords="offset points", xytext=(4, 4))
        ax.set(xlabel=x, ylabel=y, title=f"{y} vs {x}")
        ax.legend()
        ax.grid(alpha=0.3)
        figs["pareto_front.png" if obj.multi else "loss_vs_throughput.png"] = fig

    best = outcome.best
    key = next((k for k in _UTIL if best is not None and k in best.metrics), None)
    if best is not None and best.run_id and key:
        series_pts = history(best.run_id, key)
        if len(series_pts) < 3:
            skipped.append(f"best_trial_utilisation.png: only {len(series_pts)} report(s) in the best trial's window "
                           "(budget.report_interval_s is longer than the trial); lower it for a timeline")
        else:
            fig, ax = plt.subplots(figsize=(6, 3))
            ax.plot([s for s, _ in series_pts], [v for _, v in series_pts], "o-")
            ax.set(xlabel="measured step", ylabel=key, title=f"best trial {best.number}: utilisation", ylim=(0, None))
            ax.grid(alpha=0.3)
            figs["best_trial_utilisation.png"] = fig
    return figs, skipped


def summary_html(outcome: SweepOutcome, images: dict[str, bytes], skipped: list[str]) -> str:
    """One HTML file with the figures embedded (opens in MLflow's artifact viewer)."""
    spec = outcome.spec
    imgs = "\n".join(f'<figure><img alt="{html.escape(n)}" src="data:image/png;base64,{base64.b64encode(b).decode()}">'
                     f"<figcaption>{html.escape(n)}</figcaption></figure>" for n, b in images.items())
    notes = "".join(f"<li>{html.escape(s)}</li>" for s in skipped)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(spec.name)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}} pre{{background:#f4f4f4;padding:1em;overflow-x:auto}}
figure{{display:inline-block;margin:0.5em}} img{{max-width:520px}}</style></head><body>
<h1>Sweep {html.escape(spec.name)}</h1><p>{html.escape(spec.description)}</p>
<p>Objective: <code>{html.escape(spec.objective.describe())}</code>;
{len(outcome.ranked())}/{len(outcome.trials)} trials finished.</p>
<h2>Trials</h2><pre>{html.escape(trials_table(outcome))}</pre>
<h2>Best configuration</h2><pre>{html.escape(best_fragment(outcome))}</pre>
<h2>Figures</h2>{imgs}{f"<h3>Not drawn</h3><ul>{notes}</ul>" if notes else ""}
</body></html>"""


def write_pareto(outcome: SweepOutcome, target: Path) -> None:
    """pareto.json and pareto.csv: the front of a multi-objective sweep, else the best trial."""
    import csv
    import json

    records = pareto_records(outcome)
    (target / "pareto.json").write_text(json.dumps(records, indent=2, default=str))
    with open(target / "pareto.csv", "w", newline="") as f:
        fields = list(records[0]) if records else ["trial"]
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(records)


def publish(outcome: SweepOutcome, client: Any, out_dir: Path | None = None, log: bool = True) -> Path:
    """Write the figures and summary.html; log them under `report/` on the parent run."""
    import matplotlib.pyplot as plt

    def history(run_id: str, key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]

    target = out_dir or Path(tempfile.mkdtemp(prefix="sweep-report-"))
    target.mkdir(parents=True, exist_ok=True)
    figs, skipped = figures(outcome, history)
    images: dict[str, bytes] = {}
    for name, fig in figs.items():
        fig.tight_layout()
        fig.savefig(target / name, dpi=100)
        plt.close(fig)
        images[name] = (target / name).read_bytes()
    (target / "summary.html").write_text(summary_html(outcome, images, skipped))
    write_pareto(outcome, target)
    if log:
        client.log_artifacts(outcome.parent_run_id, str(target), "report")
    return target
