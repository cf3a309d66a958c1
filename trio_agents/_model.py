"""The model protocol: how a run talks to an LLM.

A model is anything with a ``stream(request)`` method returning an async context
manager over :data:`ModelEvent` values. Leaving the context manager, normally or by
cancellation, must release everything the stream holds (an HTTP response, a socket).

Structured output (``Agent(output_type=...)``): every request of such a run carries an
:class:`OutputSpec`. A model that can constrain its answer to a JSON schema itself
declares ``native_output = True`` (an attribute; the OpenAI providers do) and answers
with the JSON as its text. For every other model the run adds a tool named
:data:`FINAL_ANSWER_TOOL` whose arguments are the answer: such a model needs to know
nothing about structured output.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol, TypeAlias, TypeVar, runtime_checkable

import attrs

from ._items import Item, ToolCall, item_from_json

__all__ = [
    "FINAL_ANSWER_TOOL",
    "Finish",
    "Model",
    "ModelEvent",
    "ModelRequest",
    "ModelStrings",
    "OutputSpec",
    "TextDelta",
    "ToolCallDone",
    "ToolSpec",
    "Usage",
    "model_name",
    "model_strings",
    "register_model_strings",
    "usage_from_json",
    "usage_served_by",
]


@attrs.frozen
class ToolSpec:
    """What a model is told about one tool: its name, description and JSON schema."""

    name: str
    description: str
    parameters: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        """Return the spec as a JSON-compatible dict."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolSpec:
        """Rebuild the spec from its :meth:`to_json` form (``ValueError`` if malformed)."""
        data = _object(data, "a tool spec")
        return cls(
            name=_string(data, "name", "a tool spec"),
            description=_string(data, "description", "a tool spec"),
            parameters=_object(data.get("parameters"), "a tool spec's parameters"),
        )


FINAL_ANSWER_TOOL = "final_answer"
"""The name of the tool a model without native structured output answers with."""


@attrs.frozen
class OutputSpec:
    """The JSON a structured run wants as its final answer (``ModelRequest.output``).

    Attributes:
        name: a name for the schema (``[A-Za-z0-9_-]``, at most 64 characters), as the
            OpenAI ``json_schema`` response formats require.
        schema: the JSON schema of the answer. Always an object schema (providers'
            native formats and tool arguments both need one): a type that is not an
            object is wrapped in one property, named by ``envelope``.
        strict: whether the schema fits OpenAI's strict mode (every property required,
            no additional properties, at every level); providers pass it on.
        description: what the answer is (from the output type's docstring), or "".
        envelope: the property holding the value when the output type is not an
            object (``"response"``: ``{"response": 42}`` for an ``int``); None when the
            schema is the value's own.
    """

    name: str
    schema: Mapping[str, Any]
    strict: bool = False
    description: str = ""
    envelope: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the spec as a JSON-compatible dict."""
        return {
            "name": self.name,
            "schema": dict(self.schema),
            "strict": self.strict,
            "description": self.description,
            "envelope": self.envelope,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OutputSpec:
        """Rebuild the spec from its :meth:`to_json` form (``ValueError`` if malformed)."""
        data = _object(data, "an output spec")
        strict = data.get("strict", False)
        envelope = data.get("envelope")
        if type(strict) is not bool:
            raise ValueError("an output spec's strict must be a boolean")
        if envelope is not None and not isinstance(envelope, str):
            raise ValueError("an output spec's envelope must be a string or null")
        return cls(
            name=_string(data, "name", "an output spec"),
            schema=_object(data.get("schema"), "an output spec's schema"),
            strict=strict,
            description=_string(data, "description", "an output spec", default=""),
            envelope=envelope,
        )


@attrs.frozen
class ModelRequest:
    """One model call: instructions, the conversation so far, the tools, the settings.

    ``output`` is set on every request of a run whose agent has an ``output_type``:
    the JSON the final answer must be (see :class:`OutputSpec`).

    ``on_wait``, when set (a run sets it), is for a model that holds a request back
    before sending it (a :class:`~trio_agents.models.RateLimit`): it calls
    ``on_wait("rate limit")`` when the request starts waiting and ``on_wait(None)``
    once the request goes out, and the run shows it on its ``running`` update
    (``detail={"throttled": "rate limit"}``, DESIGN §21). A model that never waits
    ignores it. It takes no part in comparing or printing requests.
    """

    instructions: str
    items: tuple[Item, ...]
    tools: tuple[ToolSpec, ...] = ()
    settings: Mapping[str, Any] = attrs.field(factory=dict)
    output: OutputSpec | None = None
    on_wait: Callable[[str | None], None] | None = attrs.field(
        default=None, kw_only=True, eq=False, repr=False
    )

    def to_json(self) -> dict[str, Any]:
        """Return the request as a JSON-compatible dict: ``instructions``, ``items`` (each
        item's ``to_json()``), ``tools``, ``settings`` and ``output`` (null without
        one); what a ``model.request`` event records (DESIGN §23). ``on_wait`` is not
        part of it. The settings are given as they are: a setting that is no JSON value
        makes the result unencodable (``json.dumps`` raises ``TypeError``)."""
        return {
            "instructions": self.instructions,
            "items": [item.to_json() for item in self.items],
            "tools": [tool.to_json() for tool in self.tools],
            "settings": dict(self.settings),
            "output": None if self.output is None else self.output.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelRequest:
        """Rebuild a request from its :meth:`to_json` form: sent to a model, the same
        request again (what :func:`~trio_agents.replay` does).

        Raises:
            ValueError: ``data`` is not a request (a field missing or of the wrong type).
        """
        data = _object(data, "a model request")
        items = data.get("items")
        tools = data.get("tools", [])
        if not isinstance(items, list | tuple):
            raise ValueError("a model request's items must be an array")
        if not isinstance(tools, list | tuple):
            raise ValueError("a model request's tools must be an array")
        output = data.get("output")
        try:
            decoded_items = tuple(item_from_json(item) for item in items)
        except TypeError as exc:
            raise ValueError(f"a model request's item: {exc}") from None
        return cls(
            instructions=_string(data, "instructions", "a model request"),
            items=decoded_items,
            tools=tuple(ToolSpec.from_json(tool) for tool in tools),
            settings=_object(data.get("settings", {}), "a model request's settings"),
            output=None if output is None else OutputSpec.from_json(output),
        )


@attrs.frozen
class TextDelta:
    """A fragment of assistant text."""

    text: str


@attrs.frozen
class ToolCallDone:
    """A complete tool call (providers assemble argument fragments themselves)."""

    call: ToolCall


@attrs.frozen
class Usage:
    """Token usage and cost of a model request; also the run-level sum in
    ``RunResult.usage``.

    ``input_tokens`` counts every input token, cached or not (OpenAI's convention; for
    Anthropic it is ``input_tokens + cache_read_input_tokens +
    cache_creation_input_tokens``); ``cache_read_tokens`` / ``cache_write_tokens`` say
    how many of them were read from or written to the provider's prompt cache
    (``None``: the provider did not say). ``cost`` is the request's price in USD as a
    :class:`~decimal.Decimal` (``None``: no price is known; see docs/models.md, "Cost").

    ``model`` names the model that served the request when something recorded it
    (:class:`~trio_agents.models.FallbackModel` does); a sum keeps it only when every
    part names the same model, else it is ``None``. A sum adds exactly: its cost is the
    sum of the known costs (``None`` only when no part was priced), and likewise for
    the cache figures.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    model: str | None = None
    cache_read_tokens: int | None = attrs.field(default=None, kw_only=True)
    cache_write_tokens: int | None = attrs.field(default=None, kw_only=True)
    cost: Decimal | None = attrs.field(default=None, kw_only=True)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.model if self.model == other.model else None,
            cache_read_tokens=_add_known(self.cache_read_tokens, other.cache_read_tokens),
            cache_write_tokens=_add_known(self.cache_write_tokens, other.cache_write_tokens),
            cost=_add_known(self.cost, other.cost),
        )

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def to_json(self) -> dict[str, int | str]:
        """Return the usage as a JSON-compatible dict: the token counts, and ``model``,
        the cache figures and ``cost`` (a decimal string, so it stays exact) only when
        known."""
        data: dict[str, int | str] = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }
        if self.model is not None:
            data["model"] = self.model
        if self.cache_read_tokens is not None:
            data["cache_read_tokens"] = self.cache_read_tokens
        if self.cache_write_tokens is not None:
            data["cache_write_tokens"] = self.cache_write_tokens
        if self.cost is not None:
            data["cost"] = str(self.cost)
        return data


def model_name(model: object) -> str:
    """What a run's events call ``model`` (``model.request``, a response's usage): its
    ``model`` attribute when that is a string (an HTTP provider's model name), else its
    class name. Never its repr, which may hold a base URL's credentials."""
    name = getattr(model, "model", None)
    return name if isinstance(name, str) else type(model).__name__


# Usage's slots, set directly by usage_served_by (attrs.evolve, the obvious way, walks
# the class's fields on every call: ten times the cost, once per model call of every run).
_USAGE_SLOTS = tuple(
    (field.name, Usage.__dict__[field.name].__set__) for field in attrs.fields(Usage)
)


def usage_served_by(usage: Usage, model: str) -> Usage:
    """``attrs.evolve(usage, model=model)``, built faster: the same object in every
    respect (what a response's ``run.item`` carries when its model named none)."""
    new = object.__new__(Usage)
    for name, set_slot in _USAGE_SLOTS:
        set_slot(new, model if name == "model" else getattr(usage, name))
    return new


def usage_from_json(data: Any) -> Usage:
    """Read a :meth:`Usage.to_json` dict back, checked as the run checks a model's usage
    (counts are non-negative ints, the cost a finite non-negative decimal string): an
    event from a peer or a store must not bring in a float cost or a negative count
    that later sums would carry.

    Raises:
        ValueError: malformed usage.
    """
    data = _object(data, "a usage")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError("a usage's model must be a string")
    cost = data.get("cost")
    if cost is not None:
        # A decimal string, at most 64 characters (longer is no price).
        if not isinstance(cost, str) or len(cost) > 64:
            raise ValueError(f"a usage's cost must be a decimal string, not {cost!r:.80}")
        try:
            cost = Decimal(cost)
        except InvalidOperation:
            raise ValueError(f"a usage's cost must be a decimal string, not {cost!r:.80}") from None
        if not cost.is_finite() or cost < 0:
            raise ValueError(f"a usage's cost must be finite and non-negative, not {cost!r:.80}")
    return Usage(
        _count(data.get("input_tokens", 0)),
        _count(data.get("output_tokens", 0)),
        model,
        cache_read_tokens=_maybe_count(data.get("cache_read_tokens")),
        cache_write_tokens=_maybe_count(data.get("cache_write_tokens")),
        cost=cost,
    )


def _count(value: Any) -> int:
    # type() is int: a bool or a float is not a token count.
    if type(value) is not int or value < 0:
        raise ValueError(f"a token count must be a non-negative integer, not {value!r:.80}")
    return value


def _maybe_count(value: Any) -> int | None:
    return None if value is None else _count(value)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a JSON object, not {type(value).__name__}")
    return dict(value)


def _string(data: Mapping[str, Any], key: str, what: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{what}'s {key} must be a string")
    return value


_Known = TypeVar("_Known", int, Decimal)


def _add_known(a: _Known | None, b: _Known | None) -> _Known | None:
    """The sum of what is known (``None`` only when neither is)."""
    if a is None:
        return b
    if b is None:
        return a
    return a + b


@attrs.frozen
class Finish:
    """The model finished its response: ``"stop"``, ``"tool_calls"``, ``"length"``, ..."""

    reason: str


ModelEvent: TypeAlias = TextDelta | ToolCallDone | Usage | Finish
"""Anything a model stream yields."""


@runtime_checkable
class Model(Protocol):
    """The protocol every model implements (see :mod:`trio_agents.models`)."""

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        """Open a streaming response for ``request``.

        The returned context manager yields an async iterator of model events; leaving
        it (normally or by cancellation) must close the underlying response.
        """
        ...


# ----------------------------------------------------------------- model strings


@attrs.frozen
class ModelStrings:
    """What turns ``Agent(model="openai:gpt-4o-mini")`` into a model, and an agent with
    no model into the default one.

    ``trio_agents.models`` registers it when imported (and ``trio_agents`` imports that
    package), so model strings work wherever the package does, while the run core
    names no provider: the models sit above the core, which never imports them.

    Attributes:
        resolve: the model a string names; a ``ValueError`` saying what is wrong with
            it (credentials masked) and the known prefixes otherwise.
        redact: the string with the credentials of any URL in it masked, for messages.
        default: a new default model (the offline demo).
    """

    resolve: Callable[[str], Model]
    redact: Callable[[str], str]
    default: Callable[[], Model]


_registered: list[ModelStrings] = []


def register_model_strings(strings: ModelStrings) -> None:
    """Make ``strings`` what resolves model strings (``trio_agents.models`` does, once,
    on import; a later registration replaces an earlier one)."""
    _registered[:] = [strings]


def model_strings() -> ModelStrings:
    """What resolves model strings: what ``trio_agents.models`` registered."""
    if not _registered:
        # Not reachable through the package (importing trio_agents imports the models);
        # a clear message all the same rather than an IndexError.
        raise RuntimeError("no model strings registered: import trio_agents.models")
    return _registered[0]
