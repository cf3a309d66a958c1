"""One exception tree: every exception the package raises to users is a
:class:`~trio_agents.TrioAgentsError`, drawn in ``_exceptions.py``'s docstring,
exported from a public module and documented in docs/api.md.

The raise sites are found by reading the source with :mod:`ast` (every ``raise X``,
``X(...)`` and ``raise make_error(...)`` whose function is annotated to return an
exception class of the package), so a new exception class cannot slip past by being
raised somewhere no test reaches. Exceptions that are raised but never reach users (caught
and turned into something else inside the package) are on :data:`INTERNAL`, each with
the reason; the testing kit's few deliberate outsiders are on :data:`OUTSIDE_BY_DESIGN`.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import trio
import trio.testing

import trio_agents as ta
from trio_agents import TrioAgentsError
from trio_agents.models import ScriptedModel
from trio_agents.sessions import MemorySession

PACKAGE = Path(ta.__file__).parent
ROOT = PACKAGE.parent

# Raised inside the package and always caught there, turned into what users see. Keyed
# by class name (not module), so moving a class to another module keeps its entry.
INTERNAL: dict[str, str] = {
    # The run core's wrappers carry a user's own exception to the run's terminal
    # reason; the run ends failed with the wrapped ``.error`` as ``result.error``
    # (``_turns.failure``, ``_guardrails.stop_run``), never with the wrapper.
    "SessionError": "wraps the session's exception; result.error is the wrapped one",
    "HookError": "wraps a hook's exception; result.error is the wrapped one",
    "ToolFailure": "wraps a tool's exception (on_tool_error='fail'); result.error is it",
    "GuardrailFault": "wraps a guardrail's exception; result.error is the wrapped one",
    "HistoryError": "a history policy's bad result; re-raised as InvalidConversationError",
    # The tool-schema converter's own signal; Tool.convert_arguments re-raises it as
    # ToolArgumentsError.
    "ArgumentConversionError": "re-raised as ToolArgumentsError by Tool.convert_arguments",
    "Unsupported": "the schema compiler's signal, re-raised as a TypeError naming the tool",
    # The control server turns it into an ``error`` frame; the client raises ControlError.
    "ProtocolError": "becomes an error frame on the wire; the client raises ControlError",
    # The command line prints it as one line and exits non-zero (``_cli.main``).
    "CLIError": "printed by the trio-agents command as one line; never leaves main()",
    # The HTTP faces turn these into their wire's error answers (an HTTP status and JSON
    # body, a JSON-RPC error, an AG-UI 400): a client sees the answer, never the class.
    "HttpError": "answered as an HTTP status and JSON error body by the HTTP faces",
    "RpcError": "answered as a JSON-RPC error by the A2A face",
    "AguiInputError": "answered as a 400 naming the field by the AG-UI face",
    # The Temporal worker turns it into a non-retryable ApplicationError: the workflow
    # fails at once, and its caller sees Temporal's failure, never the class.
    "AttemptError": "raised as a non-retryable ApplicationError by the Temporal worker",
    # Likewise: a stale attempt's end, which Temporal no longer takes as the run's.
    "AttemptFenced": "raised as a non-retryable ApplicationError by the Temporal worker",
}

# Raised to users on purpose and outside the tree on purpose (the testing kit).
OUTSIDE_BY_DESIGN: dict[str, str] = {
    # A broken invariant is a failed test: an AssertionError, reported by pytest as one.
    "LifecycleViolation": "an AssertionError, so a broken invariant fails the test",
    # The kit's faults stand for errors from outside the library (a provider, a user's
    # tool, an object whose __str__ raises): the run must treat them as foreign ones.
    "InjectedFault": "stands for a foreign error (a provider's, a session's, a hook's)",
    "FakeToolError": "stands for a user's tool raising",
    "BrokenStrError": "stands for a foreign error whose __str__ raises",
}

PUBLIC_MODULES = (
    "trio_agents",
    "trio_agents.models",
    "trio_agents.sessions",
    "trio_agents.control",
    "trio_agents.cluster",
    "trio_agents.hosting",
    "trio_agents.mcp",
    "trio_agents.temporal",
    "trio_agents.testing",
    "trio_agents.tracing",
)

_TREE_LINE = re.compile(r"^(?P<indent>(?:│   |    )*)(?:├── |└── )(?P<name>\w+)(?P<note>.*)$")


def _module_names() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__main__":
            continue  # running it is the command line
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


MODULES: list[tuple[ModuleType, ast.Module]] = [
    (importlib.import_module(name), ast.parse(path.read_text(encoding="utf-8"), str(path)))
    for name, path in _module_names()
]


def _package_exceptions() -> dict[str, list[type[BaseException]]]:
    """Every exception class defined at the top level of a package module, by name."""
    found: dict[str, list[type[BaseException]]] = {}
    for module, tree in MODULES:
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                cls = getattr(module, node.name, None)
                if inspect.isclass(cls) and issubclass(cls, BaseException):
                    found.setdefault(node.name, []).append(cls)
    return found


EXCEPTIONS = _package_exceptions()


def _resolve(module: ModuleType, expr: ast.expr) -> object:
    """The object a ``Name`` or dotted ``Attribute`` denotes in ``module``'s namespace."""
    if isinstance(expr, ast.Name):
        return getattr(module, expr.id, None)
    if isinstance(expr, ast.Attribute):
        owner = _resolve(module, expr.value)
        return None if owner is None else getattr(owner, expr.attr, None)
    return None


def _made_classes(module: ModuleType, node: ast.Raise | ast.Call) -> list[type[BaseException]]:
    """The package's exception classes a ``raise`` statement raises or a call makes
    (none for a re-raise of a caught object, or a class from outside the package).

    Calls count as well as raises: an error made in one place and raised (or handed
    to ``result.error``) in another reaches users just the same."""
    if isinstance(node, ast.Raise):
        expr = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    else:
        expr = node.func
    if expr is None:
        return []
    obj = _resolve(module, expr)
    if obj is None and isinstance(expr, ast.Name):
        # Imported inside the function (a lazy import): go by name.
        return list(EXCEPTIONS.get(expr.id, []))
    if isinstance(node, ast.Raise) and inspect.isfunction(obj):
        # ``raise make_error(...)``: what the function is annotated to return.
        returns = obj.__annotations__.get("return")
        name = returns if isinstance(returns, str) else getattr(returns, "__name__", "")
        return list(EXCEPTIONS.get(name, []))
    if (
        inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__.split(".")[0] == "trio_agents"
    ):
        return [obj]
    return []


def test_every_exception_raised_to_users_is_in_the_tree() -> None:
    outside: set[str] = set()
    made: set[str] = set()
    for module, tree in MODULES:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise | ast.Call):
                continue
            for cls in _made_classes(module, node):
                made.add(cls.__name__)
                if issubclass(cls, TrioAgentsError):
                    continue
                if cls.__name__ in INTERNAL or cls.__name__ in OUTSIDE_BY_DESIGN:
                    continue
                outside.add(f"{module.__name__}:{node.lineno} makes {cls.__qualname__}")
    assert not outside, "raised to users but not TrioAgentsErrors:\n" + "\n".join(sorted(outside))
    # The lists stay honest: every entry names a class the package makes, outside the tree.
    for name in [*INTERNAL, *OUTSIDE_BY_DESIGN]:
        assert name in made, f"{name} is listed but never raised"
        assert not any(issubclass(cls, TrioAgentsError) for cls in EXCEPTIONS[name]), name


def _drawn_tree() -> dict[str, tuple[str, str]]:
    """The tree in ``_exceptions.py``'s docstring: class name -> (drawn parent, note)."""
    doc = importlib.import_module("trio_agents._exceptions").__doc__
    assert doc is not None
    lines = doc.splitlines()
    root = next(i for i, line in enumerate(lines) if line.strip() == "TrioAgentsError")
    drawn: dict[str, tuple[str, str]] = {}
    parents = ["TrioAgentsError"]
    for line in lines[root + 1 :]:
        body = line[4:]  # the tree is indented by four spaces in the docstring
        match = _TREE_LINE.match(body)
        if match is None:
            break
        depth = len(match["indent"]) // 4
        del parents[depth + 1 :]
        assert match["name"] not in drawn, f"{match['name']} is drawn twice"
        drawn[match["name"]] = (parents[depth], match["note"])
        parents.append(match["name"])
    return drawn


def _tree_classes() -> list[type[TrioAgentsError]]:
    return [
        cls
        for classes in EXCEPTIONS.values()
        for cls in classes
        if issubclass(cls, TrioAgentsError) and cls is not TrioAgentsError
    ]


def test_every_trio_agents_error_is_drawn_where_it_is() -> None:
    drawn = _drawn_tree()
    classes = _tree_classes()
    names = [cls.__name__ for cls in classes]
    assert len(names) == len(set(names)), "two TrioAgentsErrors share a name"
    missing = sorted(set(names) - set(drawn))
    stale = sorted(set(drawn) - set(names))
    assert not missing, f"TrioAgentsErrors not drawn in _exceptions.py's docstring: {missing}"
    assert not stale, f"drawn in _exceptions.py's docstring, but no such class: {stale}"
    for cls in classes:
        parent, note = drawn[cls.__name__]
        in_tree = [base for base in cls.__bases__ if issubclass(base, TrioAgentsError)]
        assert [base.__name__ for base in in_tree] == [parent], (cls, parent)
        # A builtin base users may catch instead is said on the drawn line.
        for base in cls.__bases__:
            if base not in in_tree and base is not Exception:
                assert f"also a {base.__name__}" in note, (cls, base)


def test_every_trio_agents_error_is_public_and_documented() -> None:
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    modules = [importlib.import_module(name) for name in PUBLIC_MODULES]
    for cls in _tree_classes():
        exported = [
            module.__name__
            for module in modules
            if getattr(module, cls.__name__, None) is cls
            and cls.__name__ in getattr(module, "__all__", ())
        ]
        assert exported, f"{cls.__name__} is exported from no public module"
        assert any(f".. automodule:: {name}\n" in api for name in exported), (
            f"{cls.__name__} (exported from {exported}) is not documented in docs/api.md"
        )
        assert inspect.getdoc(cls), cls


async def test_an_invalid_conversation_fails_the_run_with_a_public_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # An input reusing a call id the stored conversation already holds: the run refuses
    # to send (or store) it, before any model call.
    session = MemorySession()
    call = ta.ToolCall("c1", "t", "{}")
    await session.add_items([ta.UserMessage("a"), call, ta.ToolResult("c1", "x")])
    model = ScriptedModel(["never sent"])
    agent = ta.Agent(name="a", model=model)
    result = await ta.run(agent, [call, ta.ToolResult("c1", "again")], session=session)
    assert result.status == "failed"
    assert result.reason is not None
    assert result.reason.startswith("invalid conversation: the input does not fit")
    assert isinstance(result.error, ta.InvalidConversationError)
    assert isinstance(result.error, ta.TrioAgentsError)
    assert model.calls == 0
