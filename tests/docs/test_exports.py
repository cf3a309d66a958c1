"""The public API: every exported name importable and documented."""

from __future__ import annotations

import inspect

import pytest

import trio_agents
import trio_agents.cluster
import trio_agents.control
import trio_agents.mcp
import trio_agents.models
import trio_agents.sessions
import trio_agents.temporal
import trio_agents.testing
import trio_agents.testing.plugin
import trio_agents.tracing

MODULES = [
    trio_agents,
    trio_agents.models,
    trio_agents.sessions,
    trio_agents.control,
    trio_agents.cluster,
    trio_agents.temporal,
    trio_agents.mcp,
    trio_agents.testing,
    trio_agents.testing.plugin,
    trio_agents.tracing,
]


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_all_names_exist_and_are_documented(module: object) -> None:
    names = module.__all__  # type: ignore[attr-defined]
    assert names == sorted(names, key=_isort_key)
    for name in names:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"{module.__name__}.{name} has no docstring"  # type: ignore[attr-defined]


def test_exception_tree() -> None:
    for name in (
        "RunClosedError",
        "RunFailedError",
        "InboxFullError",
        "SessionBusyError",
        "UnknownCallError",
        "ModelError",
    ):
        assert issubclass(getattr(trio_agents, name), trio_agents.TrioAgentsError)
    assert issubclass(trio_agents.UnknownCallError, LookupError)
    assert issubclass(trio_agents.control.ControlError, trio_agents.TrioAgentsError)
    assert issubclass(trio_agents.control.ControlConnectionError, trio_agents.control.ControlError)


def test_status_is_a_str_enum() -> None:
    status: str = trio_agents.RunStatus.CANCELLED
    assert status == "cancelled"
    assert str(trio_agents.RunStatus.COMPLETED) == "completed"
    assert trio_agents.RunStatus.FAILED.is_terminal
    assert not trio_agents.RunStatus.RUNNING.is_terminal


def test_public_modules_are_typed() -> None:
    import importlib.resources

    assert importlib.resources.files("trio_agents").joinpath("py.typed").is_file()
