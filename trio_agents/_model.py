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
from decimal import Decimal
from typing import Any, Protocol, TypeAlias, TypeVar, runtime_checkable

import attrs

from ._items import Item, ToolCall

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
    "model_strings",
    "register_model_strings",
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
