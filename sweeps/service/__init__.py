"""The running sweep: `runner.run_sweep` and what it drives -- the Ray connection and signals (`connect`),
the sweep's lock and saved state (`state`), the cluster's resources (`resources`), the sweep's controller
(`controller`) with its Ray and Tune (`tuning`) and Tune's callback (`callback`), the trial driver (`trial`), the warm pool (`pool`), the memory probe (`probe`), failures and
the breaker (`failures`, `breaker`), and the progress lines (`progress`).

Imports the spec, the search and the results."""
