"""Errors the loop raises on purpose; the service classifies trial failures by these types."""

from __future__ import annotations


class UnsupportedError(ValueError):
    """The hardware cannot run what the trial asks for (e.g. TF32 on a CPU)."""


class DivergedError(RuntimeError):
    """The loss became NaN or infinite."""


class WorkloadError(ValueError):
    """A workload (registered or user-defined) is misnamed, misconfigured or malformed."""
