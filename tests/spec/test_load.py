"""Spec validation: good files pass; each bad input fails with its field path and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeps.cli import main
from sweeps.spec import SpecError, load_spec, parse_spec

REPO = Path(__file__).resolve().parents[2]

BASE = """\
name: t
trainable: {name: mlp-tabular}
budget: {num_trials: 2, num_steps: 5}
"""


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_example_specs_validate(path: Path) -> None:
    spec, text = load_spec(path)
    assert spec.budget.num_trials >= 1 and text


def test_defaults_and_fixed_values() -> None:
    spec = parse_spec(BASE + "space:\n  pin_memory: true\n  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}\n")
    assert spec.space.fixed() == {"batch_size": 32, "precision": "32", "num_dataloader_workers": 0, "pin_memory": True, "prefetch_factor": 2, "persistent_workers": True, "compile": False}
    assert list(spec.space.searched()) == ["lr"]
    assert spec.objective.metric == "throughput/samples_per_s" and spec.scaling.num_workers == 2


BAD = {
    "unknown top-level key": (BASE + "epochs: 3\n", "line 4: epochs: unknown key; allowed:"),
    "unknown knob": (BASE + "space:\n  momentum: 0.9\n", "space.momentum: unknown key; allowed: accelerator_type, activation_checkpointing, batch_size, compile, cpu_offload, lr, num_dataloader_workers, num_workers, persistent_workers, pin_memory, precision, prefetch_factor, strategy"),
    "lr <= 0": (BASE + "space:\n  lr: {type: float, low: 0, high: 1}\n", "space.lr: 0.0 is not allowed; values must be a number > 0"),
    "unknown precision": (BASE + "space:\n  precision: {type: categorical, choices: ['32', fp8]}\n",
                          "space.precision: 'fp8' is not allowed; values must be one of ['32', 'tf32', '16-mixed', 'bf16-mixed']"),
    "float batch size": (BASE + "space:\n  batch_size: {type: float, low: 1, high: 8}\n", "space.batch_size: type float is not allowed"),
    "low > high": (BASE + "space:\n  batch_size: {type: int, low: 64, high: 8}\n", "low (64) must be <= high (8)"),
    "unknown param type": (BASE + "space:\n  lr: {type: uniform, low: 0.1, high: 1}\n", "space.lr"),
    "wrong type": (BASE.replace("num_trials: 2", "num_trials: two"), "budget.num_trials: Input should be a valid integer (got 'two')"),
    "zero trials": (BASE.replace("num_trials: 2", "num_trials: 0"), "budget.num_trials: Input should be greater than or equal to 1"),
    "missing budget": ("name: t\ntrainable: {name: mlp-tabular}\n", "budget: Field required"),
    "unknown trainable": (BASE.replace("mlp-tabular", "resnet9000"), "unknown trainable 'resnet9000': use a registered name (gpt-lm, image-cnn, mlp-tabular)"),
    "bad workload param": (BASE.replace("{name: mlp-tabular}", "{name: mlp-tabular, params: {depth: 3}}"),
                           "trainable.params: depth: unknown param for mlp-tabular; allowed: hidden, num_features"),
    "path in name": (BASE.replace("name: t", "name: ../../etc"), "name: must be 1-64 letters, digits"),
    "unknown objective metric": (BASE + "objective: {metric: speed}\n", "objective.metric: unknown metric 'speed'; choose one of"),
    "modes do not match metrics": (BASE + "objective: {metric: [throughput/samples_per_s, loss/val], mode: max}\n",
                                   "line 4: objective: give one mode per metric: 2 metric(s) need a list of 2 mode(s)"),
    "constraint without bound": (BASE + "objective: {constraints: [{metric: loss/val}]}\n",
                                 "objective.constraints.0: give max: and/or min:"),
    "nan bound": (BASE + "objective: {constraints: [{metric: loss/val, max: .nan}]}\n",
                  "objective.constraints.0.max: Input should be a finite number"),
    "asha on two objectives": (BASE + "objective: {metric: [throughput/samples_per_s, loss/val], mode: [max, min]}\n"
                               "search: {early_stopping: {grace_steps: 2}}\n",
                               "line 5: search.early_stopping: ASHA ranks trials by one metric"),
    "asha grace too long": (BASE + "search: {early_stopping: {grace_steps: 5}}\n",
                            "search.early_stopping.grace_steps (5) must be below budget.num_steps (5)"),
    "grid over a float range": (BASE + "search: {algorithm: grid}\nspace: {lr: {type: float, low: 0.1, high: 1}}\n",
                                "search.algorithm: grid needs a finite set of values, but space.lr is a continuous"),
    "grid size": (BASE + "search: {algorithm: grid}\nspace: {batch_size: {type: categorical, choices: [8, 16, 32]}}\n",
                  "line 3: budget.num_trials: the grid has 3 combinations (3 batch_size); set num_trials: 3"),
    "unknown algorithm": (BASE + "search: {algorithm: cmaes}\n", "search.algorithm: Input should be 'tpe', 'random' or 'grid'"),
    "time budget": (BASE.replace("num_steps: 5", "num_steps: 5, time_budget_s: 0"), "budget.time_budget_s: Input should be greater than 0"),
    "bad mode": (BASE + "objective: {mode: maximize}\n", "line 4: objective.mode: must be max or min (or a list of them, one per metric) (got 'maximize')"),
    "gpus without use_gpu": (BASE + "scaling: {gpus_per_worker: 1}\n", "gpus_per_worker > 0 needs use_gpu: true"),
    "not a mapping": ("- 1\n- 2\n", "the spec must be a YAML mapping"),
    "broken yaml": (BASE + "space: [1\n", "not valid YAML"),
    "python tag": (BASE + "x: !!python/object/apply:os.system ['echo pwned']\n", "not valid YAML: could not determine a constructor"),
    "param type": (BASE.replace("{name: mlp-tabular}", "{name: mlp-tabular, params: {hidden: [64]}}"),
                   "trainable.params: hidden: expected int, got list [64]"),
    "nesting bomb": ("a: " + "[" * 5000 + "]" * 5000 + "\n", "not valid YAML: nested deeper than 32 levels"),
    "alias": ("a: &x [1, 2]\nb: *x\n", "line 2: <root>: not valid YAML: aliases (*name) are not allowed"),
    # fastest correct: budgets, targets, lr scaling
    "two lengths": (BASE.replace("num_steps: 5", "num_steps: 5, num_samples: 4096"),
                    "budget: give exactly one trial length: num_steps (equal steps, for throughput), or num_samples"),
    "no length": (BASE.replace(", num_steps: 5", ""), "budget: give exactly one trial length"),
    "tokens for a samples workload": (BASE.replace("num_steps: 5", "num_tokens: 4096"),
                                      "budget.num_tokens: mlp-tabular counts samples; use budget.num_samples"),
    "equal data without warm-up": (BASE.replace("num_steps: 5", "num_samples: 4096, num_warmup_steps: 0"),
                                   "num_samples plans each trial's steps from its warm-up's items per step: "
                                   "num_warmup_steps must be >= 1"),
    "time to target without a target": (BASE + "objective: {metric: time/to_target_s}\n",
                                        "objective: time/to_target_s needs a target: add target:"),
    "time to target maximised": (BASE + "objective: {metric: time/to_target_s, mode: max, target: {metric: loss/val, max: 1}}\n",
                                 "objective: time/to_target_s is a time: mode must be min"),
    "target without eval cadence": (BASE + "objective: {metric: time/to_target_s, target: {metric: loss/val, max: 0.5}}\n", "objective.target: set budget.eval_every_steps"),
    "target with checkpoints": (BASE.replace("num_steps: 5", "num_steps: 5, eval_every_steps: 5, checkpoint_every_steps: 2")
                                + "objective: {metric: time/to_target_s, target: {metric: loss/val, max: 0.5}}\n", "a time to target cannot be measured across a restart"),
    "target on a throughput": (BASE.replace("num_steps: 5", "num_steps: 5, eval_every_steps: 5")
                               + "objective: {metric: time/to_target_s, target: {metric: time/step_ms, max: 1}}\n",
                               "objective.target.metric: time/step_ms is not measured by an evaluation"),
    "two-sided target": (BASE + "objective: {metric: time/to_target_s, target: {metric: loss/val, max: 1, min: 0}}\n",
                         "objective.target: a target is one bound"),
    "rank by a prediction": (BASE + "objective: {metric: predict/time_to_target_s, mode: min}\n",
                             "predict/time_to_target_s is computed by the sweep after its trials end"),
    "asha on equal data": (BASE.replace("num_steps: 5", "num_samples: 4096") + "search: {early_stopping: {grace_steps: 2}}\n",
                           "ASHA compares trials at equal steps, which an equal-data budget does not give"),
    "asha grace in seconds without a target": (BASE + "search: {early_stopping: {grace_s: 2}}\n",
                                               "search.early_stopping.grace_s is for a time-to-target objective"),
    "asha grace in steps with a target": (BASE.replace("num_steps: 5", "num_steps: 5, eval_every_steps: 5")
                                          + "objective: {metric: time/to_target_s, target: {metric: loss/val, max: 0.5}}\n"
                                          + "search: {early_stopping: {grace_steps: 2}}\n",
                                          "with objective.target, ASHA compares trials on loss/val at equal training "
                                          "time; give grace_s"),
    "rank by the elapsed clock": (BASE.replace("num_steps: 5", "num_steps: 5, eval_every_steps: 5")
                                  + "objective: {metric: time/elapsed_s, mode: min}\n", "unknown metric 'time/elapsed_s'"),
    "asha with two graces": (BASE + "search: {early_stopping: {grace_steps: 2, grace_s: 2}}\n",
                             "line 4: search.early_stopping: give exactly one of grace_steps"),
    "min window with equal data": (BASE.replace("num_steps: 5", "num_samples: 4096, min_window_s: 10"),
                                   "budget: min_window_s: 10 has no effect with num_samples: an equal-data budget sets "
                                   "each trial's length"),
    "negative min window": (BASE.replace("num_steps: 5", "num_steps: 5, min_window_s: -1"),
                            "budget.min_window_s: Input should be greater than or equal to 0"),
    "min window with asha on steps": (BASE.replace("num_steps: 5", "num_steps: 50, min_window_s: 10")
                                      + "search: {early_stopping: {grace_steps: 5}}\n",
                                      "budget.min_window_s: 10 would run trials past num_steps, where ASHA"),
    "lr scaling rule": (BASE + "lr_scaling: {rule: cubic, reference_batch_size: 64}\n",
                        "lr_scaling.rule: Input should be 'linear', 'sqrt' or 'none'"),
    "lr scaling reference": (BASE + "lr_scaling: {rule: linear}\n", "lr_scaling.reference_batch_size: Field required"),
    # a scheme pyarrow cannot open would fail only once Ray started
    "storage on an unknown scheme": (BASE + "storage_path: ftp://host/sweeps\n",
                                     "storage_path: 'ftp://host/sweeps': the scheme 'ftp' is not a filesystem"),
}


@pytest.mark.parametrize("text,expected", list(BAD.values()), ids=list(BAD))
def test_bad_specs_name_the_field_and_fix(text: str, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "bad.yaml")
    assert expected in str(info.value)


def test_every_problem_reported_at_once() -> None:
    text = BASE.replace("num_trials: 2", "num_trials: 0") + "space:\n  lr: {type: float, low: -1, high: 1}\n  momentum: 1\n"
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    paths = [p.path for p in info.value.problems]
    assert paths == ["budget.num_trials", "space.lr", "space.momentum"]
    assert [p.line for p in info.value.problems] == [3, 5, 6]


def test_cli_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(BASE)
    assert main(["validate", str(good)]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE + "space:\n  lr: -1\n")
    assert main(["validate", str(bad)]) == 2
    assert "space.lr: -1 is not allowed" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read the spec" in capsys.readouterr().err


def test_cli_validate_refuses_a_worker_count_that_never_fits_the_cluster_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "scaling.yaml"
    spec.write_text((Path(__file__).resolve().parents[2] / "examples" / "scaling.yaml").read_text()
                    .replace("choices: [1, 2]}", "choices: [1, 2, 4]}").replace("num_trials: 4 ", "num_trials: 6 "))
    assert main(["validate", str(spec)]) == 0  # no cluster named: the spec alone is fine
    capsys.readouterr()
    assert main(["validate", str(spec), "--cpus", "2"]) == 2
    err = capsys.readouterr().err
    assert "space.num_workers" in err and "drop 4 from space.num_workers (at most 2 fit)" in err
    assert main(["validate", str(spec), "--cpus", "4"]) == 0
    assert "its largest trial fits 4 CPUs and 0 GPUs" in capsys.readouterr().out


def test_objective_follows_the_workload_unit() -> None:
    gpt = BASE.replace("mlp-tabular", "gpt-lm")
    assert parse_spec(gpt).objective.metric == "throughput/tokens_per_s"
    # the default of one spec never leaks into the next (pydantic shares default instances)
    assert parse_spec(BASE).objective.metric == "throughput/samples_per_s"
    assert parse_spec(BASE.replace("mlp-tabular", "'pkg.mod:fn'")).objective.metric == "throughput/samples_per_s"
    with pytest.raises(SpecError, match=r"gpt-lm reports throughput/tokens_per_s, not throughput/samples_per_s"):
        parse_spec(gpt + "objective: {metric: throughput/samples_per_s}\n")
    assert parse_spec(BASE + "space: {compile: {type: categorical, choices: [false, true]}}\n").space.searched()


def test_a_trial_larger_than_a_fixed_cluster_is_refused_before_it_runs() -> None:
    from sweeps.service.resources import refuse_if_never_fits

    spec = parse_spec(BASE + "scaling: {num_workers: 2, cpus_per_worker: 2}\n")
    with pytest.raises(SpecError, match=r"scaling: a trial needs num_workers x cpus_per_worker = 2 x 2 CPUs but this cluster has 2"):
        refuse_if_never_fits(spec, {"CPU": 2.0})
    refuse_if_never_fits(spec, {"CPU": 4.0})
    with pytest.raises(SpecError, match="needs 2 GPUs but this cluster has 0"):
        refuse_if_never_fits(parse_spec(BASE + "scaling: {use_gpu: true}\n"), {"CPU": 8.0})


def test_min_window_defaults_to_ten_seconds_on_gpu_and_off_on_cpu() -> None:
    from sweeps.search.trials import resolve_trial

    cpu = parse_spec(BASE)
    gpu = parse_spec(BASE + "scaling: {use_gpu: true, num_workers: 1}\n")
    given = parse_spec(BASE.replace("num_steps: 5", "num_steps: 5, min_window_s: 3.5"))
    assert [resolve_trial(s, {}).min_window_s for s in (cpu, gpu, given)] == [0.0, 10.0, 3.5]
    data = parse_spec(BASE.replace("num_steps: 5", "num_samples: 4096") + "scaling: {use_gpu: true, num_workers: 1}\n")
    assert resolve_trial(data, {}).min_window_s == 0.0  # the data budget rules
    asha = parse_spec(BASE.replace("num_steps: 5", "num_steps: 50") + "search: {early_stopping: {grace_steps: 5}}\n"
                      + "scaling: {use_gpu: true, num_workers: 1}\n")
    assert resolve_trial(asha, {}).min_window_s == 0.0  # ASHA ends trials at num_steps: steps rule
