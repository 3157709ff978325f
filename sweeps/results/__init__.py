"""What a sweep computed, read after its trials end: ranking, quality, effects, verdicts, money, reports.

The rows and their ranking (`outcome`), quality and scaling across trials (`quality`), each knob's measured
effect (`effects`), bottleneck verdicts (`verdict`, its rules table in `verdict_rules`), whether a trial
shared its node (`contention`), speed of light (`sol`), the figures in money (`money`), the answer and
tables (`report`) and the figures (`plots`).

Imports `sweeps.spec` and `sweeps.tracking` (reading a sweep back), never the service."""
