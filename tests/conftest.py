from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["pytester", "trio_agents.testing.plugin"]

# CI runs a fixed, seeded profile; `make fuzz` (or HYPOTHESIS_PROFILE=fuzz) runs more.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "dev",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "fuzz",
    max_examples=5000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from .helpers import EXAMPLES_RUN

    if EXAMPLES_RUN[0]:
        terminalreporter.write_line(
            f"lifecycle examples run: {EXAMPLES_RUN[0]}"
            f" (Hypothesis profile {os.environ.get('HYPOTHESIS_PROFILE', 'ci')!r})"
        )
