"""Conformance suite: every registered workload (and the user-defined example) builds, trains
a few CPU steps under each precision the CPU supports, emits the required metric keys, lowers
its loss on a fixed seed, and repeats itself exactly with the same seed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainables import contract, registry
from trainables.contract import TrialConfig
from trainables.loop import train
from trainables.loop_errors import WorkloadError
from trainables.reporting import ListReporter

CPU = torch.device("cpu")
CPU_PRECISIONS = ("32", "bf16-mixed", "16-mixed")  # tf32 does not exist on a CPU
TINY: dict[str, dict[str, object]] = {
    "image-cnn": {"image_size": 16, "num_train_images": 256, "num_val_images": 64, "width": 8, "depth": 1},
    "mlp-tabular": {"num_train_rows": 1024, "num_val_rows": 256},
    "gpt-lm": {"preset": "tiny", "num_train_tokens": 32768, "num_val_tokens": 4096},
    "examples.custom_trainable:build": {"num_rows": 1024},
    # the open step contract: dict batches + step_fn + optimizer groups + eval_fn; a Hugging Face
    # model with a padding collate_fn and token counting; an IterableDataset that shards itself
    "examples.dict_batch_model:build": {"num_rows": 1024},
    "examples.hf_causal_lm:build": {"num_train_seqs": 256, "num_val_seqs": 32, "hidden_size": 32, "max_len": 24},
    "examples.streaming:build": {"num_val_rows": 128},
}
WORKLOADS = [*registry.names(), "examples.custom_trainable:build", "examples.dict_batch_model:build",
             "examples.hf_causal_lm:build", "examples.streaming:build"]


def test_every_registered_workload_is_in_the_suite() -> None:
    assert set(registry.names()) <= set(TINY), "add tiny params for the new workload to TINY"


def _run(name: str, data_dir: Path, precision: str = "32", seed: int = 0, steps: int = 16) -> tuple[dict, list[dict]]:
    cfg = TrialConfig(workload=name, workload_params=TINY[name], batch_size=32, precision=precision, lr=1e-2,
                      num_steps=steps, num_warmup_steps=2, report_interval_s=1e-6, seed=seed, data_dir=str(data_dir))
    rep = ListReporter()
    return train(cfg, rep, CPU), rep.reports


@pytest.mark.parametrize("precision", CPU_PRECISIONS)
@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_trains_under_precision(name: str, precision: str, data_dir: Path) -> None:
    final, reports = _run(name, data_dir, precision, steps=8 if precision == "16-mixed" else 16)
    unit = registry.build(name, TINY[name], _ctx(data_dir)).unit
    for key in (contract.throughput_key(unit), contract.LOSS_TRAIN, contract.LOSS_VAL, contract.STEP_TIME_MS, contract.DATA_WAIT_PCT):
        assert contract.is_metric(key, final[key]), key
    assert final[contract.throughput_key(unit)] > 0


@pytest.mark.parametrize("name", WORKLOADS)
def test_loss_falls_and_same_seed_repeats(name: str, data_dir: Path) -> None:
    final_a, reports = _run(name, data_dir)
    final_b, _ = _run(name, data_dir)
    first = sum(r[contract.LOSS_TRAIN] for r in reports[:3]) / 3
    last = sum(r[contract.LOSS_TRAIN] for r in reports[-3:]) / 3
    assert last < first, (first, last)
    assert final_a[contract.LOSS_VAL] == final_b[contract.LOSS_VAL]


def _ctx(data_dir: Path):  # noqa: ANN202
    from trainables.workloads.base import BuildContext

    return BuildContext(str(data_dir), seed=0)


def test_unknown_name_lists_registered_workloads() -> None:
    with pytest.raises(WorkloadError, match=r"registered name \(gpt-lm, image-cnn, mlp-tabular\)"):
        registry.build("resnet-9000", {}, _ctx(Path(".")))


def test_user_function_returning_the_wrong_thing_is_explained(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"returned Linear, not a trainables.Workload\(model=..., train_dataset="):
        registry.build("examples.custom_trainable:not_a_workload", {}, _ctx(tmp_path))
    with pytest.raises(WorkloadError, match="cannot import trainable 'examples.nope:build'"):
        registry.build("examples.nope:build", {}, _ctx(tmp_path))


def test_gpt_lm_reports_tokens_and_flops(data_dir: Path) -> None:
    final, _ = _run("gpt-lm", data_dir, steps=4)
    assert final["throughput/tokens_per_s"] == pytest.approx(final["throughput/tokens_per_s_per_worker"])
    assert "throughput/samples_per_s" not in final
    assert final[contract.TFLOPS] > 0
    assert contract.MFU_PCT not in final  # no known peak for a CPU: absent, never 0


def test_the_data_a_trial_makes_is_timed_once_and_found_made_by_the_next(tmp_path: Path) -> None:
    """`time/data_prep_s`: the first trial on a node writes the token shards (part of its build); the next one
    finds them made, so the ETA can leave that one-off out of what later trials cost (sweeps.service.progress)."""
    first, _ = _run("gpt-lm", tmp_path, steps=2)
    again, _ = _run("gpt-lm", tmp_path, steps=2)
    assert first[contract.DATA_PREP_S] > 0 and first[contract.BUILD_S] >= first[contract.DATA_PREP_S]
    assert first[contract.WARMUP_S] >= first[contract.BUILD_S]
    assert again[contract.DATA_PREP_S] == 0.0 and again[contract.BUILD_S] > 0
    made_in_memory, _ = _run("mlp-tabular", tmp_path, steps=2)  # its rows never go through ensure_cached
    assert contract.DATA_PREP_S not in made_in_memory and made_in_memory[contract.BUILD_S] > 0  # absent, not 0


def test_gpt2_small_preset_is_124m_parameters() -> None:
    from trainables.workloads.gpt_lm import GPT, PRESETS, flops_per_token

    p = PRESETS["gpt2-small"]
    model = GPT(p)
    assert p.vocab_size % 128 == 0
    assert round(sum(q.numel() for q in model.parameters()) / 1e6) == 124
    assert flops_per_token(model, p) == pytest.approx(6 * (124_475_904 - 1024 * 768) + 12 * 12 * 768 * 1024)


def test_compile_knob_matches_eager(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its own inductor cache (torch 2.13's key leaves ATEN_CPU_CAPABILITY out): kernels cached without that
    # variable gave a NaN loss when loaded under ATEN_CPU_CAPABILITY=avx2, and those cached under it aborted
    # the process when loaded without it (both seen on the AMD EPYC with avx512_bf16, 2026-11-25).
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cfg = dict(workload="gpt-lm", workload_params=TINY["gpt-lm"], batch_size=8, precision="32", lr=1e-2,
               num_steps=3, num_warmup_steps=2, data_dir=str(data_dir))
    eager = train(TrialConfig(**cfg), ListReporter(), CPU)  # type: ignore[arg-type]
    compiled = train(TrialConfig(**cfg, compile=True), ListReporter(), CPU)  # type: ignore[arg-type]
    assert compiled[contract.LOSS_VAL] == pytest.approx(eager[contract.LOSS_VAL], rel=1e-3)
    # a fresh cache compiles every graph; the same trial again in this process (a warm rank's next trial) compiles
    # nothing: dynamo runs the code it compiled for the first model (the same classes), and the cache is not asked
    assert compiled[contract.COMPILE_GRAPHS] > 0 and compiled[contract.COMPILE_CACHE_MISSES] > 0, compiled
    assert compiled[contract.COMPILE_CACHE_HITS] == 0, compiled
    assert not {contract.COMPILE_GRAPHS, contract.COMPILE_CACHE_HITS, contract.COMPILE_CACHE_MISSES} & set(eager)
    again = train(TrialConfig(**cfg, compile=True), ListReporter(), CPU)  # type: ignore[arg-type]
    assert again[contract.COMPILE_GRAPHS] == again[contract.COMPILE_CACHE_MISSES] == again[contract.COMPILE_CACHE_HITS] == 0, again
