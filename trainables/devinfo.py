"""Facts about the device a worker runs on, as short strings (MLflow tags)."""

from __future__ import annotations

import platform
from functools import lru_cache

import torch

# CPU ISA flags that decide whether bf16/fp16 run natively on a CPU.
_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile")


@lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def cpu_model() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_isa_flags() -> str:
    flags = set(_cpuinfo().get("flags", "").split())
    return " ".join(f for f in _ISA_FLAGS if f in flags) or "none-of:" + ",".join(_ISA_FLAGS)


def device_facts(device: torch.device) -> dict[str, str]:
    facts = {
        "device/type": device.type,
        "device/cpu": cpu_model(),
        "device/cpu_isa": cpu_isa_flags(),
        "device/torch": str(torch.__version__),  # a plain str: a TorchVersion unpickles only where torch imports (~1 s)
    }
    if device.type == "cuda":
        facts["device/name"] = torch.cuda.get_device_name(device)
        facts["device/cuda"] = str(torch.version.cuda)
        major, minor = torch.cuda.get_device_capability(device)
        facts["device/capability"] = f"{major}.{minor}"
    else:
        facts["device/name"] = cpu_model()
    return facts
