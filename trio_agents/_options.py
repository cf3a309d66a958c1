"""The ``**options`` of ``open_run`` / ``run`` / ``serve_run``, validated up front."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, TypeAlias

import attrs
import trio

from ._hooks import RunHooks
from ._items import ToolCall
from ._limits import UsageLimits
from ._resume import Resume
from ._session_lock import OnBusy

__all__ = ["BeforeTool", "InputOverlap", "OnBusy", "OnToolError", "RunOptions", "make_options"]

OnToolError: TypeAlias = Literal["return", "fail"]
InputOverlap: TypeAlias = Literal["keep", "skip"]
BeforeTool: TypeAlias = Callable[[ToolCall], Awaitable[None]]


def _check_positive(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{attribute.name} must be a number, not {type(value).__name__}")
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


def _check_count(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None and attribute.name == "max_turns":
        return  # None: the agent's max_turns
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value!r}")


def _check_bound(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A count that may be 0 (``max_depth=0``: no child runs at all)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


def _check_park_after(_instance: object, _attribute: object, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"park_after must be a number of seconds or None, not {value!r}")
    if not value >= 0:  # NaN too
        raise ValueError(f"park_after must be >= 0, got {value!r}")


def _check_hooks(_instance: object, _attribute: object, value: Any) -> None:
    if value is not None and not isinstance(value, RunHooks):
        raise TypeError(f"hooks must be a RunHooks instance, not {type(value).__name__}")


@attrs.frozen(kw_only=True)
class RunOptions:
    """Validated run options (see :func:`~trio_agents.open_run` for each one)."""

    cleanup_timeout: float = attrs.field(default=5.0, validator=_check_positive)
    max_concurrent_tools: int = attrs.field(default=8, validator=_check_count)
    inbox_capacity: int = attrs.field(default=1024, validator=_check_count)
    event_retention: int = attrs.field(default=65536, validator=_check_count)
    on_tool_error: OnToolError = attrs.field(
        default="return", validator=attrs.validators.in_(("return", "fail"))
    )
    hooks: RunHooks | None = attrs.field(default=None, validator=_check_hooks)
    thread_limiter: trio.CapacityLimiter | None = None
    max_turns: int | None = attrs.field(default=None, validator=_check_count)
    on_busy: OnBusy = attrs.field(
        default="reject", validator=attrs.validators.in_(("reject", "interrupt", "enqueue"))
    )
    before_tool: BeforeTool | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.is_callable())
    )
    resume: Resume | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(Resume))
    )
    # Any object: the run's dependencies, for tools (ctx.context), hooks and
    # instructions (run.context); child runs inherit it (DESIGN §18).
    context: Any = attrs.field(default=None, eq=False, hash=False)
    # What this run and its subtree may spend (DESIGN §18); a child also charges every
    # ancestor's limits.
    limits: UsageLimits | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(UsageLimits))
    )
    # How many levels of child runs may grow below this run (DESIGN §17). A child started
    # with ctx.run or as_tool runs on its parent's tool-call stack (about six Python
    # frames a level), so a tree that recurses without end would die of RecursionError
    # near 160 levels: past the bound a child is not started (_children.check_depth).
    max_depth: int = attrs.field(default=32, validator=_check_bound)
    # How many times one run may switch agents (DESIGN §17): agents that hand off to
    # each other could otherwise bounce a conversation forever; a transfer past it is
    # answered with an error the model reads (_toolcalls.hand_off).
    max_handoffs: int = attrs.field(default=10, validator=_check_bound)
    # What the session load does with the input's leading user messages that the
    # session already holds at its tail (_session_load.skip_stored): "keep" stores them
    # again; "skip" drops them, for a client that re-sends its whole message list (AG-UI)
    # so a message a failed run stored (a rejected one: marked, never sent) is not new
    # input again; nothing left is a retry of the stored ones (checked again).
    input_overlap: InputOverlap = attrs.field(
        default="keep", validator=attrs.validators.in_(("keep", "skip"))
    )
    # Seconds a turn's approval wait may last before the run parks (DESIGN §20): it
    # ends without a cancel repair, its calls left open in its session, for a later
    # run resumed from the session (``resume=``) to wait for the same decisions. None:
    # never. A root run with a session only (Run.__init__ checks); not inherited.
    park_after: float | None = attrs.field(default=None, validator=_check_park_after)
    # Keep each model request in the event log as a `model.request` event (DESIGN §23),
    # for replay; off by default, when a run emits no such event and pays one attribute
    # test per model call. Each recorded request is bounded by record_requests_max_bytes
    # (its JSON's size): a larger one is recorded as omitted ("too large"), its size
    # kept. How many are kept is the event log's retention (event_retention).
    record_requests: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    record_requests_max_bytes: int = attrs.field(default=1_000_000, validator=_check_count)


_DEFAULT: list[RunOptions] = []  # frozen: one shared instance for runs without options


def make_options(options: Mapping[str, Any]) -> RunOptions:
    """Build :class:`RunOptions`; an unknown name is a ``TypeError`` listing the known ones."""
    if not options:
        if not _DEFAULT:
            _DEFAULT.append(RunOptions())
        return _DEFAULT[0]
    known = {field.name for field in attrs.fields(RunOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(
            f"unknown run option(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return RunOptions(**options)
