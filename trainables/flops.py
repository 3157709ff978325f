"""Peak dense FLOP/s per GPU and precision, for MFU. Unknown device -> None (MFU absent).

Datasheet dense (no sparsity) Tensor Core peaks; "32" is strict fp32 on the CUDA cores.
Matched by substring of `torch.cuda.get_device_name()`, most specific first.
"""

from __future__ import annotations

_TFLOPS: list[tuple[str, dict[str, float]]] = [
    # name fragment, {precision: dense peak TFLOP/s}
    ("H200", {"bf16-mixed": 989.4, "16-mixed": 989.4, "tf32": 494.7, "32": 66.9}),
    ("H100 PCIe", {"bf16-mixed": 756.5, "16-mixed": 756.5, "tf32": 378.0, "32": 51.2}),
    ("H100", {"bf16-mixed": 989.4, "16-mixed": 989.4, "tf32": 494.7, "32": 66.9}),  # SXM
    ("A100", {"bf16-mixed": 312.0, "16-mixed": 312.0, "tf32": 156.0, "32": 19.5}),
    ("V100", {"16-mixed": 125.0, "32": 15.7}),
]


def peak_flops(device_name: str, precision: str) -> float | None:
    """Peak FLOP/s of one device at `precision`, or None where it is not known."""
    for fragment, table in _TFLOPS:
        if fragment in device_name:
            tflops = table.get(precision)
            return tflops * 1e12 if tflops is not None else None
    return None
