"""What a sweep computed, read after its trials end: the rows and their ranking (`outcome`), quality and
scaling across trials (`quality`), each knob's measured effect (`effects`), bottleneck verdicts
(`verdict`), speed of light (`sol`), the answer and tables (`report`) and the figures (`plots`).

Imports `sweeps.spec` and `sweeps.tracking` (reading a sweep back), never the service."""
