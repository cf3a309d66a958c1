"""Benchmarks for trio_agents: ``make bench`` (``python -m benchmarks``).

Timing claims live here, never in test asserts. Each figure is reported beside a
baseline measured in the same process (a bare Trio memory-channel hop), because
absolute times on shared machines drift.
"""
