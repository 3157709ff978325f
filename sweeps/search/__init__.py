"""The search: from the spec to what each trial runs.

Optuna's distributions (`distributions`), the searcher over Optuna's ask/tell (`searcher`), what it hands
out beyond the sampler's proposals (`plan`: no repeats, the worker count in runs), the live search state
and its memory bounds (`live_state`), and each trial's length, resources and resolved config
(`trials.resolve_trial`).

Imports `sweeps.spec` only (and the loop's contract and knobs)."""
