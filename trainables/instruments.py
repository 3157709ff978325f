"""What measures a trial while it trains, beside its step clock.

The NVML/psutil sampler, the gradient noise scale and the all-reduce wait timer (DDP's comm hook), each
absent where off."""

from __future__ import annotations

from dataclasses import dataclass

from trainables.noise_scale import CommTimer, NoiseScale
from trainables.telemetry import Telemetry


@dataclass
class Instruments:
    telemetry: Telemetry | None = None  # utilisation, memory, power, temperature (period > 0)
    noise: NoiseScale | None = None  # the gradient noise scale (DDP ranks, or micro-batches on one rank)
    comm: CommTimer | None = None  # DDP: the wait for the gradient all-reduce backward did not hide
