"""The spec's searched knobs as Optuna distributions (what a trial then runs: `sweeps.search.trials`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweeps.spec import CategoricalParam, FloatParam, IntParam, Param, SweepSpec

if TYPE_CHECKING:  # imported where used: a trial's actor needs no Optuna
    import optuna.distributions as od


def to_distribution(param: Param) -> od.BaseDistribution:
    import optuna.distributions as od

    if isinstance(param, FloatParam):
        return od.FloatDistribution(param.low, param.high, log=param.log, step=param.step)
    if isinstance(param, IntParam):
        return od.IntDistribution(param.low, param.high, log=param.log, step=param.step)
    if isinstance(param, CategoricalParam):
        return od.CategoricalDistribution(param.choices)
    raise TypeError(f"fixed values are not searched: {param!r}")


def optuna_space(spec: SweepSpec) -> dict[str, od.BaseDistribution]:
    return {name: to_distribution(p) for name, p in spec.space.searched().items()}
