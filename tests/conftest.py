from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["pytester", "trio_agents.testing.plugin"]

# CI runs a fixed, seeded profile; `make fuzz` (or HYPOTHESIS_PROFILE=fuzz) runs more
# (FUZZ_EXAMPLES, default 3000, scales it: the lifecycle and fault properties run about
# 7.7 times that, over 23,000 examples, 10,500 of them with faults).
# Every profile sets, on purpose, what must not depend on machine speed: no deadline
# (an example is a whole trio.run, with real worker threads) and no too_slow check.
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
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "3000")),
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
