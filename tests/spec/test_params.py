"""The spec side of "bring your own model": the trainable's own params in the space, the new
optimisation knobs, eval/* metrics, the declared unit, and a spec layer that imports no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sweeps.cli import main
from sweeps.search.trials import resolve_trial, trial_params
from sweeps.spec import SpecError, load_spec, parse_spec

REPO = Path(__file__).resolve().parents[2]
HF = """\
name: hf
trainable: {name: examples.hf_causal_lm:build, params: {num_layers: 1}}
budget: {num_trials: 2, num_steps: 5}
"""
MLP = "name: t\ntrainable: {name: mlp-tabular}\nbudget: {num_trials: 2, num_steps: 5}\n"


def test_own_params_are_searched_merged_and_logged() -> None:
    spec = parse_spec(HF + "space:\n  params.hidden_size: {type: categorical, choices: [32, 64]}\n"
                      "  params.dropout: 0.1\n  grad_accum_steps: {type: categorical, choices: [1, 4]}\n"
                      "scaling: {num_workers: 2}\n")
    assert set(spec.space.searched()) == {"params.hidden_size", "grad_accum_steps"}
    cfg = resolve_trial(spec, {"params.hidden_size": 64, "grad_accum_steps": 4})
    assert cfg.workload_params == {"num_layers": 1, "dropout": 0.1, "hidden_size": 64} and cfg.grad_accum_steps == 4
    logged = trial_params(spec, cfg)
    assert logged["workload.hidden_size"] == 64 and logged["grad_accum_steps"] == 4
    assert logged["global_batch_size"] == 32 * 4 * 2  # batch x accumulation x workers
    assert (logged["lr_schedule"], logged["max_grad_norm"], logged["lr_warmup_steps"]) == ("constant", 0.0, 0)
    # the nested spelling is the same thing
    nested = parse_spec(HF + "space: {params: {hidden_size: {type: categorical, choices: [32, 64]}}}\n")
    assert set(nested.space.searched()) == {"params.hidden_size"}


def test_the_unit_follows_the_declared_trainable() -> None:
    assert parse_spec(HF).objective.metric == "throughput/tokens_per_s"
    with pytest.raises(SpecError, match=r"reports throughput/tokens_per_s, not throughput/samples_per_s"):
        parse_spec(HF + "objective: {metric: throughput/samples_per_s}\n")
    spec = parse_spec(HF + "objective: {metric: throughput/tokens_per_s, constraints: [{metric: eval/token_accuracy, min: 0.5}]}\n")
    assert spec.objective.constraints[0].metric == "eval/token_accuracy"


BAD = {
    "undeclared own param": (HF + "space: {params.hiden_size: {type: categorical, choices: [32, 64]}}\n",
                             "space.params.hiden_size: unknown param for examples.hf_causal_lm:build; allowed: dropout, "
                             "hidden_size, max_len"),
    "own param of the wrong type": (HF + "space: {params.hidden_size: {type: float, low: 16, high: 64}}\n",
                                    "space.params.hidden_size: expected int, got float 16.0"),
    "registered param in the space": (MLP + "space: {params.depth: {type: int, low: 1, high: 3}}\n",
                                      "space.params.depth: unknown param for mlp-tabular; allowed: hidden, num_features"),
    "registered param out of range": (MLP + "space: {params.hidden: {type: int, low: 0, high: 3}}\n",
                                      "space.params.hidden: num_features, hidden, num_train_rows and num_val_rows must be >= 1"),
    "own param set twice": (HF + "space: {params.num_layers: {type: int, low: 1, high: 2}}\n",
                            "space.params.num_layers: also set in trainable.params; keep it in one place"),
    "no accumulation": (MLP + "space: {grad_accum_steps: 0}\n",
                        "space.grad_accum_steps: 0 is not allowed; values must be an integer >= 1"),
    "negative clipping": (MLP + "space: {max_grad_norm: -1.0}\n", "space.max_grad_norm: -1.0 is not allowed; values must be a number >= 0"),
    "unknown schedule": (MLP + "space: {lr_schedule: linear}\n", "space.lr_schedule: 'linear' is not allowed; values must be one of ['constant', 'cosine']"),
    "unknown knob lists the groups": (MLP + "space: {momentum: 0.9}\n",
                                      "optimisation: grad_accum_steps, lr_schedule, lr_warmup_steps, max_grad_norm; the trainable's own: params.<name>"),
    "not an eval metric": (MLP + "objective: {metric: evaluation/accuracy}\n", "or eval/<name> for a metric of the trainable's eval_fn"),
    "asha on a final-only metric": (MLP + "objective: {metric: loss/val, mode: min}\nsearch: {early_stopping: {grace_steps: 2}}\n",
                                    "search.early_stopping: ASHA compares trials on their progress reports, and loss/val is only in a trial's final report"),
}


@pytest.mark.parametrize("text,expected", list(BAD.values()), ids=list(BAD))
def test_bad_own_params_and_knobs_name_the_field_and_fix(text: str, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "bad.yaml")
    assert expected in str(info.value)


def test_validate_rejects_an_undeclared_param_listing_the_declared_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(HF + "space: {params.widht: {type: int, low: 1, high: 4}}\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "space.params.widht: unknown param for examples.hf_causal_lm:build; allowed: dropout, hidden_size" in err


@pytest.mark.parametrize("data,kind", [("name: t\n".encode("utf-16"), "UTF-16 text"), (b"\x89PNG\r\n\x1a\n\x00\x00", "not text"),
                                       ("name: t\n".encode("utf-16-le"), "NUL bytes")])
def test_a_spec_that_is_not_utf8_is_a_clean_error(tmp_path: Path, data: bytes, kind: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(data)
    with pytest.raises(SpecError, match="the spec must be UTF-8 text") as info:
        load_spec(path)
    assert kind in str(info.value)


def test_validating_a_spec_imports_no_torch_and_no_model_code() -> None:
    code = ("import sys\nfrom sweeps.spec import load_spec\n"
            "for s in ('demo', 'custom', 'hf_causal_lm'): load_spec(f'examples/{s}.yaml')\n"
            "print(sorted(m for m in ('torch', 'ray', 'mlflow', 'optuna', 'transformers', 'examples.hf_causal_lm') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
