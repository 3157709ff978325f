"""The parameter vocabulary (Optuna's), or a plain value, held fixed.

`{type: float|int|categorical, low, high, log, step, choices}`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)
Scalar = bool | int | float | str


class FloatParam(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = None

    @model_validator(mode="after")
    def _range(self) -> FloatParam:
        if not self.low <= self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError("log=true needs low > 0")
        if self.log and self.step is not None:
            raise ValueError("log and step cannot be combined (Optuna)")
        return self


class IntParam(BaseModel):
    model_config = STRICT
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = 1

    @model_validator(mode="after")
    def _range(self) -> IntParam:
        if not self.low <= self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError("log=true needs low >= 1 and step 1 (Optuna)")
        return self


class CategoricalParam(BaseModel):
    model_config = STRICT
    type: Literal["categorical"]
    choices: list[Scalar] = Field(min_length=1)


class FixedParam(BaseModel):
    """A plain value in the spec (`pin_memory: false`): held constant, still logged."""

    model_config = STRICT
    type: Literal["fixed"]
    value: Scalar


Param = Annotated[FloatParam | IntParam | CategoricalParam | FixedParam, Field(discriminator="type")]


def wrap_fixed(value: Any) -> Any:
    return value if isinstance(value, dict) else {"type": "fixed", "value": value}


def param_values(p: Any) -> list[Any]:
    """The values a param can take at its ends (a range's low and high), or all of them."""
    if isinstance(p, (FloatParam, IntParam)):
        return [p.low, p.high]
    if isinstance(p, CategoricalParam):
        return list(p.choices)
    return [p.value]
