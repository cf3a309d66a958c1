"""The public API: every exported name importable and documented."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import trio_agents
import trio_agents.cluster
import trio_agents.control
import trio_agents.evals
import trio_agents.faces
import trio_agents.hosting
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
    trio_agents.hosting,
    trio_agents.control,
    trio_agents.faces,
    trio_agents.cluster,
    trio_agents.temporal,
    trio_agents.mcp,
    trio_agents.evals,
    trio_agents.testing,
    trio_agents.testing.plugin,
    trio_agents.tracing,
]


def test_every_public_module_is_in_the_api_reference() -> None:
    """docs/api.md documents every module whose names this file pins (the pytest plugin
    is the testing kit's, documented with it)."""
    api = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    documented = set(re.findall(r"^\.\. automodule:: ([\w.]+)$", api, re.M))
    pinned = {m.__name__ for m in MODULES} - {"trio_agents.testing.plugin"}
    assert pinned - documented == set()


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


def test_what_every_face_shares_is_hostings_and_control_re_exports_it() -> None:
    shared = (
        "ERROR_CODES",
        "Auth",
        "ContextHook",
        "Limits",
        "PrincipalStatistics",
        "RunInfo",
        "RunStartInfo",
        "SessionFactory",
        "sqlite_sessions",
    )
    for name in shared:
        assert name in trio_agents.hosting.__all__
        # the old import path still works, and is the same object
        assert getattr(trio_agents.control, name) is getattr(trio_agents.hosting, name)
