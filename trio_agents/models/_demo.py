"""``DemoModel``: the offline default model. A labelled demo, not an LLM.

It needs no network and no API key, so ``make demo`` and a first ``Agent()`` work out
of the box. It streams word by word with a delay (so a demo shows live streaming and
there is time to cancel), and it uses the agent's tools the way a model would: it
picks the tool whose name and description best match the user's words, fills in
arguments that satisfy the tool's JSON schema, and once the results are back it reports
them. Every answer carries the label ``[demo model]`` so nobody mistakes it for a real
model.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, final

import attrs

from .._items import AssistantMessage, Item, ToolCall, ToolResult, UserMessage
from .._model import (
    FINAL_ANSWER_TOOL,
    Finish,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCallDone,
    ToolSpec,
)
from ._scripted import _estimate_usage, _EventStream, _split_text, _Step

__all__ = ["DemoModel"]

_LABEL = "[demo model]"

_WORDS = re.compile(r"[a-z0-9]+|[+*/=-]")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.]*\w)")
_PREPOSITION = re.compile(r"\b(?:for|about|in|on|of|called|named)\s+(.+)", re.IGNORECASE)
_STOPWORDS = frozenset(
    (
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "can",
        "could",
        "do",
        "does",
        "for",
        "from",
        "how",
        "i",
        "in",
        "is",
        "it",
        "me",
        "my",
        "of",
        "on",
        "or",
        "please",
        "should",
        "so",
        "tell",
        "that",
        "the",
        "this",
        "to",
        "what",
        "which",
        "who",
        "why",
        "will",
        "with",
        "would",
        "you",
    )
)
# a few words a user might say that name what a tool does
_SYNONYMS: Mapping[str, tuple[str, ...]] = {
    "+": ("add", "plus", "sum"),
    "plus": ("add", "sum"),
    "sum": ("add", "plus"),
    "total": ("add", "sum"),
    "-": ("subtract", "minus"),
    "minus": ("subtract",),
    "*": ("multiply", "times", "product"),
    "times": ("multiply", "product"),
    "/": ("divide",),
    "forecast": ("weather",),
    "temperature": ("weather",),
    "rain": ("weather",),
    "find": ("search", "lookup", "look"),
    "look": ("search", "find", "lookup"),
}
_MAX_QUOTE = 200
_MAX_DEPTH = 8

_TOOL_INTROS = (
    "Let me use the `{name}` tool.",
    "I'll ask the `{name}` tool.",
    "This looks like a job for the `{name}` tool.",
)
_ANSWER_OUTROS = (
    "I only relay tool results; a real model would say more.",
    "A real model would explain more; I only relay what the tools said.",
    "I am not an LLM, so that's the whole answer.",
)
_ECHO_OUTROS = (
    "I am an offline stand-in, not an LLM, so all I can do is echo your request."
    " Give the agent a real model for real answers.",
    "No LLM is behind this answer; configure a real model to get one.",
    "This is canned, offline text: plug in a real model for a real reply.",
)


def _normalise(word: str) -> str:
    """Fold simple plurals: ``integers`` -> ``integer`` (not ``status`` or ``plus``)."""
    if len(word) > 4 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _keywords(text: str) -> set[str]:
    """The lower-case words (and arithmetic signs) of ``text``, minus stop words."""
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)  # camelCase -> camel Case
    words = _WORDS.findall(text.replace("_", " ").lower())
    return {_normalise(word) for word in words if word not in _STOPWORDS}


def _user_keywords(text: str) -> set[str]:
    words = _keywords(text)
    for word in list(words):
        words.update(_SYNONYMS.get(word, ()))
    return words


def _pick_tool(message: str, tools: Sequence[ToolSpec]) -> ToolSpec:
    """The tool sharing most words with ``message`` (the name counts double).

    Ties go to the earlier tool; with no overlap at all, the first tool.
    """
    wanted = _user_keywords(message)
    best, best_score = tools[0], 0
    for tool in tools:
        name_words = _keywords(tool.name)
        description_words = _keywords(tool.description) - name_words
        score = 2 * len(wanted & name_words) + len(wanted & description_words)
        if score > best_score:
            best, best_score = tool, score
    return best


def _clip(text: str, limit: int = _MAX_QUOTE) -> str:
    text = " ".join(text.replace(_LABEL, "demo model").split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


# --------------------------------------------------------------- schema-valid arguments


def _bound(schema: Mapping[str, Any], key: str, shift: float = 0.0) -> float | None:
    value = schema.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) + shift


@attrs.define
class _Filler:
    """Builds a value for a JSON schema out of the user's message."""

    message: str
    root: Mapping[str, Any]
    more: str = ""  # more text to take numbers from (what the tools said)
    numbers: Iterator[float] = attrs.field(init=False)
    phrase: str = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        found = _NUMBER.findall(self.message) + _NUMBER.findall(self.more)
        self.numbers = iter([float(n) for n in found])
        match = _PREPOSITION.search(self.message)
        phrase = match.group(1) if match else self.message
        self.phrase = _clip(phrase.strip().rstrip("?!.").strip(), 100)

    def _resolve(self, schema: Mapping[str, Any], depth: int) -> Mapping[str, Any]:
        while isinstance(schema.get("$ref"), str) and depth < _MAX_DEPTH:
            ref: str = schema["$ref"]
            target: Any = self.root
            if not ref.startswith("#"):
                return {}
            for part in ref.lstrip("#").split("/"):
                if not part:
                    continue
                part = part.replace("~1", "/").replace("~0", "~")
                target = target.get(part) if isinstance(target, Mapping) else None
            if not isinstance(target, Mapping):
                return {}
            schema = target
            depth += 1
        return schema

    def value(self, schema: Mapping[str, Any], depth: int = 0) -> Any:
        """A value that satisfies ``schema`` (the keywords tool schemas use)."""
        schema = self._resolve(schema, depth)
        if depth >= _MAX_DEPTH:
            return None
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][0]
        for key in ("anyOf", "oneOf"):
            branches = [b for b in schema.get(key, ()) if isinstance(b, Mapping)]
            if branches:
                useful = [b for b in branches if self._resolve(b, depth).get("type") != "null"]
                return self.value((useful or branches)[0], depth + 1)
        if isinstance(schema.get("allOf"), list) and schema["allOf"]:
            merged: dict[str, Any] = {}
            for part in schema["allOf"]:
                if isinstance(part, Mapping):
                    merged.update(self._resolve(part, depth))
            merged.update({k: v for k, v in schema.items() if k != "allOf"})
            return self.value(merged, depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            if "properties" in schema or "required" in schema:
                kind = "object"
            elif "items" in schema:
                kind = "array"
            elif "default" in schema:
                return schema["default"]
            else:
                kind = "string"
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            item_schema = schema.get("items")
            count = schema.get("minItems", 0)
            if not isinstance(item_schema, Mapping) or not isinstance(count, int):
                return []
            return [self.value(item_schema, depth + 1) for _ in range(count)]
        if kind in ("integer", "number"):
            return self._number(schema, integer=kind == "integer")
        if kind == "boolean":
            return False
        if kind == "null":
            return None
        return self._string(schema)

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        result: dict[str, Any] = {}
        for name in schema.get("required", ()):
            if not isinstance(name, str):
                continue
            prop = properties.get(name)
            result[name] = self.value(prop if isinstance(prop, Mapping) else {}, depth + 1)
        return result

    def _number(self, schema: Mapping[str, Any], *, integer: bool) -> int | float:
        value = next(self.numbers, 0.0)
        step = 1.0 if integer else 0.5
        lows = [_bound(schema, "minimum"), _bound(schema, "exclusiveMinimum", step)]
        highs = [_bound(schema, "maximum"), _bound(schema, "exclusiveMaximum", -step)]
        low = max((b for b in lows if b is not None), default=None)
        high = min((b for b in highs if b is not None), default=None)
        if low is not None and value < low:
            value = float(math.ceil(low)) if integer else low
        if high is not None and value > high:
            value = float(math.floor(high)) if integer else high
        if integer or value.is_integer():
            return math.trunc(value)
        return value

    def _string(self, schema: Mapping[str, Any]) -> str:
        text = self.phrase
        low, high = schema.get("minLength"), schema.get("maxLength")
        if isinstance(high, int) and len(text) > high:
            text = text[: max(high, 0)]
        if isinstance(low, int) and len(text) < low:
            text = text + "x" * (low - len(text))
        return text


def _demo_arguments(parameters: Mapping[str, Any], message: str, more: str = "") -> dict[str, Any]:
    """Arguments for a tool with JSON schema ``parameters``, taken from ``message``.

    Required properties are filled: numbers from the message in order (else 0 or the
    minimum), strings with the phrase after "for"/"about"/"in"/... (else the whole
    message), the first value of an enum, ``false``, empty arrays, nested objects in
    the same way.
    """
    value = _Filler(message, parameters, more).value(parameters)
    return value if isinstance(value, dict) else {}


# ------------------------------------------------------------------------ answering


def _last_user_index(items: Sequence[Item]) -> int | None:
    for index in range(len(items) - 1, -1, -1):
        if isinstance(items[index], UserMessage):
            return index
    return None


def _fresh_call_id(items: Sequence[Item]) -> str:
    taken = {item.call_id for item in items if isinstance(item, ToolCall | ToolResult)}
    number = sum(isinstance(item, ToolCall) for item in items) + 1
    while f"demo_call_{number}" in taken:
        number += 1
    return f"demo_call_{number}"


def _report(result: ToolResult, calls: Mapping[str, ToolCall]) -> str:
    call = calls.get(result.call_id)
    name = f"the `{call.name}` tool" if call is not None else f"tool call {result.call_id}"
    if result.status == "ok":
        return f"{name} returned {_clip(result.output)}"
    if result.status == "cancelled":
        return f"{name} was cancelled"
    return f"{name} failed: {_clip(result.output)}"


def _capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]


@final
@attrs.frozen(kw_only=True)
class DemoModel:
    """The offline default :class:`~trio_agents.Model`: a labelled demo, not an LLM.

    Every answer starts with ``[demo model]``. Given a user message and tools, it picks
    the tool whose name and description best match the message (simple keyword overlap,
    else the first tool), calls it with arguments that satisfy the tool's JSON schema
    (numbers and phrases from the message), and once results are back it reports them
    (``"[demo model] The `add` tool returned 5. ..."``). Without tools it echoes the
    request. With structured output it answers, after any tool results, with a value
    built from the output schema the same way (numbers and phrases from the message). Text streams word by word with ``trio.sleep(delay)`` before each chunk.

    Args:
        delay: seconds between streamed chunks.
        seed: varies the wording. ``None`` always uses the plain wording; any seed gives
            the same answer for the same request every time.
    """

    delay: float = attrs.field(default=0.02)
    seed: int | None = attrs.field(default=None)

    @delay.validator
    def _check_delay(self, _attribute: object, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"delay must be a number, not {type(value).__name__}")
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"delay must be a finite number >= 0, got {value!r}")

    @seed.validator
    def _check_seed(self, _attribute: object, value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"seed must be an int or None, not {type(value).__name__}")

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        """Answer ``request`` as described above, as a stream of model events."""
        text, calls = self._respond(request)
        steps: list[_Step] = [(self.delay, TextDelta(chunk)) for chunk in _split_text(text)]
        steps.extend((0.0, ToolCallDone(call)) for call in calls)
        steps.append((0.0, _estimate_usage(request, text, calls)))
        steps.append((0.0, Finish("tool_calls" if calls else "stop")))
        return _EventStream(steps)

    def _choose(self, options: Sequence[str], request: ModelRequest) -> str:
        if self.seed is None:
            return options[0]
        digest = hashlib.sha256(
            json.dumps([item.to_json() for item in request.items], sort_keys=True).encode()
        ).hexdigest()
        return random.Random(f"{self.seed}:{digest}").choice(options)

    def _respond(self, request: ModelRequest) -> tuple[str, list[ToolCall]]:
        items = request.items
        last_user = _last_user_index(items)
        if last_user is None:
            return (
                f"{_LABEL} Hello! I am the offline demo model, not an LLM."
                " Send a message and I will answer it as well as a demo can.",
                [],
            )
        message = items[last_user]
        assert isinstance(message, UserMessage)
        later = items[last_user + 1 :]
        results = [item for item in later if isinstance(item, ToolResult)]
        # Structured output: the run offers a final-answer tool (or, for a native
        # model, asks for the JSON as the text). Either way the answer is built from
        # the schema like tool arguments, once the agent's own tools have answered.
        final = next((t for t in request.tools if t.name == FINAL_ANSWER_TOOL), None)
        tools = [t for t in request.tools if t.name != FINAL_ANSWER_TOOL]
        if request.output is not None and (results or not tools):
            # Numbers from the question, then from what the tools said.
            said = " ".join(r.output for r in results)
            answer = _demo_arguments(request.output.schema, message.content, said)
            if final is None:
                return json.dumps(answer, ensure_ascii=False), []
            call = ToolCall(
                _fresh_call_id(items), final.name, json.dumps(answer, ensure_ascii=False)
            )
            return f"{_LABEL} Here is my answer, in the shape the agent asked for.", [call]
        if results:
            calls = {item.call_id: item for item in items if isinstance(item, ToolCall)}
            reports = [_report(result, calls) for result in results]
            summary = _capitalise(", and ".join(reports))
            outro = self._choose(_ANSWER_OUTROS, request)
            return f"{_LABEL} {summary}. {outro}", []
        interrupted = any(
            isinstance(item, AssistantMessage) and item.status == "incomplete" for item in later
        )
        resume = "Picking up after the interruption: " if interrupted else ""
        if tools:
            tool = _pick_tool(message.content, tools)
            arguments = _demo_arguments(tool.parameters, message.content)
            call = ToolCall(
                _fresh_call_id(items), tool.name, json.dumps(arguments, ensure_ascii=False)
            )
            intro = self._choose(_TOOL_INTROS, request).format(name=tool.name)
            return f"{_LABEL} {resume}{intro}", [call]
        quote = _clip(message.content)
        outro = self._choose(_ECHO_OUTROS, request)
        if quote:
            return f"{_LABEL} {resume}You asked: “{quote}”. {outro}", []
        return f"{_LABEL} {resume}You sent an empty message. {outro}", []
