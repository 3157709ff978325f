"""Mixed precisions never switch TF32 on by themselves; the flags in effect are recorded as tags.
The CUDA branch runs with the device queries faked (no GPU on this machine)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from trainables.loop_errors import UnsupportedError
from trainables.precision import resolve_precision

CUDA = torch.device("cuda", 0)


@pytest.fixture
def fake_hopper(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[0], saved[1]
    torch.set_float32_matmul_precision(saved[2])


@pytest.mark.parametrize("name,knob,tf32", [("32", False, False), ("tf32", False, True), ("bf16-mixed", False, False),
                                             ("16-mixed", False, False), ("bf16-mixed", True, True), ("16-mixed", True, True)])
def test_tf32_only_when_asked(fake_hopper: None, name: str, knob: bool, tf32: bool) -> None:
    prec = resolve_precision(name, CUDA, tf32_under_autocast=knob)
    assert prec.allow_tf32 is tf32
    tags = prec.apply_matmul_flags()
    assert tags["precision/cuda_matmul_tf32"] == tags["precision/cudnn_tf32"] == str(tf32)
    assert tags["precision/float32_matmul"] == ("high" if tf32 else "highest")
    assert tags["precision/grad_scaler"] == str(name == "16-mixed")
    assert tags["precision/autocast_dtype"] == {"bf16-mixed": "bfloat16", "16-mixed": "float16"}.get(name, "none")


def test_strict_fp32_with_tf32_under_autocast_is_refused() -> None:
    with pytest.raises(UnsupportedError, match="precision 32 is strict fp32: tf32_under_autocast applies to"):
        resolve_precision("32", torch.device("cpu"), tf32_under_autocast=True)
