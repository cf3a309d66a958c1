"""Structured output: an agent's ``output_type``, what the model is told about it, and
how a final answer is checked and turned into the value.

``Agent(output_type=T)`` compiles ``T`` once, at construction, into an
:class:`OutputType`: the :class:`~trio_agents.models.OutputSpec` every request of a run
carries, plus the schema and converter of the value itself (``_typeschema.py`` builds both,
the same machinery as tool parameters). ``T`` is one of:

- an attrs class, a dataclass or a ``TypedDict`` — an object schema;
- anything else ``_typeschema.py`` describes (``int``, ``str``, ``list[Point]``,
  ``Literal[...]``, a union, ...) — wrapped in a one-property object (the *envelope*,
  ``{"response": ...}``), because providers' native formats and tool arguments must be
  objects;
- a raw JSON schema: :class:`JSONSchema` (or a plain ``Mapping``, which no type is) —
  the answer is the decoded JSON value, checked but not converted.

A final answer comes either as text (a model with native structured output, or one
that answered in text anyway) or as the arguments of the ``final_answer`` tool call.
Both go through :meth:`OutputType.take`, which returns :class:`Accepted` or
:class:`Rejected` — the turn engine decides what to do with them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeAlias, final

import attrs

from ._error_text import describe_error
from ._frozen import freeze_json
from ._model import FINAL_ANSWER_TOOL, OutputSpec, ToolSpec
from ._text_cleaning import clean_value
from ._typeschema import ArgumentConversionError, compile_type, to_json_value
from ._validator import loads_json, validate

__all__ = [
    "ENVELOPE",
    "Accepted",
    "JSONSchema",
    "OutputType",
    "Rejected",
    "compile_output",
    "output_problems",
]

ENVELOPE = "response"
"""The property that holds an output value that is not an object."""

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n(.*)\n```$", re.DOTALL)
# A JSON escape of a surrogate (``\ud83d``): its str may need cleaning after decoding.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _to_schema(value: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"JSONSchema(schema=...) must be a mapping, not {type(value).__name__}")
    try:
        # A deep, JSON-only copy: later changes to the caller's dict change nothing.
        copied = json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"JSONSchema(schema=...) is not JSON: {exc}") from None
    return MappingProxyType(copied)


def _check_name(_instance: object, _attribute: object, value: object) -> None:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(
            f"JSONSchema(name=...) must be 1-64 letters, digits, '_' or '-', got {value!r}"
        )


@final
@attrs.frozen
class JSONSchema:
    """A raw JSON schema as an ``Agent(output_type=...)``.

    The final answer is the decoded JSON value (dicts, lists, str, ...), checked against
    ``schema``. A plain ``Mapping`` passed as ``output_type`` is the same as
    ``JSONSchema(mapping)``; the wrapper adds a name, a description and ``strict``.

    Our own check understands the keywords ``type``, ``properties``, ``required``,
    ``additionalProperties``, ``items``, ``enum`` and ``anyOf``, and ignores the
    others (a provider's native structured output may still enforce them).

    Args:
        schema: the JSON schema (copied).
        name: the schema's name for providers (1-64 of ``[A-Za-z0-9_-]``).
        description: what the answer is; default the schema's own ``description``.
        strict: OpenAI's strict mode; None (the default) turns it on exactly when the
            schema fits it (every property required, ``additionalProperties: false``).
    """

    schema: Mapping[str, Any] = attrs.field(converter=_to_schema, hash=False)
    name: str = attrs.field(default="output", validator=_check_name, kw_only=True)
    description: str = attrs.field(
        default="", validator=attrs.validators.instance_of(str), kw_only=True
    )
    strict: bool | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.instance_of(bool)),
        kw_only=True,
    )


@final
@attrs.frozen
class Accepted:
    """A final answer that validated; ``value`` is the converted output."""

    value: Any


@final
@attrs.frozen
class Rejected:
    """A final answer that did not validate; ``problem`` says why, for the model."""

    problem: str


Attempt: TypeAlias = Accepted | Rejected


@final
@attrs.frozen(eq=False)
class OutputType:
    """An agent's compiled ``output_type``.

    Attributes:
        spec: what every model request carries.
        schema: the schema of the value itself (inside the envelope, if there is one).
        convert: turns a JSON value valid against ``schema`` into the output value.
    """

    spec: OutputSpec
    schema: Mapping[str, Any]
    convert: Callable[[Any], Any] = attrs.field(repr=False)

    _tool_spec: ToolSpec = attrs.field(init=False, repr=False)

    @_tool_spec.default
    def _make_tool_spec(self) -> ToolSpec:
        about = f" The answer is: {self.spec.description}" if self.spec.description else ""
        return ToolSpec(
            FINAL_ANSWER_TOOL,
            "Give your final answer by calling this tool once, on its own, when you are"
            f" done; its arguments are the answer.{about}",
            self.spec.schema,
        )

    def tool_spec(self) -> ToolSpec:
        """The final-answer tool, for models without native structured output (one
        shared, read-only spec)."""
        return self._tool_spec

    def take(self, value: object) -> Attempt:
        """Check a decoded final answer and convert it."""
        envelope = self.spec.envelope
        if envelope is not None and isinstance(value, dict) and set(value) == {envelope}:
            value = value[envelope]
        # Without the envelope a model that answered ``42`` for an int is right too.
        try:
            errors = validate(self.schema, value)
        except RecursionError:  # a value nested deeper than the checker's recursion
            return Rejected(_TOO_DEEP)
        if errors:
            return Rejected("; ".join(errors[:5]))
        try:
            return Accepted(self.convert(value))
        except ArgumentConversionError as exc:
            return Rejected(str(exc))
        except RecursionError:
            return Rejected(_TOO_DEEP)
        except Exception as exc:
            # The output type's own code (a validator, a converter) raised: whatever it
            # raised, the answer is invalid and the model is told why (docs/output.md).
            return Rejected(f"$: {describe_error(exc)}")

    def take_text(self, text: str) -> Attempt:
        """A final answer given as text: JSON (a Markdown code fence around it is
        tolerated). For ``output_type=str``, text that is not a JSON string is the
        value itself."""
        stripped = text.strip()
        fenced = _FENCE.match(stripped)
        if fenced:
            stripped = fenced.group(1).strip()
        try:
            value = _decode(stripped)
        except RecursionError:
            return Rejected(_TOO_DEEP)
        except ValueError as exc:
            if self.schema.get("type") == "string":
                return self.take(text)
            what = "an empty answer" if not stripped else f"not JSON ({exc})"
            return Rejected(f"the answer is {what}")
        attempt = self.take(value)
        if type(attempt) is Rejected and self.schema.get("type") == "string":
            return self.take(text)
        return attempt

    def take_arguments(self, arguments: str) -> Attempt:
        """A final answer given as the arguments of a ``final_answer`` call."""
        try:
            value = _decode(arguments or "{}")
        except RecursionError:
            return Rejected(_TOO_DEEP)
        except ValueError as exc:
            return Rejected(f"the arguments are not JSON ({exc})")
        return self.take(value)

    def text_of(self, arguments: str) -> str:
        """An accepted ``final_answer`` call's answer as text, for the streaming output
        guardrails (which never saw it stream): the value inside the envelope, a str
        as itself, anything else as JSON without escapes (``"\\u0035"`` would hide a
        ``5`` from a guardrail looking for digits)."""
        try:
            value = _decode(arguments or "{}")
        except (ValueError, RecursionError):  # pragma: no cover - it was accepted
            return arguments
        envelope = self.spec.envelope
        if envelope is not None and isinstance(value, dict) and set(value) == {envelope}:
            value = value[envelope]
        if isinstance(value, str):
            return value
        return json.dumps(value, ensure_ascii=False)


_TOO_DEEP = "the answer is nested too deeply"


def _decode(text: str) -> Any:
    """A final answer's JSON, strictly (no ``NaN``, ``Infinity``, ``1e400``: a
    structured answer must be JSON, as tool arguments must), with the surrogates of
    its str values and keys cleaned (``"\\ud83d"`` is valid JSON, but a lone surrogate
    is no text: the answer goes on to users, logs and other services).

    Raises:
        ValueError: not JSON. RecursionError: nested too deeply.
    """
    value = loads_json(text)
    if _SURROGATE_ESCAPE.search(text):
        value = clean_value(value)
    return value


def output_problems(spec: OutputSpec, value: object) -> list[str]:
    """Why ``value`` (a run's ``final_output``) does not validate against ``spec``;
    empty when it does. For the invariant checker."""
    ok, json_value = to_json_value(value)
    if not ok:
        return [f"a {type(value).__name__} is not JSON-serialisable"]
    if spec.envelope is not None:
        json_value = {spec.envelope: json_value}
    return validate(spec.schema, json_value)


# ------------------------------------------------------------------- compiling


def compile_output(output_type: object) -> OutputType | None:
    """Compile an ``Agent(output_type=...)``; None for None (plain text answers).

    Raises:
        TypeError: the type is not one ``_typeschema.py`` can describe.
    """
    if output_type is None:
        return None
    if isinstance(output_type, Mapping):
        output_type = JSONSchema(output_type)
    if isinstance(output_type, JSONSchema):
        schema = dict(output_type.schema)
        name, description = output_type.name, output_type.description
        strict: bool | None = output_type.strict
        convert: Callable[[Any], Any] = _identity
    else:
        try:
            schema, convert = compile_type(output_type)
        except TypeError as exc:
            raise TypeError(f"Agent(output_type=...): {exc}") from None
        name, description, strict = _name_of(output_type), "", None
    if not description and isinstance(schema.get("description"), str):
        description = schema["description"]
    envelope: str | None = None
    outer = schema
    if not _is_object(schema):
        envelope = ENVELOPE
        outer = {
            "type": "object",
            "properties": {ENVELOPE: schema},
            "required": [ENVELOPE],
            "additionalProperties": False,
        }
    if strict is None:
        strict = _fits_strict(outer)
    # Read-only, shared by every request of every run of the agent (_frozen.py).
    frozen = freeze_json(outer)
    spec = OutputSpec(name, frozen, strict=strict, description=description, envelope=envelope)
    return OutputType(spec, frozen if envelope is None else frozen["properties"][envelope], convert)


def _identity(value: Any) -> Any:
    return value


def _name_of(output_type: object) -> str:
    """The class name for a class (``Point``), else ``"output"`` (for ``list[int]``)."""
    if isinstance(output_type, type) and output_type not in (str, int, float, bool):
        name = re.sub(r"[^A-Za-z0-9_-]", "_", output_type.__name__)[:64]
        if name:
            return name
    return "output"


def _is_object(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "object" or (kind is None and "properties" in schema and "anyOf" not in schema)


def _fits_strict(schema: object) -> bool:
    """Whether ``schema`` fits OpenAI's strict structured outputs: every object lists
    its properties, requires all of them and allows no others; every node says its
    type (or is an ``anyOf`` / ``enum``); no ``default``."""
    if not isinstance(schema, Mapping) or "default" in schema:
        return False
    if "anyOf" in schema:
        branches = schema["anyOf"]
        return isinstance(branches, list) and all(_fits_strict(b) for b in branches)
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if kind is None:
        return "enum" in schema
    if "object" in kinds:
        properties = schema.get("properties")
        if not isinstance(properties, Mapping) or schema.get("additionalProperties") is not False:
            return False
        if set(schema.get("required", ())) != set(properties):
            return False
        return all(_fits_strict(p) for p in properties.values())
    if "array" in kinds:
        return _fits_strict(schema.get("items"))
    return True
