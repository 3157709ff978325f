"""The open step contract in one process: any batch shape, a user's step, counting, data,
optimisation pieces and eval metrics; each piece done wrong fails as `config` with the fix."""

from __future__ import annotations

import io
from collections import OrderedDict, namedtuple
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from sweeps.service.failures import classify
from trainables import contract, registry
from trainables.batches import move_to_device
from trainables.contract import TrialConfig
from trainables.length import TrialLength
from trainables.loop import _make_schedule, train
from trainables.loop_errors import WorkloadError
from trainables.reporting import ListReporter
from trainables.workloads.base import BuildContext

CPU = torch.device("cpu")
META = torch.device("meta")  # a second device on a CPU-only machine: proves every tensor was moved


def _cfg(workload: str, params: dict[str, Any] | None = None, **kw: Any) -> TrialConfig:
    base: dict[str, Any] = dict(workload=workload, workload_params=params or {}, batch_size=16, precision="32",
                                lr=3e-3, num_steps=6, num_warmup_steps=2, report_interval_s=1e-6)
    return TrialConfig(**(base | kw))


@dataclass
class _Pair:
    pixels: torch.Tensor
    label: torch.Tensor


def test_every_batch_shape_is_moved_with_its_containers_kept() -> None:
    from transformers import BatchEncoding

    Row = namedtuple("Row", "x y")
    t = torch.ones(2, 3)
    batch = {"enc": BatchEncoding({"input_ids": t.long()}), "pair": _Pair(t, t[:, 0]), "row": Row(t, [t, (t, "tag")]),
             "od": OrderedDict(a=t), "n": 3, "s": "text"}
    moved = move_to_device(batch, META)
    assert isinstance(moved["enc"], BatchEncoding) and moved["enc"]["input_ids"].device == META
    assert isinstance(moved["pair"], _Pair) and moved["pair"].pixels.device == META and moved["pair"].label.device == META
    assert isinstance(moved["row"], Row) and moved["row"].x.device == META
    assert isinstance(moved["row"].y, list) and moved["row"].y[1][0].device == META and moved["row"].y[1][1] == "tag"
    assert isinstance(moved["od"], OrderedDict) and moved["od"]["a"].device == META
    assert (moved["n"], moved["s"]) == (3, "text") and batch["pair"].pixels.device == CPU  # the input is untouched


def test_channels_last_applies_to_image_tensors_only() -> None:
    img, ids, seq = torch.rand(2, 3, 8, 8), torch.ones(2, 3, 8, 8, dtype=torch.long), torch.rand(2, 3, 8)
    moved = move_to_device({"img": img, "ids": ids, "seq": seq}, CPU, channels_last=True)
    assert moved["img"].is_contiguous(memory_format=torch.channels_last) and not img.is_contiguous(memory_format=torch.channels_last)
    assert not moved["ids"].is_contiguous(memory_format=torch.channels_last) and moved["seq"].is_contiguous()


def test_dict_batches_with_step_optimizer_groups_and_eval(tmp_path: Path) -> None:
    rep = ListReporter()
    final = train(_cfg("examples.dict_batch_model:build", num_steps=30, lr=1e-2, data_dir=str(tmp_path)), rep, CPU)
    assert 0.0 <= final["eval/accuracy"] <= 1.0 and final["eval/accuracy"] > 0.5  # 4 classes: chance is 0.25
    assert rep.reports[-1][contract.LOSS_TRAIN] < rep.reports[0][contract.LOSS_TRAIN]
    assert final["throughput/samples_per_s"] > 0 and "eval/accuracy" not in rep.reports[0]  # eval: final only


def test_hf_model_counts_real_tokens_not_padding(tmp_path: Path) -> None:
    # every sequence has 24 real tokens, every batch is padded to 32: a known 25% padding
    params = {"min_len": 24, "max_len": 24, "pad_to": 32, "num_train_seqs": 64, "num_val_seqs": 16}
    final = train(_cfg("examples.hf_causal_lm:build", params, batch_size=4, data_dir=str(tmp_path)), ListReporter(), CPU)
    steps = final[contract.STEPS]
    counted = final["throughput/tokens_per_s"] * final[contract.STEP_TIME_MS] * steps / 1000
    assert counted == pytest.approx(steps * 4 * 24, rel=1e-9)  # not steps * 4 * 32
    assert 0.0 <= final["eval/token_accuracy"] <= 1.0 and "throughput/samples_per_s" not in final


def _params_after(cfg: TrialConfig) -> dict[str, torch.Tensor]:
    rep = ListReporter()
    train(cfg, rep, CPU)
    return torch.load(io.BytesIO(rep.checkpoints[0]), weights_only=True)["model"]  # type: ignore[no-any-return]


def test_accumulation_is_exact(tmp_path: Path) -> None:
    common = dict(params={"num_train_rows": 1024, "num_val_rows": 64}, num_warmup_steps=0, num_steps=4,
                  checkpoint_every_steps=3, lr=1e-2, data_dir=str(tmp_path))
    accumulated = _params_after(_cfg("mlp-tabular", batch_size=8, grad_accum_steps=4, **common))
    whole = _params_after(_cfg("mlp-tabular", batch_size=32, grad_accum_steps=1, **common))
    plain = _params_after(_cfg("mlp-tabular", batch_size=8, grad_accum_steps=1, **common))
    for name, value in whole.items():
        torch.testing.assert_close(accumulated[name], value, rtol=1e-5, atol=1e-6)
    assert any(not torch.allclose(plain[n], v, atol=1e-4) for n, v in whole.items())  # the test can fail


@pytest.mark.parametrize("precision", ["32", "16-mixed"])
def test_clipping_bounds_the_true_gradient_after_unscaling(precision: str, tmp_path: Path) -> None:
    lr, max_norm = 0.1, 1e-4
    torch.manual_seed(0)
    before = registry.build("tests.helpers.user_pieces:sgd_mlp", {}, BuildContext(str(tmp_path), 0)).model.state_dict()
    after = _params_after(_cfg("tests.helpers.user_pieces:sgd_mlp", precision=precision, lr=lr, max_grad_norm=max_norm,
                               num_warmup_steps=0, num_steps=2, checkpoint_every_steps=1, data_dir=str(tmp_path)))
    moved = torch.sqrt(sum(((after[k] - v) ** 2).sum() for k, v in before.items()))
    assert float(moved) == pytest.approx(lr * max_norm, rel=1e-3)  # SGD: |update| = lr x |clipped grad|


def test_lr_warmup_then_cosine_to_zero() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    cfg = _cfg("mlp-tabular", num_warmup_steps=2, num_steps=8, lr_warmup_steps=4, lr_schedule="cosine")
    sched = _make_schedule(opt, cfg, TrialLength(cfg, 1))
    assert sched is not None
    rates = []
    for _ in range(10):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert rates[4] == pytest.approx(1.0) and rates[-1] < 0.1 and rates == sorted(rates[:5]) + rates[5:]
    constant = _cfg("mlp-tabular")
    assert _make_schedule(opt, constant, TrialLength(constant, 1)) is None  # constant, no warm-up: nothing added


def test_streaming_dataset_shards_itself_and_runs_with_loader_workers(tmp_path: Path) -> None:
    from examples.streaming import Stream

    w = torch.ones(3)
    rows = [[float(x.sum()) for x, _ in Stream(w, 0, rank, 2, 0, total_rows=10)] for rank in (0, 1)]
    everything = [float(x.sum()) for x, _ in Stream(w, 0, 0, 1, 0, total_rows=10)]
    assert sorted(rows[0] + rows[1]) == sorted(everything) and len(rows[0]) == len(rows[1]) == 5
    final = train(_cfg("examples.streaming:build", num_dataloader_workers=2, persistent_workers=False,
                       data_dir=str(tmp_path)), ListReporter(), CPU)
    assert final[contract.STEPS] == 6 and final[contract.LOSS_VAL] > 0


def test_a_stream_that_ends_early_says_how_many_batches_it_gave(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"IterableDataset ended after 2 batches on this rank, but the trial needs "
                                            r"16 .*lower budget.num_steps"):
        train(_cfg("examples.streaming:build", {"train_rows_per_shard": 40}, data_dir=str(tmp_path),
                   grad_accum_steps=2), ListReporter(), CPU)


BAD = {
    "non_scalar": r"step_fn returned a loss of shape \(16,\), not a scalar: reduce it",
    "non_tensor": r"step_fn returned dict whose loss is float: return a scalar tensor",
    "no_grad": r"step_fn returned a loss without grad",
    "count_zero": r"count_items returned 0 for a batch",
    "count_tensor": r"count_items returned Tensor .* not an int: return a Python int",
    "eval_string": r"eval_fn returned non-numbers \('accuracy': str\)",
    "eval_list": r"eval_fn returned non-numbers \('accuracy': list\)",
    "empty_stream": r"the training IterableDataset ended after 0 batches",
    "no_step": r"the default step expects \(input, target\) batches, got a dict: give the workload step_fn",
}


@pytest.mark.parametrize("mode", list(BAD))
def test_each_piece_done_wrong_is_a_config_failure_naming_the_fix(mode: str, tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=BAD[mode]) as info:
        train(_cfg("tests.helpers.user_pieces:bad", {"mode": mode}, data_dir=str(tmp_path)), ListReporter(), CPU)
    assert classify(info.value)[0] == "config"


def test_a_declared_unit_the_workload_does_not_count_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"declares UNIT = 'tokens' but its Workload counts 'samples': pass unit='tokens'"):
        registry.build("tests.helpers.unit_mismatch:build_samples", {}, BuildContext(str(tmp_path), 0))
