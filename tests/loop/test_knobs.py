"""Every trial setting declared once (issue 49): its type, default, rule, help and flag in trainables/knobs.py,
and the spec, the trial's config and the launcher's flags derived from it; the trace steps one name; what
decides memory and what a memory probe runs with, one declared set each."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from sweeps.search.live_state import oom_key, oom_label
from sweeps.search.trials import resolve_trial, window_floor
from sweeps.service import probe
from sweeps.spec import SpecError, SweepSpec, parse_spec
from sweeps.spec.settings import set_by
from trainables.contract import TrialConfig
from trainables.knobs import (
    DECLARED,
    GPU_MIN_WINDOW_S,
    KNOBS,
    MEMORY_KNOBS,
    PROBE_VALUES,
    REQUIRED,
    SAME,
    SETTINGS,
)
from trainables.launch import build_parser

REPO = Path(__file__).resolve().parents[2]
SPEC = "name: s\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 1, num_steps: 5}\n"
# what the spec sets as it is, by the spec's name for it
AS_IS = {"trainable.name": "workload", "budget.num_warmup_steps": "num_warmup_steps",
         "budget.report_interval_s": "report_interval_s", "budget.loader_timeout_s": "loader_timeout_s",
         "budget.collective_timeout_s": "collective_timeout_s", "budget.checkpoint_every_steps": "checkpoint_every_steps",
         "scaling.use_gpu": "use_gpu", "scaling.cpus_per_worker": "threads_per_worker",
         "telemetry.period_s": "telemetry_period_s", "telemetry.trace_steps": "trace_steps", "data_dir": "data_dir",
         "seed": "seed"}


def _spec_fields(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Every field of the spec and its sections, by path."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        out[prefix + name] = info
        inner = info.annotation if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel) else None
        inner = inner or next((a for a in getattr(info.annotation, "__args__", ()) if isinstance(a, type)
                               and issubclass(a, BaseModel)), None)
        if inner is not None and name != "space":
            out |= _spec_fields(inner, f"{prefix}{name}.")
    return out


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}


def test_each_spec_field_that_sets_a_setting_as_it_is_takes_its_default_rule_and_help_from_the_declaration() -> None:
    fields = _spec_fields(SweepSpec)
    tagged = {path: set_by(info) for path, info in fields.items() if set_by(info) is not None}
    assert tagged == AS_IS
    for path, name in AS_IS.items():
        info, (kind, default, declared) = fields[path], SETTINGS[name]
        want = declared.sweep_default(default)
        assert info.is_required() if want is REQUIRED else info.default == want, path
        assert info.annotation is kind and info.description == declared.help, path
        bounds = {k: getattr(m, k) for m in info.metadata for k in ("ge", "gt") if getattr(m, k, None) is not None}
        assert bounds == declared.bounds(kind), path
    # and the trial's config reads them: a spec that sets each differently runs each as set
    spec = parse_spec(SPEC.replace("num_steps: 5}", "num_steps: 5, num_warmup_steps: 7, report_interval_s: 3.5, "
                                   "loader_timeout_s: 9.0, collective_timeout_s: 8.0, checkpoint_every_steps: 2}")
                      + "scaling: {cpus_per_worker: 2}\ntelemetry: {period_s: 0.5, trace_steps: 3}\n"
                      "data_dir: /d\nseed: -4\n")
    cfg = resolve_trial(spec, {})
    assert (cfg.num_warmup_steps, cfg.report_interval_s, cfg.loader_timeout_s, cfg.collective_timeout_s,
            cfg.checkpoint_every_steps, cfg.threads_per_worker, cfg.telemetry_period_s, cfg.trace_steps,
            cfg.data_dir, cfg.seed, cfg.workload) == (7, 3.5, 9.0, 8.0, 2, 2, 0.5, 3, "/d", -4, "mlp-tabular")


def test_the_trial_config_and_the_launchers_flags_take_their_defaults_from_the_declaration() -> None:
    fields = {f.name: f for f in dataclasses.fields(TrialConfig)}
    assert list(fields) == list(DECLARED)
    flags = _flags(build_parser())
    for name, (kind, default, declared) in DECLARED.items():
        f = fields[name]
        held = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert held == default, name
        if not declared.flag:
            assert name not in flags, name
            continue
        flag = flags[name]
        spelled = "--" + (declared.flag if isinstance(declared.flag, str) else name).replace("_", "-")
        if kind is bool:  # a switch: off by default --name, on by default --no-name
            assert flag.option_strings == [spelled if not default else "--no-" + spelled[2:]], name
            assert flag.default is default, name
        else:
            assert flag.option_strings == [spelled] and flag.default == declared.torchrun_default(default), name
        assert flag.help is not None and flag.help.startswith(declared.help), name
    assert set(flags) - set(DECLARED) == {"target", "checkpoint_dir"}  # the launcher's own: no setting's twin


def _literal(value: Any) -> str:
    """A default as the code would write it: 10.0 also as 10, 1e9 also as 1000000000.0, a text as itself."""
    if isinstance(value, str):
        return re.escape(value)
    mantissa, exponent = f"{float(value):e}".split("e")
    short = rf"{mantissa.rstrip('0').rstrip('.')}e\+?0*{int(exponent)}"  # 1e9
    whole = rf"{int(value)}(\.0)?" if float(value).is_integer() else re.escape(repr(value))
    return rf"\b(?:{whole}|{short})\b"


def _copies(name: str, value: Any, sources: dict[str, str]) -> list[str]:
    """The sources that write `value` near setting `name` (its name or flag; in the spec, its field's name)."""
    spec_name = {setting: path.rsplit(".", 1)[-1] for path, setting in AS_IS.items()}.get(name, name)
    found = []
    for f, text in sources.items():
        names = {name, name.replace("_", "-"), *([spec_name] if "spec" in f else [])}
        near = [rf"\b{re.escape(n)}\b.{{0,40}}{_literal(value)}" for n in names]
        if name == "data_dir":
            near.append(_literal(value))  # a path is a copy wherever it is written
        if any(re.search(p, text) for p in near):
            found.append(f)
    return sorted(found)


def test_every_declared_default_is_written_once() -> None:
    """A setting's default (and its sweep's, torchrun's and a probe's value) near its name, flag or spec field anywhere in the
    code but its declaration is a second copy. Zeros, ones, switches and empties are too common to search for, and a
    workload's name is used for itself; the loop's knobs are tests/test_house.py's."""
    sources = {str(f.relative_to(REPO)): f.read_text() for pkg in ("sweeps", "trainables")
               for f in (REPO / pkg).rglob("*.py") if f.name != "knobs.py"}
    checked = 0
    for name, (_, default, declared) in SETTINGS.items():
        values = {v for v in (default, declared.sweep, declared.torchrun, declared.probe)
                  if v is not SAME and v is not REQUIRED and not isinstance(v, (bool, dict)) and v not in (0, "", None)
                  and not (type(v) is int and v == 1) and name != "workload"}
        for value in values:
            assert _copies(name, value, sources) == [], (name, value)
            checked += 1
    assert checked >= 10  # 50 and a probe's 2, 5, 1.0, 10.0 and a probe's 1e9, ".cache/datasets", 120.0, 600.0, ...
    # the copies this replaced would be found
    before = {"spec/sections.py": 'report_interval_s: float = Field(default=10.0, gt=0, description="seconds',
              "launch.py": 'p.add_argument("--num-warmup-steps", type=int, default=5)',
              "contract.py": "    data_dir: str = \".cache/datasets\""}
    assert _copies("report_interval_s", 10.0, before) == ["spec/sections.py"]
    assert _copies("num_warmup_steps", 5, before) == ["launch.py"]
    assert _copies("data_dir", ".cache/datasets", before) == ["contract.py"]
    assert _copies("report_interval_s", 1e9, {"probe.py": "probe=True, report_interval_s=1e9,"}) == ["probe.py"]


def test_the_gpu_least_window_is_one_named_constant() -> None:
    sources = {f: f.read_text() for pkg in ("sweeps", "trainables") for f in (REPO / pkg).rglob("*.py")}
    defined = [f.name for f, text in sources.items() if re.search(r"^GPU_MIN_WINDOW_S\s*=", text, re.M)]
    assert defined == ["knobs.py"]
    said = [f.name for f, text in sources.items() if re.search(r"\b10(\.0)?( s)? (is its )?(on|GPU)", text)]
    assert not said, said  # never written out again in words
    spec = parse_spec(SPEC)
    assert window_floor(spec.budget, use_gpu=True) == GPU_MIN_WINDOW_S and window_floor(spec.budget, False) == 0
    assert f"default {GPU_MIN_WINDOW_S:g} on GPU" in (SweepSpec.model_fields["budget"].annotation
                                                      .model_fields["min_window_s"].description)  # type: ignore[union-attr]


def test_the_trace_steps_have_one_name_and_the_sweeps_default_is_declared() -> None:
    kind, default, declared = SETTINGS["trace_steps"]
    assert (kind, default, declared.sweep) == (int, 0, 2)  # plain torchrun: off; a sweep traces 2 steps
    assert resolve_trial(parse_spec(SPEC), {}).trace_steps == 2
    assert TrialConfig(workload="mlp-tabular", num_steps=1).trace_steps == 0
    assert build_parser().parse_args([]).trace_steps == 0
    assert "--trace-steps" in build_parser().format_help()
    with pytest.raises(SpecError) as info:
        parse_spec(SPEC + "telemetry: {trace: 0}\n")
    assert [str(p) for p in info.value.problems] == [
        "line 4: telemetry.trace: renamed to telemetry.trace_steps (the same setting); write trace_steps instead "
        "(got 0)"]


def _other(name: str) -> Any:
    """A value of knob `name` other than its default, allowed by its rule."""
    kind, default, declared = KNOBS[name]
    if declared.choices is not None:
        return next(c for c in declared.choices if c != default)
    return {bool: lambda: not default, int: lambda: default + 2, float: lambda: default + 0.5,
            str: lambda: default + "x"}[kind]()


def test_what_decides_memory_is_the_declared_set() -> None:
    base = {k: default for k, (_, default, _) in KNOBS.items()} | {"num_workers": 1}
    for name in KNOBS:
        changed = oom_key({**base, name: _other(name)}) != oom_key(base)
        assert changed == (name in MEMORY_KNOBS), name
    assert oom_key({**base, "params.width": 32}) != oom_key({**base, "params.width": 64})  # the trainable's own
    assert oom_label({**base, "precision": "bf16-mixed", "params.width": 32, "num_workers": 2}) == \
        "precision=bf16-mixed, compile=False, params.width=32, num_workers=2"
    spec = parse_spec(SPEC + "space:\n  batch_size: {type: categorical, choices: [8, 16]}\n"
                      "  precision: {type: categorical, choices: ['32', bf16-mixed]}\n"
                      "  lr: {type: categorical, choices: [0.1, 0.01]}\n  params.hidden: {type: categorical, "
                      "choices: [16, 32]}\n  num_workers: {type: categorical, choices: [1, 2]}\n"
                      "search: {probe_batch_size: true}\n".replace("budget: {num_trials: 1", "budget: {num_trials: 8"))
    combos = probe.memory_settings(spec)
    assert {k for c in combos for k in c} == ({*MEMORY_KNOBS} - {"accelerator_type"}) | {"params.hidden"}
    assert len(combos) == 2 * 2 * 2  # workers x precision x hidden; compile held at its value; lr is not memory


def test_a_probe_runs_with_the_declared_probe_values(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = parse_spec(SPEC.replace("num_steps: 5}", "num_steps: 5, eval_every_steps: 2, checkpoint_every_steps: 1}")
                      + "space: {batch_size: {type: categorical, choices: [8, 16]}}\n")
    ran: list[TrialConfig] = []
    monkeypatch.setattr(probe, "warm_reports", lambda queue, trial_id, cfg, tmp, resume: ran.append(cfg) or iter(()))
    knobs = {"batch_size": 16, "num_workers": 2}
    assert probe._try(None, spec, knobs) == ("fits", "")
    trial = resolve_trial(spec, knobs)
    assert ran == [trial.as_probe()] and trial.trace_steps == 2 and trial.checkpoint_every_steps == 1
    assert {k: getattr(ran[0], k) for k in PROBE_VALUES} == PROBE_VALUES
    assert PROBE_VALUES["probe"] is True and PROBE_VALUES["trace_steps"] == 0 and PROBE_VALUES["grad_noise_scale"] is False
    # the probe's one place: nothing else sets a probe's settings, and the loop reads them as set
    service = (REPO / "sweeps" / "service" / "probe.py").read_text()
    assert "dataclasses.replace" not in service and "probe=True" not in service
    loop = (REPO / "trainables" / "loop.py").read_text() + (REPO / "trainables" / "build.py").read_text()
    assert "cfg.trace_steps" in loop and not re.search(r"grad_noise_scale and not cfg\.probe|0 if cfg\.probe", loop)
