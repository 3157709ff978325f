"""Parsers for the output folder of an earlier GPU acceptance run (`--record-from`), e.g. h100-2026-11-24/.

What they read: README.md (title line: machine, date, project commit; the versions it states), the doctor's
JSON, each sweep's printed output (`sweeps run`: the trials table, verdicts, the probe line, the overhead
line) and the parity JSON lines. Figures are kept as the files print them; nothing is computed here but
the parsing. The run's commands, as its run.sh ran them, are in RECORDED_COMMANDS.
"""

from __future__ import annotations

import re
from typing import Any

FILES = {"doctor": "doctor-{tag}.json", "gpt": "gpt-sweep-{tag}.txt", "image": "image-sweep-{tag}.txt",
         "probe": "probe-sweep-{tag}.txt", "parity": "parity-{tag}.jsonl"}
RECORDED_COMMANDS = {
    "doctor": "run.sh doctor: python3 -m sweeps doctor --gpu-checks --tracking-uri sqlite:////tmp/gpu/mlflow.db "
              "--json /tmp/gpu/doctor.json",
    "gpt": "run.sh gpt: python3 -m sweeps run --restart gpt.yaml",
    "image": "run.sh image: python3 -m sweeps run --restart image.yaml",
    "probe": "run.sh probe: python3 -m sweeps run --restart probe.yaml",
    "parity": "run.sh parity: python3 parity.py --rounds ${ROUNDS:-3} (parity.py.txt: trainables.launch under torchrun, "
              "1 GPU, vs parity.py's own plain loop, since benchmarks/plain_ddp.py failed on CUDA then; gpt2-small "
              "bf16-mixed, 100 measured steps after 10, 2 loader workers, pinned)",
}
_TITLE = re.compile(r"^# .*?, (?P<gpu>NVIDIA [^(]+?) \((?P<count>\d+) GPU.*?\), (?P<date>\d{4}-\d{2}-\d{2}), "
                    r"project \w+ (?P<sha>[0-9a-f]{7,40})")
_VERSION = re.compile(r"\b(Ray|MLflow|Optuna) (\d+(?:\.\d+)*)")
_HEADER = re.compile(r"^rank\s+trial\s+status\b")
_STARTED = re.compile(r"^\[trial (\d+)/\d+\] \S+ started: (.*)$")
_VERDICT = re.compile(r"^  trial (\d+)(?: (\w+))?: (.*)$")
_PROBE = re.compile(r"^memory probe (\S+): (.*)$")
_OVERHEAD = re.compile(r"per-trial overhead \(sweep wall ([\d.]+) s - loops ([\d.]+) s\) / (\d+) = ([\d.]+) s")
_FINISHED = re.compile(r"^Sweep (\S+) finished in (\d+)s: (\d+)/(\d+) trials ok")
_COLUMNS = {"batch": "batch_size", "loaders": "num_dataloader_workers", "pin": "pin_memory"}


def value(text: str) -> Any:
    """A printed cell as a Python value: True/False, int, float, else the text."""
    if text in ("True", "False"):
        return text == "True"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _cell(column: str, text: str) -> Any:
    return text if column == "precision" else value(text)  # "32" is a precision's name, not a number


def readme(text: str) -> dict[str, Any]:
    """The run's facts from its README's title line and the library versions it names."""
    m = _TITLE.search(text)
    if m is None:
        raise ValueError("README.md has no title line like '# GPU acceptance run, NVIDIA <gpu> (1 GPU, ...), "
                         "<yyyy-mm-dd>, project main <sha>'")
    return {"gpu": m["gpu"].strip(), "gpu_count": int(m["count"]), "date": m["date"], "git_sha": m["sha"],
            "versions": {name.lower(): v for name, v in _VERSION.findall(text)}}


def machine(doctor: dict[str, Any], facts_of_run: dict[str, Any]) -> dict[str, Any]:
    """The `machine` of a recorded entry, from the doctor's facts and the README (common.machine()'s keys)."""
    f = doctor["nodes"][0]["facts"]
    return {"cpu": f["host/cpu"], "isa": f["host/cpu_isa"], "cores": f["host/cores"], "python": f["host/python"],
            "memory_gib": f["host/memory_gib"], "gpu": f["device/name"], "gpu_count": f["gpu/count"],
            "gpu_driver": f["gpu/driver"], "cuda": f["gpu/cuda"], "nccl": f["gpu/nccl"],
            "versions": {"torch": f["host/torch"], **facts_of_run["versions"]}, "git_sha": facts_of_run["git_sha"]}


def sweep_text(text: str) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, str]]:
    """(summary, trial rows, probe frontier per precision) of a `sweeps run` output, as printed."""
    lines = text.splitlines()
    summary: dict[str, Any] = {}
    started: dict[int, dict[str, Any]] = {}
    probe: dict[str, str] = {}
    for line in lines:
        if m := _FINISHED.match(line):
            summary |= {"sweep": m[1], "wall_s": float(m[2]), "trials_ok": int(m[3]), "trials_total": int(m[4])}
        elif m := _OVERHEAD.search(line):
            summary |= {"printed_sweep_wall_s": float(m[1]), "printed_loops_s": float(m[2]),
                        "printed_per_trial_overhead_s": float(m[4])}
        elif m := _STARTED.match(line):
            started[int(m[1])] = {k: _cell(k, v) for k, v in (kv.split("=", 1) for kv in m[2].split(", "))}
        elif m := _PROBE.match(line):
            probe[m[1]] = m[2]
    start = next((i for i, x in enumerate(lines) if _HEADER.match(x)), None)
    if start is None or "sweep" not in summary:
        raise ValueError("not a `sweeps run` output: no 'Sweep ... finished' line or no trials table")
    head = [_COLUMNS.get(h, h) for h in lines[start].split()]
    trials: dict[int, dict[str, Any]] = {}
    for line in lines[start + 1:]:
        cells = line.split()
        if len(cells) != len(head):
            break
        row = dict(zip(head, cells, strict=True))
        number = int(row.pop("trial").split(":")[0])
        row.pop("rank")
        trials[number] = {"trial": number, **{k: _cell(k, v) for k, v in row.items() if v != "-"}}
        trials[number] |= {k: v for k, v in started.get(number, {}).items() if k not in trials[number]}
    in_verdicts = False
    for line in lines:
        if line.startswith("Bottleneck verdicts:"):
            in_verdicts = True
        elif in_verdicts and (m := _VERDICT.match(line)) and int(m[1]) in trials:
            trials[int(m[1])]["reason" if m[2] else "verdict"] = m[3]
        elif in_verdicts and not line.startswith(" "):
            in_verdicts = False
    return summary, [trials[n] for n in sorted(trials)], probe
