"""One sweep's live search state, and its memory bounds.

Tune copies and pickles the searcher, the stopper and the callback (`tuner.pkl`, its experiment
state), so they cannot hold references to what they share. The sweep's controller owns one
`SearchState` and makes it the *current* one while the sweep runs (`running`, a context variable, as a
Ray Train run's context is); every copy reads it through `current()`.

**Monotone skipping.** Once batch b ran out of memory with some memory settings (`oom_key`: the knobs
declared `memory` in `trainables.knobs`, and the trainable's own params), no batch >= b is run with them. After a memory
probe (`sweeps.service.probe`), settings it did not measure are bounded by the smallest batch it saw fail.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from sweeps.search.plan import SizeRuns
from sweeps.spec import PARAMS_PREFIX
from trainables.knobs import KNOBS, MEMORY_KNOBS


def oom_key(knobs: dict[str, Any]) -> tuple[Any, ...]:
    """Return what, besides the batch size, decides whether a trial with `knobs` fits in memory.

    That is the knobs declared `memory` (`trainables.knobs.MEMORY_KNOBS`: the precision, compile, the number of
    ranks, the accelerator type), each in its declared type (one that `knobs` leaves out at its default), then
    the trainable's own params in the space (a wider model runs out of memory at a smaller batch)."""
    own = tuple(sorted((k, str(v)) for k, v in knobs.items() if k.startswith(PARAMS_PREFIX)))
    held = []
    for name in MEMORY_KNOBS:
        kind, default, _ = KNOBS[name]
        value = knobs.get(name)
        held.append(kind(value if value is not None else default))
    return (*held, own)


def oom_label(knobs: dict[str, Any]) -> str:
    """Name the memory settings of `knobs` (its `oom_key`) as a message does.

    The knobs every space holds come first, then the trainable's own params, then the others where they are set
    (not at their default)."""
    *held, own = oom_key(knobs)
    values = dict(zip(MEMORY_KNOBS, held, strict=True))
    always = [f"{k}={v}" for k, v in values.items() if KNOBS[k][2].implicit]
    shape = [f"{k}={v}" for k, v in values.items() if not KNOBS[k][2].implicit and v != KNOBS[k][1]]
    return ", ".join([*always, *(f"{k}={v}" for k, v in own), *shape])


@dataclass
class SearchState:
    """What one sweep's searcher, stopper and callback share (see the module doc)."""

    tripped: str = ""  # why the circuit breaker stopped the sweep
    oom_bounds: dict[tuple[Any, ...], int] = field(default_factory=dict)  # oom_key -> smallest batch a trial ran out at
    probed: set[tuple[Any, ...]] = field(default_factory=set)  # oom_keys whose frontier the memory probe measured
    probe_oom: dict[tuple[Any, ...], int] = field(default_factory=dict)  # oom_key -> smallest batch the probe saw fail
    failures: dict[str, str] = field(default_factory=dict)  # errored trial id -> failure kind
    grid_left: list[dict[str, Any]] = field(default_factory=list)  # grid points the searcher has yet to hand out
    grid_skipped: list[dict[str, Any]] = field(default_factory=list)  # grid points it skipped (out of memory bounds)
    exhausted: str = ""  # why the search handed out no more trials: every configuration of the space has run
    replicate_of: dict[str, str] = field(default_factory=dict)  # a replicate's trial id -> the first trial of its configuration
    runs: SizeRuns | None = None  # the worker count's runs (sweeps.search.plan): what the ETA prices restarts by
    space_left: int | None = None  # configurations not yet handed out, where the search stops when none is left

    def record_oom(self, knobs: dict[str, Any]) -> None:
        """A trial ran out of memory: no batch this large or larger is run with the same memory settings."""
        key = oom_key(knobs)
        self.oom_bounds[key] = min(self.oom_bounds.get(key, int(knobs["batch_size"])), int(knobs["batch_size"]))

    def record_probe(self, knobs: dict[str, Any], oom_batch: int | None, measured: bool = True) -> None:
        """Record what the memory probe learnt about the memory settings of `knobs`.

        `oom_batch` is the smallest batch it saw run out of memory (None: every batch it tried fit); `measured`,
        whether it found their frontier (False when another failure stopped it, so they count as not measured)."""
        key = oom_key(knobs)
        if measured:
            self.probed.add(key)
        if oom_batch is not None:
            self.probe_oom[key] = min(self.probe_oom.get(key, oom_batch), oom_batch)

    def _bounds(self, knobs: dict[str, Any]) -> tuple[int | None, int | None]:
        """(what ran out with these very settings, the probe's smallest failure if it did not measure them)."""
        key = oom_key(knobs)
        own = [b for b in (self.oom_bounds.get(key), self.probe_oom.get(key)) if b is not None]
        # Unmeasured settings may need more memory than any the probe measured: none of its failing
        # batches is trusted to fit there.
        unmeasured = min(self.probe_oom.values()) if self.probe_oom and key not in self.probed else None
        return min(own, default=None), unmeasured

    def oom_excluded(self, knobs: dict[str, Any]) -> int | None:
        """Return the batch size that bounds `knobs` if its batch is at or above it, else None.

        The bound is what already ran out of memory with the same settings (`oom_key`), or, for settings the
        memory probe did not measure, the smallest batch the probe saw run out of memory with any settings."""
        bound = min((b for b in self._bounds(knobs) if b is not None), default=None)
        return bound if bound is not None and int(knobs["batch_size"]) >= bound else None

    def grid_skips(self, fixed: dict[str, Any]) -> list[dict[str, Any]]:
        """Return the knobs (`fixed` and the point) of each grid point that will never run.

        Those are the points the searcher skipped, and those still to hand out that what ran out of memory since
        rules out. Empty outside grid mode."""
        left = ({**fixed, **p} for p in self.grid_left)
        return [{**fixed, **p} for p in self.grid_skipped] + [k for k in left if self.oom_excluded(k) is not None]

    def oom_skip_reason(self, knobs: dict[str, Any]) -> str:
        """Why `oom_excluded` rules `knobs` out, for the log."""
        same, unmeasured = self._bounds(knobs)
        if same is not None and int(knobs["batch_size"]) >= same:
            return f"batch_size={same} already ran out of memory with {oom_label(knobs)}"
        return (f"the memory probe saw batch_size={unmeasured} run out of memory and did not measure "
                f"{oom_label(knobs)}")


_CURRENT: ContextVar[SearchState | None] = ContextVar("sweeps_search_state", default=None)


def current() -> SearchState:
    """The search state of the sweep running in this context."""
    state = _CURRENT.get()
    if state is None:
        raise RuntimeError("no sweep is running here: the searcher, stopper and callback run inside "
                           "sweeps.search.live_state.running(state)")
    return state


@contextlib.contextmanager
def running(state: SearchState) -> Iterator[SearchState]:
    """Make `state` the current search state while inside."""
    token = _CURRENT.set(state)
    try:
        yield state
    finally:
        _CURRENT.reset(token)
