"""Registered workloads; see `trainables.registry`."""
