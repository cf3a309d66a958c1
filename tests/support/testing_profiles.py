"""How many examples a property test of the harness runs, by Hypothesis profile.

The seeded profiles ("ci", "dev") keep hypothesis's default of 100 examples; "fuzz"
(``make fuzz``) sets FUZZ_EXAMPLES (tests/conftest.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import settings

F = TypeVar("F", bound=Callable[..., Any])

FUZZ = os.environ.get("HYPOTHESIS_PROFILE", "ci") == "fuzz"


def profile_settings(*, ci: float, fuzz: float) -> Callable[[F], F]:
    """``max_examples`` as a multiple of the active profile's: ``ci`` times it in the
    seeded profiles (seconds), ``fuzz`` times it under ``make fuzz``; at least 5."""
    weight = fuzz if FUZZ else ci
    return settings(max_examples=max(5, int(settings().max_examples * weight)))
