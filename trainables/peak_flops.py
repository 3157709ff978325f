"""Peak dense FLOP/s per GPU and precision, for MFU. Unknown device -> None (MFU absent).

Datasheet dense (no sparsity) Tensor Core peaks; "32" is strict fp32 on the CUDA cores.
Matched by substring of `torch.cuda.get_device_name()`, most specific first.
"""

from __future__ import annotations

from collections import Counter

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


def cluster_peak(devices: list[tuple[str, str]], precision: str) -> tuple[float | None, dict[str, str]]:
    """The summed peak of a trial's GPUs, each rank's own (name, uuid), and what to tag about them.

    None where any rank's peak is unknown or ranks share a GPU (MFU is then absent, not wrong). Ranks
    on different GPU models still get an MFU over their own peaks, and a `device/gpu_models_mixed` tag."""
    facts = {"device/gpu_count": str(len({uuid for _, uuid in devices}))}
    models = Counter(name for name, _ in devices)
    if len(models) > 1:
        facts["device/gpu_models_mixed"] = ", ".join(f"{name} x{n}" for name, n in sorted(models.items()))
    if len({uuid for _, uuid in devices}) < len(devices):
        facts["device/gpu_shared"] = f"{len(devices)} ranks on {facts['device/gpu_count']} GPUs: MFU not computed"
        return None, facts
    peaks = [peak_flops(name, precision) for name, _ in devices]
    return (sum(p for p in peaks if p is not None) if all(p is not None for p in peaks) else None), facts
