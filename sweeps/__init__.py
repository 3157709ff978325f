"""The sweep service: the spec, the search, the running sweep, its results, and the commands around them.

One package per concern, imported one way: `spec` (the typed spec), `search` (from the spec to what each
trial runs, the searcher over Optuna), `service` (the running sweep), `results` (what is computed after the
trials end) and `ops` (doctor, cluster checks, the generated reference docs). At the root: the command line
(`cli`), its exit codes and errors (`exits`), the MLflow store (`store`) and tracking (`tracking`).

Never imports model code; talks to the loop through its torch-free modules (`trainables.contract`,
`trainables.knobs`).
"""

from sweeps.spec import SpecError, SweepSpec, load_spec, parse_spec

__all__ = ["SpecError", "SweepSpec", "load_spec", "parse_spec"]
