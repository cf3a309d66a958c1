"""Tools: function_tool, argument handling, invoke, ToolContext (DESIGN.md §7).

This module uses ``from __future__ import annotations`` on purpose: tool functions
defined here have string annotations, which must resolve (also for local types).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import inspect
import json
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypedDict, cast

import attrs
import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.tools_processes import live_members, wait_until_group_dead
from trio_agents import Tool, ToolArgumentsError, ToolContext, function_tool
from trio_agents._tools import mark_cancelled


class Unit(enum.Enum):
    CELSIUS = "C"
    FAHRENHEIT = "F"


@attrs.frozen
class Reading:
    value: float
    unit: Unit = Unit.CELSIUS


@dataclasses.dataclass
class Pair:
    left: int
    right: int


def make_ctx(**kw: Any) -> ToolContext:
    return ToolContext(run_id="run-1", call_id="call-1", tool_name="t", **kw)


@function_tool
async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number.
        b: the second number.
    """
    return a + b


@function_tool(name="convert_reading", timeout=5, needs_approval=True)
def convert(reading: Reading, to: Unit = Unit.FAHRENHEIT) -> Reading:
    """Convert a temperature reading.

    :param reading: what was measured.
    :param to: the unit wanted.
    """
    if reading.unit is to:
        return reading
    if to is Unit.FAHRENHEIT:
        return Reading(reading.value * 9 / 5 + 32, to)
    return Reading((reading.value - 32) * 5 / 9, to)


# -------------------------------------------------------------------- decoration


def test_bare_decorator() -> None:
    assert isinstance(add, Tool)
    assert isinstance(add, ta.Tool)
    assert add.name == "add"
    assert add.description == "Add two integers."
    assert add.parameters == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "the first number."},
            "b": {"type": "integer", "description": "the second number."},
        },
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    assert add.timeout is None
    assert add.needs_approval is False
    assert not add.takes_context
    assert add.spec() == ta.ToolSpec("add", "Add two integers.", add.parameters)


def test_decorator_with_options() -> None:
    assert convert.name == "convert_reading"
    assert convert.timeout == 5
    assert convert.needs_approval is True
    assert convert.description == "Convert a temperature reading."
    reading = {
        "type": "object",
        "properties": {
            "value": {"type": "number"},
            "unit": {"type": "string", "enum": ["C", "F"], "default": "C"},
        },
        "required": ["value"],
        "additionalProperties": False,
        "description": "what was measured.",
    }
    assert convert.parameters == {
        "type": "object",
        "properties": {
            "reading": reading,
            "to": {
                "type": "string",
                "enum": ["C", "F"],
                "description": "the unit wanted.",
                "default": "F",
            },
        },
        "required": ["reading"],
        "additionalProperties": False,
    }


def test_other_options_and_call_forms() -> None:
    def decide(arguments: Mapping[str, Any]) -> bool:
        return bool(arguments.get("force"))

    def risky(force: bool = False) -> str:
        """Do something risky."""
        return "done"

    tool = function_tool(risky, description="Overridden.", needs_approval=decide)
    assert tool.description == "Overridden."
    assert tool.needs_approval is decide
    assert tool.name == "risky"
    no_doc = function_tool(lambda: None, name="nothing")
    assert no_doc.description == ""
    assert no_doc.parameters["properties"] == {}
    assert function_tool(timeout=0.5)(risky).timeout == 0.5


async def test_tool_is_still_callable_like_the_function() -> None:
    assert await add(2, 3) == 5
    assert convert(Reading(100.0)) == Reading(212.0, Unit.FAHRENHEIT)
    assert add.fn.__name__ == "add"
    assert list(inspect.signature(add).parameters) == ["a", "b"]


def test_spec_is_shared_and_read_only() -> None:
    # One spec per tool, shared by every run: no one can change it through a spec.
    spec = add.spec()
    assert add.spec() is spec
    parameters: Any = spec.parameters  # typed Mapping; the test tries to mutate it
    properties = parameters["properties"]
    changes: list[Callable[[], object]] = [
        lambda: properties["a"].__setitem__("type", "string"),
        lambda: properties.pop("a"),
        lambda: parameters["required"].append("c"),
        lambda: parameters.update(type="array"),
        lambda: add.parameters["properties"]["b"].clear(),
    ]
    for change in changes:
        with pytest.raises(TypeError, match="read-only"):
            change()
    assert add.parameters["properties"]["a"]["type"] == "integer"
    assert add.parameters["required"] == ["a", "b"]
    # A deep copy is plain and mutable; a shallow one is a plain top level.
    mine = copy.deepcopy(spec.parameters)
    mine["properties"]["a"]["type"] = "string"
    mine["required"].append("c")
    assert type(mine) is dict
    assert add.parameters["properties"]["a"]["type"] == "integer"
    assert json.loads(json.dumps(spec.parameters)) == spec.parameters


def test_a_schema_given_to_a_tool_is_copied_then_frozen() -> None:
    given = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}

    async def search(ctx: ToolContext, arguments: dict[str, Any]) -> str:
        return str(arguments["q"])

    tool = Tool.from_schema("search", "Search.", given, search)
    loaded: Any = pickle.loads(pickle.dumps(tool.parameters))
    given_properties: Any = given["properties"]
    given_properties["q"]["type"] = "integer"  # the caller's dict stays theirs
    assert tool.parameters["properties"]["q"]["type"] == "string"
    assert loaded == tool.parameters
    with pytest.raises(TypeError, match="read-only"):
        loaded["required"].append("x")


def test_tools_are_immutable_but_evolvable() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        add.timeout = 3  # type: ignore[misc]
    slow = attrs.evolve(add, timeout=3)
    assert slow.timeout == 3
    assert slow.name == "add"
    assert add.timeout is None


async def _agen() -> Any:
    yield 1


def _gen() -> Any:
    yield 1


def _args(*numbers: int) -> int:
    return sum(numbers)


def _kwargs(**options: int) -> int:
    return len(options)


def _positional(a: int, /) -> int:
    return a


def _untranslatable(when: threading.Event) -> None:
    pass


def _fine(a: int) -> int:
    return a


@pytest.mark.parametrize(
    ("fn", "options", "message"),
    [
        (3, {}, "needs a function, not int"),
        ("add", {}, "needs a function, not str"),
        (Pair, {}, "not a class"),
        (add, {}, "already a Tool"),
        (_gen, {}, "generator function"),
        (_agen, {}, "generator function"),
        (_args, {}, r"parameter 'numbers' of _args: tools cannot take \*numbers"),
        (_kwargs, {}, r"tools cannot take \*\*options"),
        (_positional, {}, "positional-only"),
        (_untranslatable, {}, r"parameter 'when' of _untranslatable has an unsupported type"),
        (_fine, {"timeout": 0}, "timeout must be > 0"),
        (_fine, {"timeout": -1.5}, "timeout must be > 0"),
        (_fine, {"timeout": float("nan")}, "timeout must be > 0"),
        (_fine, {"timeout": "5"}, "timeout must be a number"),
        (_fine, {"timeout": True}, "timeout must be a number"),
        (_fine, {"name": "has space"}, "invalid tool name"),
        (_fine, {"name": ""}, "invalid tool name"),
        (_fine, {"name": 3}, "name must be a str"),
        (_fine, {"description": 3}, "description must be a str"),
        (_fine, {"needs_approval": "yes"}, "needs_approval must be a bool or a callable"),
        (lambda: None, {}, "invalid tool name '<lambda>'"),
    ],
)
def test_bad_decorations_raise_type_error(fn: Any, options: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        function_tool(fn, **options)
    if callable(fn) and not isinstance(fn, Tool | type):
        with pytest.raises(TypeError, match=message):
            function_tool(**options)(fn)


def test_context_parameter_detection() -> None:
    def by_name(ctx, query: str) -> str:  # type: ignore[no-untyped-def]
        return str(query)

    def by_type(context: ToolContext, query: str) -> str:
        return query

    def positional_ctx(ctx: ToolContext, /, query: str) -> str:
        return query

    def misplaced(query: str, context: ToolContext) -> str:
        return query

    expected = {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
        "additionalProperties": False,
    }
    for fn in (by_name, by_type, positional_ctx):
        tool = function_tool(fn)
        assert tool.takes_context
        assert tool.parameters == expected
    with pytest.raises(TypeError, match="the context must be the first parameter"):
        function_tool(misplaced)


def test_local_types_in_string_annotations_resolve() -> None:
    class Query(TypedDict):
        text: str
        limit: int

    @function_tool
    def search(query: Query) -> str:
        return query["text"]

    @function_tool(name="search2")
    def search2(query: Annotated[Query, "what to find"]) -> str:
        return query["text"]

    for tool in (search, search2):
        assert tool.parameters["properties"]["query"]["required"] == ["text", "limit"]
    assert search2.parameters["properties"]["query"]["description"] == "what to find"


def test_callable_objects_and_methods() -> None:
    class Counter:
        def __init__(self) -> None:
            self.total = 0

        def bump(self, by: int = 1) -> int:
            """Bump the counter."""
            self.total += by
            return self.total

        async def __call__(self, by: int) -> int:
            return by

    counter = Counter()
    bump = function_tool(counter.bump)
    assert bump.name == "bump"
    assert bump.description == "Bump the counter."
    assert bump.parameters["properties"] == {"by": {"type": "integer", "default": 1}}
    assert bump(by=2) == 2
    called = function_tool(counter, name="counter")
    assert called.parameters["required"] == ["by"]


# --------------------------------------------------------------------- arguments


def test_parse_arguments() -> None:
    assert add.parse_arguments('{"a": 1, "b": 2}') == {"a": 1, "b": 2}
    assert convert.parse_arguments('{"reading": {"value": 3}}') == {"reading": {"value": 3}}


@pytest.mark.parametrize(
    ("arguments", "errors"),
    [
        ('{"a": 1, "b": "2"}', ["$.b: expected integer, got string"]),
        ('{"a": true, "b": 2}', ["$.a: expected integer, got boolean"]),
        ('{"a": 1}', ["$: missing required property 'b'"]),
        ('{"a": 1, "b": 2, "c": 3}', ["$: unexpected property 'c'"]),
        ("[1, 2]", ["$: expected object, got array"]),
        ("null", ["$: expected object, got null"]),
        ("", ["$: missing required property 'a'", "$: missing required property 'b'"]),
    ],
)
def test_parse_arguments_schema_errors(arguments: str, errors: list[str]) -> None:
    with pytest.raises(ToolArgumentsError) as info:
        add.parse_arguments(arguments)
    assert info.value.tool_name == "add"
    assert info.value.errors == errors
    assert str(info.value) == f"invalid arguments for tool 'add': {'; '.join(errors)}"
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, ta.TrioAgentsError)


@pytest.mark.parametrize("arguments", ['{"a": 1, "b": ', "not json", '{"a": NaN, "b": 1}'])
def test_parse_arguments_invalid_json(arguments: str) -> None:
    with pytest.raises(
        ToolArgumentsError, match=r"^invalid arguments for tool 'add': invalid JSON"
    ):
        add.parse_arguments(arguments)


def test_parse_arguments_empty_for_a_tool_without_parameters() -> None:
    @function_tool
    def now() -> str:
        return "noon"

    assert now.parse_arguments("") == {}
    assert now.parse_arguments("{}") == {}


# ------------------------------------------------------------------------ invoke


async def test_invoke_async_and_sync() -> None:
    ctx = make_ctx()
    assert await add.invoke(ctx, '{"a": 2, "b": 3}') == "5"
    output = await convert.invoke(ctx, '{"reading": {"value": 100}}')
    assert output == '{"value": 212.0, "unit": "F"}'
    assert not ctx.cancelled.is_set()


async def test_invoke_converts_arguments() -> None:
    seen: list[Any] = []

    @function_tool
    def record(reading: Reading, units: tuple[Unit, ...], ratio: float) -> None:
        seen.append((reading, units, ratio))

    output = await record.invoke(
        make_ctx(), '{"reading": {"value": 1, "unit": "F"}, "units": ["C"], "ratio": 2}'
    )
    assert output == ""
    assert seen == [(Reading(1.0, Unit.FAHRENHEIT), (Unit.CELSIUS,), 2.0)]
    assert type(seen[0][2]) is float


async def test_invoke_rejects_bad_arguments_without_calling() -> None:
    calls: list[int] = []

    @attrs.frozen
    class Positive:
        n: int = attrs.field(validator=attrs.validators.gt(0))

    @function_tool
    async def count(a: int, p: Positive | None = None) -> int:
        calls.append(a)
        return a

    ctx = make_ctx()
    with pytest.raises(ToolArgumentsError, match=r"\$\.a: expected integer, got string"):
        await count.invoke(ctx, '{"a": "1"}')
    with pytest.raises(ToolArgumentsError, match=r"^invalid arguments for tool 'count': \$\.p: "):
        await count.invoke(ctx, '{"a": 1, "p": {"n": 0}}')
    assert calls == []
    assert not ctx.cancelled.is_set()


async def test_invoke_passes_the_context() -> None:
    contexts: list[ToolContext] = []

    @function_tool
    async def async_tool(ctx: ToolContext) -> str:
        contexts.append(ctx)
        return ctx.call_id

    @function_tool
    def sync_tool(ctx: ToolContext, suffix: str) -> str:
        contexts.append(ctx)
        return ctx.tool_name + suffix

    ctx = make_ctx()
    assert await async_tool.invoke(ctx, "{}") == "call-1"
    assert await sync_tool.invoke(ctx, '{"suffix": "!"}') == "t!"
    assert contexts == [ctx, ctx]


class Opaque:
    def __str__(self) -> str:
        return "<opaque>"


@pytest.mark.parametrize(
    ("value", "output"),
    [
        ("text", "text"),
        ("", ""),
        (None, ""),
        (5, "5"),
        (2.5, "2.5"),
        (True, "true"),
        ([1, "a", None], '[1, "a", null]'),
        ((1, 2), "[1, 2]"),
        ({"k": [Unit.CELSIUS]}, '{"k": ["C"]}'),
        (Unit.FAHRENHEIT, "F"),
        (Reading(1.5), '{"value": 1.5, "unit": "C"}'),
        ([Reading(2)], '[{"value": 2, "unit": "C"}]'),
        (Pair(1, 2), '{"left": 1, "right": 2}'),
        ({"when": Opaque()}, '{"when": "<opaque>"}'),
        (Opaque(), "<opaque>"),
        (Path("/tmp/x"), "/tmp/x"),
        ("naïve", "naïve"),
    ],
)
async def test_output_conversion(value: object, output: str) -> None:
    @function_tool
    async def give() -> object:
        return value

    result = await give.invoke(make_ctx(), "{}")
    assert result == output
    assert type(result) is str


async def test_str_subclass_output_is_a_plain_str() -> None:
    class Name(str):
        pass

    @function_tool
    def name() -> Name:
        return Name("bob")

    result = await name.invoke(make_ctx(), "{}")
    assert result == "bob"
    assert type(result) is str


async def test_tool_exceptions_propagate_unchanged() -> None:
    class Boom(Exception):
        pass

    @function_tool
    async def async_boom() -> None:
        raise Boom("async")

    @function_tool
    def sync_boom() -> None:
        raise Boom("sync")

    for tool in (async_boom, sync_boom):
        ctx = make_ctx()
        with pytest.raises(Boom, match=r"sync"):
            await tool.invoke(ctx, "{}")
        assert ctx.cancelled.is_set()


async def test_cancelling_an_async_tool_sets_ctx_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cleanup: list[str] = []

    @function_tool
    async def slow(ctx: ToolContext) -> str:
        try:
            await trio.sleep(3600)
        finally:
            cleanup.append("cancelled" if ctx.cancelled.is_set() else "not yet")
        return "unreachable"

    ctx = make_ctx()
    with trio.move_on_after(10) as scope:
        await slow.invoke(ctx, "{}")
    assert scope.cancelled_caught
    assert trio.current_time() == 10
    assert ctx.cancelled.is_set()
    # set as Cancelled leaves the function (sync tools see it at once, see below)
    assert cleanup == ["not yet"]


@attrs.define
class _BlockedThread:
    """A sync tool whose thread blocks until released, then records ``ctx.cancelled``."""

    entered: threading.Event = attrs.field(factory=threading.Event)
    release: threading.Event = attrs.field(factory=threading.Event)
    finished: threading.Event = attrs.field(factory=threading.Event)
    saw_cancel: list[bool] = attrs.field(factory=list)

    def tool(self) -> Tool:
        @function_tool
        def blocking(ctx: ToolContext) -> str:
            self.entered.set()
            try:
                self.release.wait(timeout=30)
                self.saw_cancel.append(ctx.cancelled.is_set())  # its first read, maybe
                return "late"
            finally:
                self.finished.set()

        return blocking

    async def cancel_inside(self, ctx: ToolContext) -> float:
        """Invoke the tool and cancel the call once its thread is in; return when."""
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.tool().invoke, ctx, "{}")
                await trio.to_thread.run_sync(self.entered.wait)
                start = trio.current_time()
                scope.cancel()
        assert scope.cancelled_caught
        return start

    async def let_go(self) -> list[bool]:
        """Release the thread, wait for it to finish; what it saw of the cancel."""
        self.release.set()
        await trio.to_thread.run_sync(self.finished.wait)
        return self.saw_cancel


async def test_cancelling_a_sync_tool_abandons_its_thread(
    autojump_clock: trio.testing.MockClock,
) -> None:
    blocked = _BlockedThread()
    ctx = make_ctx()
    start = await blocked.cancel_inside(ctx)
    assert trio.current_time() == start
    assert ctx.cancelled.is_set()
    assert not blocked.finished.is_set()  # the cancel did not wait for the thread
    assert await blocked.let_go() == [True]


async def test_a_thread_that_first_reads_ctx_cancelled_after_the_cancel_sees_it_set(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # ctx.cancelled is made on first read: the cancel comes before anyone has read it,
    # and the abandoned thread's first read must still find it set.
    blocked = _BlockedThread()
    ctx = make_ctx()
    await blocked.cancel_inside(ctx)
    assert await blocked.let_go() == [True]
    assert ctx.cancelled.is_set()


def test_ctx_cancelled_made_while_the_call_is_cancelled_is_never_missed() -> None:
    # The race itself: a thread's first read of ctx.cancelled against mark_cancelled()
    # on another thread, many times. Whichever wins, the one event both end up with is
    # set once mark_cancelled() has returned.
    for _ in range(300):
        ctx = make_ctx()
        barrier = threading.Barrier(2)
        seen: list[threading.Event] = []

        def read(ctx: ToolContext, barrier: threading.Barrier, seen: list[threading.Event]) -> None:
            barrier.wait()
            seen.append(ctx.cancelled)

        reader = threading.Thread(target=read, args=(ctx, barrier, seen))
        reader.start()
        barrier.wait()
        mark_cancelled(ctx)
        reader.join()
        assert seen[0] is ctx.cancelled
        assert seen[0].is_set()


def test_ctx_cancelled_passed_in_is_the_one_set() -> None:
    event = threading.Event()
    ctx = ToolContext(run_id="r", call_id="c", tool_name="t", cancelled=event)
    assert ctx.cancelled is event
    mark_cancelled(ctx)
    assert event.is_set()
    # An event made after the call was marked starts set.
    late = make_ctx()
    mark_cancelled(late)
    assert late.cancelled.is_set()


async def test_sync_tools_use_the_limiter(autojump_clock: trio.testing.MockClock) -> None:
    limiter = trio.CapacityLimiter(1)
    entered = threading.Event()
    release = threading.Event()

    @function_tool
    def hold() -> str:
        entered.set()
        release.wait(timeout=30)
        return "held"

    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: hold.invoke(make_ctx(), "{}", limiter=limiter))
        await trio.to_thread.run_sync(entered.wait)
        assert limiter.borrowed_tokens == 1
        release.set()
    assert limiter.borrowed_tokens == 0


# ---------------------------------------------------------------------- progress


async def test_progress_from_threads_and_tasks() -> None:
    received: list[tuple[str, dict[str, Any]]] = []
    lock = threading.Lock()

    def on_progress(message: str, data: Mapping[str, Any]) -> None:
        with lock:
            received.append((message, dict(data)))

    @function_tool
    def crunch(ctx: ToolContext, n: int) -> int:
        for i in range(n):
            ctx.progress(f"step {i}", step=i)
        return n

    ctx = make_ctx(on_progress=on_progress)
    assert await crunch.invoke(ctx, '{"n": 3}') == "3"
    ctx.progress("done")
    assert received == [
        ("step 0", {"step": 0}),
        ("step 1", {"step": 1}),
        ("step 2", {"step": 2}),
        ("done", {}),
    ]
    with pytest.raises(TypeError, match="message must be a str"):
        ctx.progress(cast(Any, 3))
    make_ctx().progress("nobody listens")  # the default callback drops it


def test_tool_context_defaults() -> None:
    ctx = ToolContext(run_id="r", call_id="c", tool_name="t")
    assert isinstance(ctx.cancelled, threading.Event)
    assert not ctx.cancelled.is_set()
    assert ctx != ToolContext(run_id="r", call_id="c", tool_name="t")  # identity semantics
    assert "on_progress" not in repr(ctx)


# ------------------------------------------------------------------ run_process


async def test_run_process_success() -> None:
    result = await make_ctx().run_process(["sh", "-c", "echo out; echo err >&2"])
    assert result.returncode == 0
    assert result.stdout == b"out\n"
    assert result.stderr == b"err\n"
    result = await make_ctx().run_process(["cat"], stdin=b"piped")
    assert result.stdout == b"piped"


async def test_run_process_failure() -> None:
    with pytest.raises(subprocess.CalledProcessError) as info:
        await make_ctx().run_process(["sh", "-c", "echo bad >&2; exit 3"])
    assert info.value.returncode == 3
    assert info.value.stderr == b"bad\n"
    result = await make_ctx().run_process(["sh", "-c", "exit 3"], check=False)
    assert result.returncode == 3


async def test_run_process_rejects_options_it_owns() -> None:
    for option in ("start_new_session", "deliver_cancel", "process_group"):
        options: dict[str, Any] = {option: None}
        with pytest.raises(TypeError, match=option):
            await make_ctx().run_process(["true"], **options)
    with pytest.raises(ValueError, match="grace"):
        await make_ctx().run_process(["true"], grace=-1)


async def _run_and_cancel(argv: list[str], pid_via: str, **kwargs: Any) -> int:
    """Run ``argv``, which prints its pid on ``pid_via``, in a tool call; cancel the call.

    Returns the process group id; the call has ended when this returns.
    """
    ctx = make_ctx()
    read_fd, write_fd = os.pipe()
    kwargs[pid_via] = write_fd
    reader = trio.lowlevel.FdStream(read_fd)
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: ctx.run_process(argv, **kwargs))
                line = await reader.receive_some()
                pgid = int(line)
                # a new session: the shell's pid is the id of the group its children are in
                assert live_members(pgid)
                nursery.cancel_scope.cancel()
    finally:
        os.close(write_fd)
        await reader.aclose()
    return pgid


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
async def test_run_process_cancel_kills_the_process_group() -> None:
    # real clock: the process dies in real time. stdout goes to our pipe (for the pid),
    # then to /dev/null; one sleep runs in the background, one in the foreground.
    pgid = await _run_and_cancel(
        ["sh", "-c", "echo $$; exec >/dev/null; sleep 60 & sleep 60"], "stdout"
    )
    await wait_until_group_dead(pgid)


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
async def test_run_process_cancel_escalates_to_sigkill() -> None:
    # the shell and its children ignore SIGTERM: SIGKILL after the grace period
    pgid = await _run_and_cancel(
        ["sh", "-c", "trap '' TERM; echo $$ >&2; exec 2>/dev/null; sleep 60 & sleep 60"],
        "stderr",
        grace=0.05,
    )
    await wait_until_group_dead(pgid)


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
async def test_run_process_kills_leftovers_of_an_exited_leader() -> None:
    # the shell exits at once; its background child keeps the captured stdout open,
    # so the call waits. Cancelling it kills the orphan too.
    pgid = await _run_and_cancel(
        ["sh", "-c", "echo $$ >&2; exec 2>/dev/null; sleep 60 &"], "stderr"
    )
    await wait_until_group_dead(pgid)
    # and a call that returns normally leaves nothing behind either
    with trio.fail_after(10):
        result = await make_ctx().run_process(["sh", "-c", "echo $$; sleep 60 >/dev/null 2>&1 &"])
    await wait_until_group_dead(int(result.stdout))


async def test_tool_from_schema_gets_the_validated_arguments_as_one_dict() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    async def call(ctx: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
        seen.append((ctx.call_id, arguments))
        return {"sum": arguments["a"] + arguments.get("b", 0)}

    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    tool = Tool.from_schema("adder", "Adds.", schema, call, timeout=3)
    assert tool.spec().parameters == schema
    assert tool.timeout == 3
    ctx = ToolContext(run_id="r", call_id="c1", tool_name="adder")
    assert await tool.invoke(ctx, '{"a": 2, "b": 5}') == '{"sum": 7}'
    assert seen == [("c1", {"a": 2, "b": 5})]
    with pytest.raises(ToolArgumentsError, match=r"\$\.a: expected integer"):
        await tool.invoke(ctx, '{"a": "x"}')
    assert len(seen) == 1


def test_tool_from_schema_refuses_a_sync_function_or_a_non_object_schema() -> None:
    async def call(ctx: ToolContext, arguments: dict[str, Any]) -> str:
        return ""

    with pytest.raises(TypeError, match="async function"):
        Tool.from_schema("t", "", {"type": "object"}, lambda ctx, args: "")  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="type 'object'"):
        Tool.from_schema("t", "", {"type": "array"}, call)
    with pytest.raises(TypeError, match="invalid tool name"):
        Tool.from_schema("a b", "", {"type": "object"}, call)
