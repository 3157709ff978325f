"""The sweep service: spec, search space, runner, MLflow tracking, reports, CLI.

Never imports model code; talks to the loop through `trainables.contract`.
"""

from sweeps.spec import SpecError, SweepSpec, load_spec, parse_spec

__all__ = ["SpecError", "SweepSpec", "load_spec", "parse_spec"]
