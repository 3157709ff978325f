"""The `space` section: the loop's knobs and the trainable's own params (`params.<name>`), each fixed or searched.

The knobs, their types, defaults, rules and help come from their one declaration,
`trainables.knobs.LoopKnobs`; a field here says only that the spec may name the knob."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)

from sweeps.spec.params import (
    CategoricalParam,
    FixedParam,
    FloatParam,
    IntParam,
    Param,
    Scalar,
    param_values,
    wrap_fixed,
)
from trainables.knobs import KNOBS

if TYPE_CHECKING:
    from sweeps.spec.sweep import SweepSpec

PARAMS_PREFIX = "params."  # space.params.<name>: the trainable's own hyperparameters
# Knobs added after sweeps were saved: absent from a spec's dump where it does not set them, so an earlier
# sweep's spec digest (`sweeps.service.saved_state.spec_digest`) still matches when it resumes
LATER_KNOBS = ("strategy", "activation_checkpointing", "cpu_offload")
OPTIM_KNOBS = tuple(sorted(k for k, (_, _, d) in KNOBS.items() if d.group == "optim"))


def _knob(name: str) -> Any:
    """The field of knob `name`: its declared default held fixed where a spec that does not name it holds it
    (`Knob.implicit`), else absent (None); its help as the field's description."""
    _, default, declared = KNOBS[name]
    held = FixedParam(type="fixed", value=default) if declared.implicit else None
    return Field(default=held, description=declared.help)


class _Space(BaseModel):
    """The loop's knobs and the trainable's own params (`params.<name>`), each fixed or searched: one field
    per knob of `LoopKnobs` (`SpaceSpec` below adds them from the declaration; `param(name)` reads one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    num_workers: Param | None = Field(default=None, description=f"{KNOBS['num_workers'][2].help}; default: "
                                      "scaling.num_workers")
    if TYPE_CHECKING:  # fields of SpaceSpec, made from the declaration (`_fields`); named here for the checker
        accelerator_type: Param | None = None
        params: dict[str, Param] = {}

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        out = handler(self)
        return {k: v for k, v in out.items() if not (k in LATER_KNOBS and v is None)} if isinstance(out, dict) else out

    def param(self, knob: str) -> Param | None:
        """The spec's param for loop knob `knob` (its declared default, held fixed, where the spec did not name
        it and the knob is `implicit`; None where it is not)."""
        return getattr(self, knob)  # type: ignore[no-any-return]

    def held(self, knob: str) -> Param:
        """`param(knob)` for a knob every space holds (`Knob.implicit`: its default where the spec is silent)."""
        p = self.param(knob)
        assert p is not None, f"{knob} is not held by every space"
        return p

    @model_validator(mode="before")
    @classmethod
    def _fixed_scalars(cls, data: Any) -> Any:
        """Plain values are fixed params; `params.<name>: ...` keys go under `params`."""
        if not isinstance(data, dict):
            return data
        out: dict[str, Any] = {k: v if k == "params" else wrap_fixed(v) for k, v in data.items()
                               if not str(k).startswith(PARAMS_PREFIX)}
        own = data.get("params", {})
        if not isinstance(own, dict):
            return out
        own = dict(own)
        for key, value in data.items():
            if str(key).startswith(PARAMS_PREFIX):
                name = str(key)[len(PARAMS_PREFIX):]
                if name in own:
                    raise ValueError(f"params.{name} is given twice (as params.{name} and under params:); keep one")
                own[name] = value
        if own:
            out["params"] = {k: wrap_fixed(v) for k, v in own.items()}
        return out

    @field_validator(*KNOBS, check_fields=False)
    @classmethod
    def _knob_values(cls, p: Any, info: ValidationInfo) -> Any:
        knob = str(info.field_name)
        kind, _, declared = KNOBS[knob]
        rule = declared.rule(kind)
        if p is None:
            return p
        if isinstance(p, (FloatParam, IntParam)) and kind not in (int, float):
            raise ValueError(f"a {p.type} range is not allowed here; values must be {rule}")
        if isinstance(p, FloatParam) and kind is int:
            raise ValueError(f"type float is not allowed; values must be {rule} (use type: int)")
        bad = [v for v in param_values(p) if not declared.allows(kind, v)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not allowed; values must be {rule}")
        return p

    def _all(self) -> dict[str, Param]:
        """Every knob the spec sets (built-in or its own, `params.<name>`), fixed or searched."""
        knobs = {k: p for k in KNOBS if (p := self.param(k)) is not None}
        return knobs | {PARAMS_PREFIX + k: v for k, v in self.params.items()}

    def searched(self) -> dict[str, Param]:
        return {k: p for k, p in self._all().items() if not isinstance(p, FixedParam)}

    def fixed(self) -> dict[str, Scalar]:
        return {k: p.value for k, p in self._all().items() if isinstance(p, FixedParam)}

    def grid_values(self) -> dict[str, list[Scalar]]:
        """Each searched knob's values for grid search, smallest batch first."""
        values: dict[str, list[Scalar]] = {}
        for k, p in self.searched().items():
            if isinstance(p, CategoricalParam):
                values[k] = sorted(p.choices) if k == "batch_size" else list(p.choices)  # type: ignore[type-var]
            elif isinstance(p, IntParam) and not p.log:
                values[k] = list(range(p.low, p.high + 1, p.step))
            elif isinstance(p, FloatParam) and p.step is not None:
                n = int(round((p.high - p.low) / p.step))
                values[k] = [round(p.low + i * p.step, 12) for i in range(n + 1)]
            else:
                raise ValueError(f"search.algorithm: grid needs a finite set of values, but space.{k} is a "
                                 "continuous or log range; give it choices (type: categorical) or a step")
        return values

    def grid_points(self) -> list[dict[str, Scalar]]:
        """Every combination once; batch size varies fastest (ascending), so an out-of-memory
        batch is met before the larger ones it rules out (the classic precision x batch table);
        the accelerator type and the worker count slowest, so a warm group serves all trials of its type and
        size before it is replaced."""
        values = self.grid_values()
        rank = {k: i for i, k in enumerate(self._all())}
        order = sorted(values, key=lambda k: (k not in GROUP_KEYS, GROUP_KEYS.index(k) if k in GROUP_KEYS else 0,
                                              k == "batch_size", rank[k]))
        return [dict(zip(order, combo, strict=True)) for combo in itertools.product(*(values[k] for k in order))]


GROUP_KEYS = ("accelerator_type", "num_workers")  # what a warm group is made for: they vary slowest


def _fields() -> dict[str, Any]:
    """The knobs' fields, in their declared order, then the trainable's own params (the order a spec's
    validated form keeps: `sweeps.service.saved_state.spec_digest` hashes it)."""
    fields: dict[str, Any] = {}
    for name, (_, _, declared) in KNOBS.items():
        if name != "num_workers":
            fields[name] = (Param if declared.implicit else Param | None, _knob(name))
    fields["params"] = (dict[str, Param], Field(default_factory=dict, description="the trainable's own params, each "
                        "fixed or searched (also written `params.<name>: ...` at this level)"))
    return fields


if TYPE_CHECKING:
    SpaceSpec = _Space
else:
    SpaceSpec = create_model("SpaceSpec", __base__=_Space, __doc__=_Space.__doc__, **_fields())


def worker_counts(spec: SweepSpec) -> list[int]:
    """Every number of ranks a trial of the space can run on, ascending.

    They come from `space.num_workers`, else `scaling.num_workers` alone."""
    p = spec.space.num_workers
    if p is None:
        return [spec.scaling.num_workers]
    if isinstance(p, IntParam):
        return list(range(p.low, p.high + 1, p.step))
    return sorted({int(v) for v in param_values(p)})
