"""The search: from the spec to what each trial runs. Optuna's distributions (`space`), the searcher over
Optuna's ask/tell (`searcher`), what it hands out beyond the sampler's proposals (`plan`: no repeats, the
worker count in runs), and each trial's resolved config (`space.resolve_trial`).

Imports `sweeps.spec` only (and the loop's contract)."""
