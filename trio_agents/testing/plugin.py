"""A pytest plugin with lifecycle fixtures: ``pytest -p trio_agents.testing.plugin``.

(or ``pytest_plugins = ["trio_agents.testing.plugin"]`` in a ``conftest.py``.)

Fixtures:

- ``scripted_model``: a factory, ``scripted_model(turns, default="the end")`` → a fresh
  :class:`~trio_agents.testing.ScriptedModel`.
- ``lifecycle_check``: ``lifecycle_check(agent_factory, **options)`` runs the
  :class:`~trio_agents.testing.LifecycleProperty` of the agent with the current
  Hypothesis profile (without a deadline or the ``too_slow`` health check), failing
  the test with the shrunk example and the broken invariant. Use it from a sync test
  (each example calls ``trio.run``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from ..models._scripted import ScriptedModel, Turn
from ._property import AgentFactory, LifecycleProperty

__all__ = ["lifecycle_check", "scripted_model"]


@pytest.fixture
def scripted_model() -> Callable[..., ScriptedModel]:
    """A factory of :class:`ScriptedModel`: ``scripted_model(turns, default=...)``."""

    def make(
        turns: Sequence[Turn | str] = (), *, default: Turn | str | None = "the end"
    ) -> ScriptedModel:
        return ScriptedModel(list(turns), default=default)

    return make


@pytest.fixture
def lifecycle_check() -> Callable[..., None]:
    """``lifecycle_check(agent_factory, **options)``: fuzz the agent's lifecycle.

    ``options`` are the fields of :class:`LifecycleProperty` (``tools``,
    ``script_strategy``, ``schedule_strategy``, ``faults``, ``recorder``,
    ``run_options``, ``max_cancel_latency``, ``session``, ``thread_hold``,
    ``thread_grace``) plus ``settings`` (a ``hypothesis.settings``; the current
    profile by default, always without a deadline or the ``too_slow`` health check).
    """

    def check(agent_factory: AgentFactory, *, settings: Any = None, **options: Any) -> None:
        LifecycleProperty(agent_factory, **options).run(settings)

    return check
