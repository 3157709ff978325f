"""Sweep figures (matplotlib PNG) and `summary.html`, logged on the parent run under `report/`.

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

import base64
import html
import math
import re
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sweeps.results.outcome import NOT_SPEED, pareto_rows
from sweeps.results.quality import throughput, workers
from sweeps.results.report import (
    SweepOutcome,
    TrialRow,
    answer,
    best_fragment,
    degraded,
    knob_split,
    next_steps,
    pareto_records,
    same_in_every_trial,
    table_rows,
)
from sweeps.tracking import UI_PORT, run_url
from trainables.contract import DATA_WAIT_PCT, GPU_MEM_PEAK_GIB, H2D_COPY_PCT, SCALING_EFFICIENCY_PCT

_MEMORY = "memory/max_reserved_gib"
_LOSS = "loss/val"
_UTIL = ("gpu/util_mean_pct", "cpu/worker_util_mean_pct")
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


_TRACE_PARTS = (("compute", "compute", "#1f77b4"), ("comm_exposed", "exposed all-reduce", "#9467bd"),
                ("data_wait", "waiting for data", "#d62728"), ("idle", "idle (overhead, other waits)", "#c7c7c7"))
TRACE_HOW_TO_OPEN = ("Each trial's MLflow run keeps one trace per rank, trace/rank-N.pt.trace.json.gz (its last warm-up "
                     "steps): download it from the run's artifacts and open it in Perfetto (ui.perfetto.dev) or "
                     "chrome://tracing.")


def _trace_bars(plt: Any, ranked: list[TrialRow], metric: str) -> Any:
    """One stacked bar per trial (best first) from its profiler trace: compute, exposed all-reduce, data
    wait, idle (they sum to 100); None when no trial has a trace."""
    rows = [t for t in ranked if _num(t.metrics.get("trace/compute_pct")) is not None][:TOP_N]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(min(12.0, max(6.0, 0.3 * len(rows) + 2.5)), 4))
    xs, bottom = list(range(len(rows))), [0.0] * len(rows)
    for part, label, color in _TRACE_PARTS:
        values = [_num(t.metrics.get(f"trace/{part}_pct")) or 0.0 for t in rows]
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
    (x, y), modes = (obj.metrics[:2], obj.modes[:2]) if obj.multi else ((tput, _LOSS), ("max", "min"))
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
    tput = next((k for k in (metric, "throughput/samples_per_s", "throughput/tokens_per_s") if k.startswith("throughput/")
                 and any(k in t.metrics for t in ok)), None)
    figs: dict[str, Any] = {}
    skipped: list[str] = []
    if tput is None:
        return figs, ["all figures: no trial finished with a throughput"]

    for name, x, y, xlabel, ylabel, title in (
        ("throughput_vs_batch_size.png", "batch_size", tput, "batch size per worker (log2)", tput, "throughput vs batch size"),
        ("memory_vs_batch_size.png", "batch_size", _MEMORY, "batch size per worker (log2)", "peak reserved GPU memory (GiB)",
         "peak GPU memory vs batch size"),
        ("throughput_vs_loader_workers.png", "num_dataloader_workers", tput, "dataloader workers per rank", tput,
         "throughput vs dataloader workers"),
    ):
        series = _by_precision(ok, x, y)
        if not series:
            skipped.append(f"{name}: {y} was not measured (no GPU)" if y == _MEMORY else f"{name}: no data")
            continue
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        _scatter_lines(ax, series, higher_is_better=y != _MEMORY, log2=x == "batch_size")
        ax.set(xlabel=xlabel, ylabel=ylabel, title=f"{outcome.spec.name}: {title}")
        figs[name] = fig

    heat = _heatmap(plt, ok, tput, tput, "throughput: precision x batch size (best trial per cell)", True)
    if heat is not None:
        figs["throughput_heatmap.png"] = heat
    mem = next((k for k in (GPU_MEM_PEAK_GIB, _MEMORY) if any(k in t.metrics for t in ok)), None)
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


_STYLE = """body{font-family:system-ui,sans-serif;margin:12px;color:#222;line-height:1.4}
h1{font-size:1.4em;margin:0 0 .4em} h2{font-size:1.15em;margin:1.2em 0 .4em}
.answer{background:#eef6ee;border-left:4px solid #2a7;padding:.6em .8em}
.scroll{overflow-x:auto;max-width:100%;border:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;white-space:nowrap}
th,td{padding:3px 7px;border-bottom:1px solid #eee;text-align:right}
th{background:#f4f4f4;cursor:pointer;position:sticky;top:0;white-space:normal;min-width:3em;vertical-align:bottom}
th:hover{background:#e4e4e4} td.t{text-align:left}
textarea{width:100%;max-width:40em;font-family:monospace;font-size:12px}
figure{display:inline-block;margin:.4em;vertical-align:top;max-width:100%} img{max-width:100%;height:auto}
ul{padding-left:1.2em} li{margin:.15em 0} code{background:#f4f4f4;padding:0 .2em}"""

# Sorting (numbers as numbers, "-" last) and, inside MLflow's viewer (a blob: iframe of the UI's own
# origin), run links pointed at that UI; the copy button falls back to selecting the text.
_SCRIPT = """document.querySelectorAll('table.sortable th').forEach(function(th,i){th.addEventListener('click',function(){
var tb=th.closest('table').tBodies[0],rows=Array.from(tb.rows),up=th.dataset.dir!=='up';th.dataset.dir=up?'up':'down';
rows.sort(function(a,b){var x=a.cells[i].dataset.v,y=b.cells[i].dataset.v,nx=parseFloat(x),ny=parseFloat(y);
if(x===''||y===''){return (x==='')-(y==='');}var c=(isNaN(nx)||isNaN(ny))?String(x).localeCompare(y):nx-ny;return up?c:-c;});
rows.forEach(function(r){tb.appendChild(r);});});});
if(location.protocol==='blob:'){var base=new URL(location.href.slice(5)).origin;
document.querySelectorAll('a[data-local]').forEach(function(a){a.href=base+a.getAttribute('data-path');});}
function copyFragment(){var t=document.getElementById('fragment');t.select();var m=document.getElementById('copied');
try{navigator.clipboard.writeText(t.value).then(function(){m.textContent='copied';},function(){m.textContent=document.execCommand('copy')?'copied':'selected: press Ctrl+C';});}
catch(e){m.textContent=document.execCommand('copy')?'copied':'selected: press Ctrl+C';}}"""


def _inline_md(text: str) -> str:
    """The answer's markdown (bold, italics, code) as HTML."""
    out = html.escape(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    out = re.sub(r"\*(.+?)\*", r"<i>\1</i>", out)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", out)


def _fmt_value(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def _cell(i: int, v: Any) -> str:
    shown = _fmt_value(v)
    raw = "" if v is None else str(v)
    return f'<td data-v="{html.escape(raw)}"{" class=t" if i == 2 else ""}>{html.escape(shown)}</td>'


def _trials_html(outcome: SweepOutcome, base: str, local: bool, experiment_id: str | None) -> str:
    head, rows = table_rows(outcome)  # only the knobs that varied: the table fits a narrow viewer
    shared = same_in_every_trial(outcome)  # the rest, said once above it
    ths = "".join(f"<th title=\"{html.escape(h)} (click to sort)\">{html.escape(h).replace('/', '/<wbr>').replace('_', '_<wbr>')}</th>" for h in head)
    body = []
    for t, values in rows:
        cells = [_cell(i, v) for i, v in enumerate(values)]
        if t.run_id and experiment_id is not None:
            path = run_url("", experiment_id, t.run_id)
            attrs = f' data-local="1" data-path="{html.escape(path)}"' if local else ""
            link = (f'<a href="{html.escape(base + path)}"{attrs} title="MLflow run {t.run_id}">#{t.number}</a>')
        else:
            link = f"#{t.number}"
        cells[1] = f'<td data-v="{t.number}" class=t>{link} <small>{html.escape(t.trial_id)}</small></td>'
        body.append("<tr>" + "".join(cells) + "</tr>")
    return ((f"<p><small>{html.escape(shared)}</small></p>" if shared else "")
            + f'<div class="scroll"><table class="sortable" id="trials"><thead><tr>{ths}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def summary_html(outcome: SweepOutcome, images: dict[str, bytes], skipped: list[str],
                 experiment_id: str | None = None) -> str:
    """One self-contained page (figures embedded, no dependency) that renders inside MLflow's artifact
    viewer: the answer, the trials (sortable, each linked to its MLflow run), the best configuration
    as a spec fragment, verdicts, the next step, the figures. Run links go to the tracking server when
    it is one; for a local store, to the UI the page is viewed in, else to the `mlflow ui` the CLI
    prints (http://127.0.0.1:5000)."""
    spec = outcome.spec
    served = outcome.tracking_uri.startswith(("http://", "https://"))
    base = outcome.tracking_uri.rstrip("/") if served else f"http://127.0.0.1:{UI_PORT}"
    e = html.escape
    imgs = "\n".join(f'<figure><img alt="{e(n)}" src="data:image/png;base64,{base64.b64encode(b).decode()}">'
                     f"<figcaption>{e(n)}</figcaption></figure>" for n, b in images.items())
    notes = "".join(f"<li>{e(s)}</li>" for s in skipped)
    ranked = outcome.ranked()
    verdicts = "".join(f"<li>trial #{t.number}: {e(t.verdict)}</li>" for t in ranked if t.verdict)
    verdicts += "".join(f"<li>trial #{t.number} <b>degraded</b>: {e(degraded(t))}</li>" for t in outcome.trials if degraded(t))
    verdicts += "".join(f"<li>trial #{t.number} {e(t.status)}: {e(t.reason)}</li>"
                        for t in outcome.trials if t not in ranked and t.reason)
    fragment = best_fragment(outcome)
    links = ("" if served else f"<p><small>Run links open the MLflow UI this page is viewed in; opened on its own they "
             f"assume <code>mlflow ui --port {UI_PORT}</code> on this machine ({e(base)}).</small></p>")
    return f"""<!doctype html><html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>{e(spec.name)}</title><style>{_STYLE}</style></head><body>
<h1>Sweep {e(spec.name)}</h1><p>{e(spec.description)}</p>
<p class="answer">{_inline_md(answer(outcome))}</p>
<p><b>Next:</b> {e(next_steps(outcome, noise=False))}</p>
<h2>Trials</h2><p><small>Objective: <code>{e(spec.objective.describe())}</code>; {len(ranked)}/{len(outcome.trials)}
trials finished; click a header to sort, a trial to open its MLflow run.</small></p>
{_trials_html(outcome, base, not served, experiment_id)}{links}
<h2>Verdicts</h2><ul>{verdicts or "<li>no finished trial</li>"}</ul>
<h2>Best configuration</h2><p><small>The <code>space:</code> section that reruns the best trial exactly:</small></p>
<textarea id="fragment" readonly rows="{fragment.count(chr(10)) + 2}">{e(fragment)}</textarea><br>
<button onclick="copyFragment()">Copy</button> <span id="copied"></span>
<h2>Figures</h2>{imgs}{f"<h3>Not drawn</h3><ul>{notes}</ul>" if notes else ""}
{f"<p><small>{e(TRACE_HOW_TO_OPEN)}</small></p>" if "trace_breakdown.png" in images else ""}
<script>{_SCRIPT}</script></body></html>"""


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
    """Write the figures and summary.html into `out_dir` (returned), and with `log` log them under `report/`
    on the parent run. Without `out_dir` they are written to a temporary folder, removed once logged
    (None is returned): MLflow keeps them."""
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
