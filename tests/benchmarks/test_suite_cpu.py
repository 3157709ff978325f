"""`benchmarks/suite_cpu.py`: a run's CPU by the kind of process that spent it."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from benchmarks.suite_cpu import kind_of, main, merged, summary


def test_each_process_is_named_by_what_it_last_called_itself() -> None:
    assert kind_of("ray::RayTrainWorker.run_train_fn", "ray::RayTrainWo") == "ray actor: RayTrainWorker"
    assert kind_of("", "ray::RayTrainWo") == "ray actor: RayTrainWo..."  # ending: the kernel's 15 characters
    assert kind_of("/v/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --x", "raylet") == "ray: raylet"
    assert kind_of("/v/bin/python -m sweeps run s.yaml", "python") == "python -m sweeps (driver)"
    assert kind_of("/v/bin/python -m pytest -q -n 2", "python") == "pytest"
    assert kind_of("/v/bin/python -c import sys;exec(eval(sys.stdin.readline()))", "python") == "pytest (xdist worker)"
    assert kind_of("/v/bin/python -m pip install -q -e .", "python") == "pip"
    assert kind_of("", "kworker/0:1") == "kworker/0:1"


def test_a_watched_command_s_cpu_is_counted_under_its_kind(tmp_path: Path) -> None:
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 2.5: pass\n"
    out = tmp_path / "cpu.json"
    assert main(["--out", str(out), "--", sys.executable, "-c", busy]) == 0
    result = json.loads(out.read_text())
    spent = result["kinds"]["python (other)"]["cpu_s"]
    assert 1.5 < spent <= result["busy_cpu_s"] + 0.5, result  # its last second may be missed, never more than ran
    text, rows = summary(result)  # every process on the machine is sampled: under make test, Ray's may spend more
    row = next(r for r in rows if r["kind"] == "python (other)")
    assert row["cpu_s"] > 1.5 and "account for" in text and re.search(r"^\| python \(other\) +\| ", text, re.M)


def test_cut_names_and_methods_count_with_their_class() -> None:
    kinds = {"ray actor: TrainController.run": {"cpu_s": 5.0, "processes": 1},
             "ray actor: TrainController": {"cpu_s": 4.0, "processes": 1},
             "ray actor: TrainContr...": {"cpu_s": 3.0, "processes": 2}, "ray actor: Lone...": {"cpu_s": 1.0, "processes": 1}}
    assert merged(kinds) == {"ray actor: TrainController": {"cpu_s": 12.0, "processes": 4},
                             "ray actor: Lone...": {"cpu_s": 1.0, "processes": 1}}
