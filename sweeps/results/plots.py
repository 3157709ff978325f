"""Sweep figures (matplotlib PNG), logged with `summary.html` (`summary_page`) on the parent run under `report/`.

Figures: throughput vs batch size per precision (batch sizes on a log2 axis, ticks at the sizes
that ran); a precision x batch size heat map of throughput, and of peak GPU memory where it was
measured; where each trial's step time went (waiting for data, host-to-device copy, the rest);
throughput vs dataloader workers; throughput and scaling efficiency against ranks, one line per
configuration (where the worker count was searched); the objective's trade-off with the Pareto front, points labelled
by trial number; the best trial's utilisation timeline. A figure whose data was not measured (GPU
memory on a CPU) is left out and the summary says so, rather than drawing zeros. Every figure is
readable from 2 trials to hundreds: bars show the best `TOP_N`, labels thin out, heat-map columns
bin to powers of two.
"""

from __future__ import annotations

import math
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sweeps.results.outcome import NOT_SPEED, SweepOutcome, TrialRow, pareto_rows
from sweeps.results.quality import throughput, workers
from sweeps.results.report import (
    knob_split,
    pareto_records,
)
from sweeps.results.summary_page import summary_html
from trainables.contract import (
    CPU_WORKER_PCT,
    DATA_WAIT_PCT,
    GPU_MEM_PEAK_GIB,
    GPU_UTIL_MEAN_PCT,
    H2D_COPY_PCT,
    LOSS_VAL,
    MEM_MAX_RESERVED_GIB,
    SCALING_EFFICIENCY_PCT,
    THROUGHPUT_PREFIX,
    TRACE_COMPUTE_PCT,
    TRACE_DATA_WAIT_PCT,
    TRACE_EXPOSED_PCT,
    TRACE_IDLE_PCT,
    throughput_key,
)

_UTIL = (GPU_UTIL_MEAN_PCT, CPU_WORKER_PCT)
TOP_N = 40  # bars drawn at most (the best by the objective)
MAX_LABELS = 25  # tick or point labels drawn at most
MAX_COLUMNS = 12  # heat-map batch-size columns before they are binned to powers of two



def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _thin(values: list[Any], at_most: int = MAX_LABELS) -> list[Any]:
    """Every k-th value, so that at most `at_most` remain (always the first)."""
    step = max(1, math.ceil(len(values) / at_most))
    return values[::step]


def _by_precision(rows: list[TrialRow], x: str, y: str) -> dict[str, list[tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for t in rows:
        xv, yv = _num(t.params.get(x)), _num(t.metrics.get(y))
        if xv is not None and yv is not None:
            series[str(t.params.get("precision"))].append((xv, yv))
    return {k: sorted(v) for k, v in series.items()}


def _value_axis(ax: Any, xs: list[float], log2: bool) -> None:
    """Ticks at the values that ran; when there are many, at the powers of two between them (log2 axis for
    batch sizes)."""
    from matplotlib.ticker import NullLocator

    ran = sorted(set(xs))
    if log2 and ran and ran[0] > 0:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
    if len(ran) > MAX_COLUMNS and log2 and ran and ran[0] > 0:
        ticks = [2.0 ** k for k in range(math.ceil(math.log2(ran[0])), math.floor(math.log2(ran[-1])) + 1)]
    else:
        ticks = _thin(ran, MAX_COLUMNS)
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{v:g}" for v in ticks])


def _scatter_lines(ax: Any, series: dict[str, list[tuple[float, float]]], higher_is_better: bool, log2: bool) -> None:
    """Every trial as a point; a line through the best trial at each x, per precision (few x values only:
    with many, a line through them zig-zags with the other knobs)."""
    for name, pts in sorted(series.items()):
        dots = ax.scatter([p[0] for p in pts], [p[1] for p in pts], alpha=0.5, s=18, label=f"precision {name}")
        best: dict[float, float] = {}
        for x, y in pts:
            best[x] = max(best.get(x, y), y) if higher_is_better else min(best.get(x, y), y)
        xs = sorted(best)
        if len(xs) <= MAX_COLUMNS:
            dots.set_label(None)
            ax.plot(xs, [best[x] for x in xs], "-o", color=tuple(dots.get_facecolor()[0][:3]),
                    label=f"precision {name} (best per size)" if len(pts) > len(xs) else f"precision {name}")
    _value_axis(ax, [p[0] for pts in series.values() for p in pts], log2)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def _short(v: float) -> str:
    """A cell's value in at most 4 characters a reader takes in at once: 375k, 2.3M, 980, 0.53."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e4, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}" if scale > 1e4 else f"{v / 1e3:.0f}k"
    return f"{v:.3g}"


def _heatmap(plt: Any, rows: list[TrialRow], metric: str, label: str, title: str, higher_is_better: bool) -> Any:
    """Precision (rows) x batch size (columns): the best trial of each cell, annotated."""
    cells: dict[tuple[str, float], list[float]] = defaultdict(list)
    batches = sorted({b for t in rows if (b := _num(t.params.get("batch_size"))) is not None and b > 0})
    binned = len(batches) > MAX_COLUMNS
    for t in rows:
        b, v = _num(t.params.get("batch_size")), _num(t.metrics.get(metric))
        if b is not None and b > 0 and v is not None:
            cells[(str(t.params.get("precision")), 2.0 ** math.floor(math.log2(b)) if binned else b)].append(v)
    if not cells:
        return None
    precisions = sorted({p for p, _ in cells})
    columns = sorted({b for _, b in cells})
    pick = max if higher_is_better else min
    grid = [[pick(cells[(p, b)]) if (p, b) in cells else math.nan for b in columns] for p in precisions]
    fig, ax = plt.subplots(figsize=(max(4.5, 1.0 + 0.9 * len(columns)), max(2.6, 1.4 + 0.7 * len(precisions))))
    image = ax.imshow(grid, cmap="viridis" if higher_is_better else "viridis_r", aspect="auto")
    fig.colorbar(image, ax=ax, label=label)
    ax.set_xticks(range(len(columns)), [f"{b:g}" + ("+" if binned else "") for b in columns])
    ax.set_yticks(range(len(precisions)), precisions)
    ax.set(xlabel="batch size per worker" + (" (binned to powers of 2)" if binned else ""), ylabel="precision",
           title=title)
    finite = [v for r in grid for v in r if not math.isnan(v)]
    middle = (min(finite) + max(finite)) / 2
    if len(columns) * len(precisions) <= 60:
        for i, r in enumerate(grid):
            for j, v in enumerate(r):
                if not math.isnan(v):
                    n = len(cells[(precisions[i], columns[j])])
                    light = (v < middle) == higher_is_better
                    ax.text(j, i, _short(v) + (f"\nbest of {n}" if n > 1 else ""), ha="center", va="center",
                            fontsize=8, color="white" if light else "black")
    return fig


def _breakdown(plt: Any, ranked: list[TrialRow], metric: str) -> tuple[Any, str | None]:
    """One stacked bar per trial (best first): where its measured step time went."""
    rows = [t for t in ranked if _num(t.metrics.get(DATA_WAIT_PCT)) is not None][:TOP_N]
    if not rows:
        return None, f"step_time_breakdown.png: no trial reported {DATA_WAIT_PCT}"
    gpu = [t for t in rows if str(t.params.get("use_gpu")) == "True"]
    wait = [min(100.0, _num(t.metrics[DATA_WAIT_PCT]) or 0.0) for t in rows]
    copy = [_num(t.metrics.get(H2D_COPY_PCT)) or 0.0 for t in rows]
    rest = [max(0.0, 100.0 - w - c) for w, c in zip(wait, copy, strict=True)]
    fig, ax = plt.subplots(figsize=(min(12.0, max(6.0, 0.3 * len(rows) + 2.5)), 4))
    xs = list(range(len(rows)))
    width = 0.8 if len(rows) <= 20 else 0.95
    ax.bar(xs, wait, width, label="waiting for data (loader or in-process decode)", color="#d62728")
    if gpu and any(H2D_COPY_PCT in t.metrics for t in rows):
        ax.bar(xs, copy, width, bottom=wait, label="host-to-device copy", color="#ff7f0e")
        copy_note = ""
    else:  # said, not drawn as a zero
        copy_note = " (host-to-device copy: none on CPU)" if not gpu else " (host-to-device copy: not measured)"
    ax.bar(xs, rest, width, bottom=[w + c for w, c in zip(wait, copy, strict=True)], color="#1f77b4",
           label="compute + all-reduce + optimizer: the rest (not split)")
    shown = _thin(xs)
    ax.set_xticks(shown, [f"#{rows[i].number}" for i in shown], rotation=90 if len(shown) > 12 else 0, fontsize=8)
    ax.set(ylim=(0, 100), ylabel="% of measured step time", xlabel=f"trial, best {metric} first")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=1, frameon=False)
    ax.set_title("where step time went" + (f" (best {len(rows)} of {len(ranked)} trials)" if len(ranked) > len(rows) else "")
                 + copy_note, fontsize=11)
    return fig, None


_TRACE_PARTS = ((TRACE_COMPUTE_PCT, "compute", "#1f77b4"), (TRACE_EXPOSED_PCT, "exposed all-reduce", "#9467bd"),
                (TRACE_DATA_WAIT_PCT, "waiting for data", "#d62728"), (TRACE_IDLE_PCT, "idle (overhead, other waits)", "#c7c7c7"))


def _trace_bars(plt: Any, ranked: list[TrialRow], metric: str) -> Any:
    """One stacked bar per trial (best first) from its profiler trace: compute, exposed all-reduce, data
    wait, idle (they sum to 100); None when no trial has a trace."""
    rows = [t for t in ranked if _num(t.metrics.get(TRACE_COMPUTE_PCT)) is not None][:TOP_N]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(min(12.0, max(6.0, 0.3 * len(rows) + 2.5)), 4))
    xs, bottom = list(range(len(rows))), [0.0] * len(rows)
    for key, label, color in _TRACE_PARTS:
        values = [_num(t.metrics.get(key)) or 0.0 for t in rows]
        ax.bar(xs, values, 0.8, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    shown = _thin(xs)
    ax.set_xticks(shown, [f"#{rows[i].number}" for i in shown], rotation=90 if len(shown) > 12 else 0, fontsize=8)
    ax.set(ylim=(0, 100), ylabel="% of a traced step (mean over ranks)", xlabel=f"trial, best {metric} first")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    ax.set_title("where a traced step went (profiler trace of the last warm-up steps)", fontsize=11)
    return fig


def _scaling(plt: Any, outcome: SweepOutcome, ok: list[TrialRow]) -> Any:
    """Throughput (left) and scaling efficiency (right) against ranks, one line per configuration (the
    other knobs that varied); None unless some configuration ran on two worker counts or more."""
    shown = [k for k in knob_split(outcome)[0] if k not in NOT_SPEED and k != "num_workers"]
    series: dict[str, list[tuple[int, float, float | None]]] = defaultdict(list)
    for t in ok:
        n, tput = workers(t), throughput(t)
        if n is not None and tput is not None:
            label = ", ".join(f"{k} {t.params.get(k, t.params.get('workload.' + k.removeprefix('params.')))}"
                              for k in shown) or "every trial"
            series[label].append((n, tput[1], _num(t.metrics.get(SCALING_EFFICIENCY_PCT))))
    series = {k: sorted(v, key=lambda p: (p[0], p[1])) for k, v in list(series.items())[:MAX_LABELS]
              if len({n for n, _, _ in v}) > 1}
    if not series:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label, pts in sorted(series.items()):
        left.plot([p[0] for p in pts], [p[1] for p in pts], "-o", label=label)
        eff = [(p[0], p[2]) for p in pts if p[2] is not None]
        right.plot([pts[0][0]] + [e[0] for e in eff], [100.0] + [e[1] for e in eff], "-o", label=label)
    ranks = sorted({p[0] for pts in series.values() for p in pts})
    for ax in (left, right):
        ax.set_xticks(ranks)
        ax.grid(alpha=0.3)
    key = next(iter(throughput(t) for t in ok if throughput(t) is not None))[0]  # type: ignore[index]
    left.set(xlabel="ranks (num_workers)", ylabel=key, title="throughput vs ranks")
    right.axhline(100.0, color="grey", linestyle=":", linewidth=1)
    right.set(xlabel="ranks (num_workers)", ylabel="% of linear", ylim=(0, None),
              title="scaling efficiency vs the fewest ranks")
    left.legend(fontsize=7)
    return fig


def _tradeoff(plt: Any, outcome: SweepOutcome, ok: list[TrialRow], tput: str) -> tuple[str, Any] | None:
    obj = outcome.spec.objective
    (x, y), modes = (obj.metrics[:2], obj.modes[:2]) if obj.multi else ((tput, LOSS_VAL), ("max", "min"))
    pts = [t for t in ok if _num(t.metrics.get(x)) is not None and _num(t.metrics.get(y)) is not None]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.scatter([t.metrics[x] for t in pts], [t.metrics[y] for t in pts], label="trials", alpha=0.6, s=18)
    front = sorted(pareto_rows(pts, (x, y), modes), key=lambda t: t.metrics[x])
    ax.plot([t.metrics[x] for t in front], [t.metrics[y] for t in front], "r-o", label="Pareto front")
    named = {id(t) for t in front} | ({id(t) for t in pts} if len(pts) <= MAX_LABELS else set())
    for t in _thin([t for t in pts if id(t) in named], 2 * MAX_LABELS):
        ax.annotate(f"#{t.number}", (t.metrics[x], t.metrics[y]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set(xlabel=x, ylabel=y, title=f"{y} vs {x} (labels: trial number)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ("pareto_front.png" if obj.multi else "loss_vs_throughput.png"), fig


def figures(outcome: SweepOutcome, history: Callable[[str, str], list[tuple[int, float]]]) -> tuple[dict[str, Any], list[str]]:
    """{file name: matplotlib figure} and the figures left out with why."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [t for t in outcome.trials if t.status == "ok"]
    metric = outcome.spec.objective.primary
    tput = next((k for k in (metric, throughput_key("samples"), throughput_key("tokens"))
                 if k.startswith(THROUGHPUT_PREFIX) and any(k in t.metrics for t in ok)), None)
    figs: dict[str, Any] = {}
    skipped: list[str] = []
    if tput is None:
        return figs, ["all figures: no trial finished with a throughput"]

    for name, x, y, xlabel, ylabel, title in (
        ("throughput_vs_batch_size.png", "batch_size", tput, "batch size per worker (log2)", tput, "throughput vs batch size"),
        ("memory_vs_batch_size.png", "batch_size", MEM_MAX_RESERVED_GIB, "batch size per worker (log2)", "peak reserved GPU memory (GiB)",
         "peak GPU memory vs batch size"),
        ("throughput_vs_loader_workers.png", "num_dataloader_workers", tput, "dataloader workers per rank", tput,
         "throughput vs dataloader workers"),
    ):
        series = _by_precision(ok, x, y)
        if not series:
            skipped.append(f"{name}: {y} was not measured (no GPU)" if y == MEM_MAX_RESERVED_GIB else f"{name}: no data")
            continue
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        _scatter_lines(ax, series, higher_is_better=y != MEM_MAX_RESERVED_GIB, log2=x == "batch_size")
        ax.set(xlabel=xlabel, ylabel=ylabel, title=f"{outcome.spec.name}: {title}")
        figs[name] = fig

    heat = _heatmap(plt, ok, tput, tput, "throughput: precision x batch size (best trial per cell)", True)
    if heat is not None:
        figs["throughput_heatmap.png"] = heat
    mem = next((k for k in (GPU_MEM_PEAK_GIB, MEM_MAX_RESERVED_GIB) if any(k in t.metrics for t in ok)), None)
    heat = _heatmap(plt, ok, mem, f"{mem} (GiB)", "peak GPU memory: precision x batch size (least per cell)", False) if mem else None
    if heat is not None:
        figs["memory_heatmap.png"] = heat
    else:
        skipped.append(f"memory_heatmap.png: {GPU_MEM_PEAK_GIB} was not measured (no GPU)")

    bars, why = _breakdown(plt, outcome.ranked(), metric)
    if bars is not None:
        figs["step_time_breakdown.png"] = bars
    elif why:
        skipped.append(why)

    traced = _trace_bars(plt, outcome.ranked(), metric)
    if traced is not None:
        figs["trace_breakdown.png"] = traced
    else:
        skipped.append("trace_breakdown.png: no finished trial has a trace (telemetry.trace_steps: 0, or warm-up too "
                       "short)")

    scaled = _scaling(plt, outcome, ok) if outcome.spec.space.num_workers is not None else None
    if scaled is not None:
        figs["scaling_vs_ranks.png"] = scaled
    elif outcome.spec.space.num_workers is not None:
        skipped.append("scaling_vs_ranks.png: no configuration finished on two worker counts")

    tradeoff = _tradeoff(plt, outcome, ok, tput)
    if tradeoff is not None:
        figs[tradeoff[0]] = tradeoff[1]

    best = outcome.best
    key = next((k for k in _UTIL if best is not None and k in best.metrics), None)
    if best is not None and best.run_id and key:
        series_pts = history(best.run_id, key)
        if len(series_pts) < 3:
            skipped.append(f"best_trial_utilisation.png: only {len(series_pts)} report(s) in the best trial's window "
                           "(budget.report_interval_s is longer than the trial); lower it for a timeline")
        else:
            fig, ax = plt.subplots(figsize=(6.5, 3))
            ax.plot([s for s, _ in series_pts], [v for _, v in series_pts], "o-")
            ax.set(xlabel="measured step", ylabel=key, title=f"best trial #{best.number}: utilisation", ylim=(0, None))
            ax.grid(alpha=0.3)
            figs["best_trial_utilisation.png"] = fig
    return figs, skipped


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


def publish(outcome: SweepOutcome, client: Any, out_dir: Path | None = None, log: bool = True) -> Path | None:
    """Write the figures and summary.html into `out_dir` (returned), and with `log` log them.

    They are logged under `report/` on the parent run. Without `out_dir` they are written to a temporary folder,
    removed once logged (None is returned): MLflow keeps them."""
    if out_dir is None:
        with tempfile.TemporaryDirectory(prefix="sweep-report-") as tmp:
            _write_report(outcome, client, Path(tmp), log)
        return None
    _write_report(outcome, client, out_dir, log)
    return out_dir


def _write_report(outcome: SweepOutcome, client: Any, target: Path, log: bool) -> None:
    import matplotlib.pyplot as plt

    def history(run_id: str, key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]

    target.mkdir(parents=True, exist_ok=True)
    figs, skipped = figures(outcome, history)
    images: dict[str, bytes] = {}
    for name, fig in figs.items():
        fig.tight_layout()
        fig.savefig(target / name, dpi=100, bbox_inches="tight")
        plt.close(fig)
        images[name] = (target / name).read_bytes()
    experiment_id = str(client.get_run(outcome.parent_run_id).info.experiment_id)
    (target / "summary.html").write_text(summary_html(outcome, images, skipped, experiment_id))
    write_pareto(outcome, target)
    if log:
        client.log_artifacts(outcome.parent_run_id, str(target), "report")
