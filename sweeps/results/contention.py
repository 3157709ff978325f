"""Tell whether a trial was measured while other work shared its node or its GPUs.

The figures are `contention/*`, measured by each rank while its window ran (`trainables.telemetry.other_cores`);
this module says what the answer says about a ranking that rests on such trials. A figure that could not be
measured is absent, and then the answer says contention is not known, never that there was none."""

from __future__ import annotations

from typing import Any

from sweeps.results.outcome import MEASURED, SweepOutcome, TrialRow
from trainables.contract import CPU_OTHER_CORES, GPU_OTHER_PROCS

# Cores other processes may keep busy on a trial's node before its figures count as shared: half a core. A
# quiet node running one sweep measured 0.0-0.1 here (the sweep's own driver and Ray's daemons); another
# sweep's trial, or a busy loop, 0.9-1.9 (docs/explain/figures.md, contention).
OTHER_CORES_LIMIT = 0.5
CONTENDED_TAG = "sweep.contended"  # on a trial's run: what else used its node or GPUs, in words


def contended(metrics: dict[str, Any]) -> str:
    """Say in words what else used the trial's node or GPUs while it was measured.

    "" when nothing did, or when it was not measured (`measured_contention` tells those apart)."""
    said = []
    cores, procs = metrics.get(CPU_OTHER_CORES), metrics.get(GPU_OTHER_PROCS)
    if isinstance(cores, (int, float)) and cores >= OTHER_CORES_LIMIT:
        said.append(f"other processes kept {cores:.1f} core(s) of its node busy")
    if isinstance(procs, (int, float)) and procs >= 1:
        said.append(f"{procs:.0f} other process(es) ran on its GPU")
    return " and ".join(said)


def measured_contention(metrics: dict[str, Any]) -> bool:
    return isinstance(metrics.get(CPU_OTHER_CORES), (int, float))


def contention_sentence(outcome: SweepOutcome) -> str:
    """Write the answer's line on contention; "" when the ranking is clean.

    The line says which of the trials the ranking rests on were measured while other work shared their node
    (and what to do), or that contention was not measured."""
    ranked = outcome.ranked()
    if not ranked:
        return ""
    if not any(measured_contention(t.metrics) for t in ranked):
        return ("whether other work shared the nodes while the trials were measured is not known (no `contention/*` "
                "figure: telemetry off, or windows too short)")
    shared = [t for t in ranked if contended(t.metrics)]
    if not shared:
        return ""
    top = [t for t in ranked[:2] if t in shared]
    which = ", ".join(f"trial {t.number} ({contended(t.metrics)})" for t in shared[:4])
    more = f" and {len(shared) - 4} more" if len(shared) > 4 else ""
    lead = ("The ranking rests on contended trials" if top else
            f"{len(shared)} of the {len(ranked)} ranked trials were measured while other work shared their node")
    return (f"{lead}: {which}{more}; their figures are lower than the node gives alone. Run the sweep again when "
            "the node is quiet (`sweeps run --restart`), or compare only the trials measured alone")


def contended_rows(rows: list[TrialRow]) -> list[TrialRow]:
    return [t for t in rows if t.status in MEASURED and contended(t.metrics)]
