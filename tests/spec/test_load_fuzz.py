"""Fuzz the spec loader: any input validates or raises SpecError — never another exception."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sweeps.spec import SpecError, SweepSpec, parse_spec

_KEYS = ["name", "trainable", "space", "budget", "objective", "scaling", "tracking", "seed", "storage_path",
         "batch_size", "lr", "precision", "type", "low", "high", "choices", "num_trials", "num_steps", "params",
         "metric", "mode", "num_workers", "use_gpu", "log", "step", "pin_memory", "x"]
_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=12),
                  st.sampled_from(["image-cnn", "mlp-tabular", "float", "int", "categorical", "32", "bf16-mixed", "max"]))
_tree = st.recursive(_leaf, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.sampled_from(_KEYS), c, max_size=6)),
                     max_leaves=25)


def _check(text: str) -> None:
    try:
        assert isinstance(parse_spec(text), SweepSpec)
    except SpecError as exc:
        assert exc.problems and all(str(p) for p in exc.problems)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tree)
def test_structured_documents(doc: object) -> None:
    _check(yaml.safe_dump(doc))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text(text: str) -> None:
    _check(text)
