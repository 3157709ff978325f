"""The sweep's `summary.html`: one self-contained page that renders inside MLflow's artifact viewer.

The answer, the trials (sortable, each linked to its MLflow run), the best configuration as a spec fragment,
verdicts, the next step and the figures (`sweeps.results.plots` draws them), with no dependency.
"""

from __future__ import annotations

import base64
import html
import re
from typing import Any

from sweeps.results.outcome import SweepOutcome
from sweeps.results.report import answer, best_fragment, degraded, next_steps, same_in_every_trial, table_rows
from sweeps.tracking import UI_PORT, run_url

TRACE_HOW_TO_OPEN = ("Each trial's MLflow run keeps one trace per rank, trace/rank-N.pt.trace.json.gz (its last warm-up "
                     "steps): download it from the run's artifacts and open it in Perfetto (ui.perfetto.dev) or "
                     "chrome://tracing.")

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
    """Build summary.html: one self-contained page that renders inside MLflow's artifact viewer.

    Figures embedded, no dependency: the answer, the trials (sortable, each linked to its MLflow run), the best
    configuration as a spec fragment, verdicts, the next step, the figures. Run links go to the tracking server
    when it is one; for a local store, to the UI the page is viewed in, else to the `mlflow ui` the CLI
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
