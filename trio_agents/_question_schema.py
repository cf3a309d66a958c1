"""The schema of a question's answer (``ToolContext.request_approval(schema=...)``, an
MCP server's elicitation form), checked when the question is asked, and the content an
approve carries, checked against it.

A question's schema comes from a tool's author or from an MCP server, not from our own
:mod:`._typeschema`, so :mod:`._validator`'s subset (tuned for tool arguments) is not
enough, and a schema it cannot read must not surface as a crash when someone answers
(an ``AttributeError`` in an approve took a Temporal worker's push listener down). Here:

- :func:`schema_problems` reads a schema once, when the question is asked: every place
  that holds a schema holds a mapping, every keyword's value has its type, and every
  keyword is one this module enforces or a pure annotation. A keyword it would ignore
  (``pattern``, ``allOf``, ``$ref``, ...) is refused there: an approve must never accept
  content the asker's schema forbids.
- :func:`content_problems` checks an answer: the subset of JSON Schema that forms use
  (MCP's elicitation schemas: ``type``, ``properties``, ``required``,
  ``additionalProperties``, ``items``, ``enum``, ``const``, ``anyOf``/``oneOf`` of
  titled constants, ``minLength``/``maxLength``, ``minimum``/``maximum`` and their
  exclusive forms, ``minItems``/``maxItems``). ``format`` is an annotation, as JSON
  Schema's default vocabulary has it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any, Final

from ._validator import MAX_ERRORS, child_path, json_equal, json_type

__all__ = ["MAX_DEPTH", "content_problems", "schema_problems"]

MAX_DEPTH: Final = 16
"""How deep a question's schema may nest (a form's, in practice, two or three)."""

_ANNOTATIONS: Final = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "format",
        "enumNames",
        "$schema",
        "$id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
_TYPES: Final = frozenset({"null", "boolean", "integer", "number", "string", "array", "object"})
_COUNTS: Final = ("minLength", "maxLength", "minItems", "maxItems")
_BOUNDS: Final = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_BRANCHES: Final = ("anyOf", "oneOf")
_BOUND_TESTS: Final = (
    ("minimum", operator.ge),
    ("maximum", operator.le),
    ("exclusiveMinimum", operator.gt),
    ("exclusiveMaximum", operator.lt),
)


def schema_problems(schema: object) -> list[str]:
    """What makes ``schema`` unusable as a question's schema (empty: usable)."""
    problems: list[str] = []
    _read(schema, "$", 0, problems)
    return problems[:MAX_ERRORS]


def _read(schema: object, path: str, depth: int, problems: list[str]) -> None:
    if len(problems) >= MAX_ERRORS:
        return
    if depth > MAX_DEPTH:
        problems.append(f"{path}: nested deeper than {MAX_DEPTH}")
        return
    if not isinstance(schema, Mapping):
        problems.append(f"{path}: a schema is a JSON object, not {json_type(schema)}")
        return
    for key, value in schema.items():
        where = f"{path}.{key}"
        if key in _ANNOTATIONS:
            continue
        if key == "type":
            kinds = [value] if isinstance(value, str) else value
            if not isinstance(kinds, list) or not kinds or not set(kinds) <= _TYPES:
                problems.append(f"{where}: a JSON type or a list of them")
        elif key == "properties":
            if not isinstance(value, Mapping):
                problems.append(f"{where}: an object of schemas")
                continue
            for name, sub in value.items():
                _read(sub, child_path(f"{path}.properties", str(name)), depth + 1, problems)
        elif key == "additionalProperties":
            if not isinstance(value, bool):
                _read(value, where, depth + 1, problems)
        elif key == "items":
            _read(value, where, depth + 1, problems)
        elif key in _BRANCHES:
            if not isinstance(value, list) or not value:
                problems.append(f"{where}: a non-empty list of schemas")
                continue
            for index, sub in enumerate(value):
                _read(sub, f"{where}[{index}]", depth + 1, problems)
        elif key == "required":
            if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
                problems.append(f"{where}: a list of property names")
        elif key == "enum":
            if not isinstance(value, list) or not value:
                problems.append(f"{where}: a non-empty list")
        elif key == "const":
            pass
        elif key in _COUNTS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"{where}: a count (an integer >= 0)")
        elif key in _BOUNDS:
            if not _is_number(value):
                problems.append(f"{where}: a number")
        else:
            problems.append(
                f"{where}: keyword not supported (an answer could not be checked against it)"
            )


def _is_number(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and (isinstance(value, int) or math.isfinite(value))
    )


def content_problems(schema: Mapping[str, Any], value: object) -> list[str]:
    """What in ``value`` does not match ``schema`` (a schema :func:`schema_problems`
    accepted), each with its JSON path; empty: it matches."""
    problems: list[str] = []
    _check(schema, value, "$", problems)
    return problems[:MAX_ERRORS]


def _matches(schema: Mapping[str, Any], value: object) -> bool:
    found: list[str] = []
    _check(schema, value, "$", found)
    return not found


def _check(schema: Mapping[str, Any], value: object, path: str, problems: list[str]) -> None:
    if len(problems) >= MAX_ERRORS:
        return
    kind = json_type(value)
    if "type" in schema:
        kinds = [schema["type"]] if isinstance(schema["type"], str) else schema["type"]
        integral = kind == "number" and isinstance(value, float) and value.is_integer()
        if not (
            kind in kinds
            or (kind == "integer" and "number" in kinds)
            or (integral and "integer" in kinds)
        ):
            problems.append(f"{path}: expected {' or '.join(kinds)}, got {kind}")
            return
    if "const" in schema and not json_equal(value, schema["const"]):
        problems.append(f"{path}: expected {schema['const']!r}")
    if "enum" in schema and not any(json_equal(value, c) for c in schema["enum"]):
        problems.append(f"{path}: expected one of {', '.join(map(repr, schema['enum']))}")
    if "anyOf" in schema and not any(_matches(sub, value) for sub in schema["anyOf"]):
        problems.append(f"{path}: matches none of its choices")
    if "oneOf" in schema and sum(_matches(sub, value) for sub in schema["oneOf"]) != 1:
        problems.append(f"{path}: does not match exactly one of its choices")
    if kind == "string":
        _check_count(schema, "Length", len(value), path, problems)  # type: ignore[arg-type]
    elif kind in ("integer", "number"):
        _check_bounds(schema, value, path, problems)
    elif kind == "array":
        assert isinstance(value, list | tuple)
        _check_count(schema, "Items", len(value), path, problems)
        if "items" in schema:
            for index, item in enumerate(value):
                _check(schema["items"], item, child_path(path, index), problems)
    elif kind == "object":
        assert isinstance(value, Mapping)
        _check_object(schema, value, path, problems)


def _check_count(
    schema: Mapping[str, Any], what: str, count: int, path: str, problems: list[str]
) -> None:
    low, high = schema.get(f"min{what}"), schema.get(f"max{what}")
    unit = "characters" if what == "Length" else "items"
    if low is not None and count < low:
        problems.append(f"{path}: at least {low} {unit}, got {count}")
    if high is not None and count > high:
        problems.append(f"{path}: at most {high} {unit}, got {count}")


def _check_bounds(schema: Mapping[str, Any], value: Any, path: str, problems: list[str]) -> None:
    for key, fits in _BOUND_TESTS:
        if key in schema and not fits(value, schema[key]):
            problems.append(f"{path}: {key} is {schema[key]!r}, got {value!r}")


def _check_object(
    schema: Mapping[str, Any], value: Mapping[Any, Any], path: str, problems: list[str]
) -> None:
    for name in schema.get("required", ()):
        if name not in value:
            problems.append(f"{path}: missing required property {name!r}")
    properties: Mapping[str, Any] = schema.get("properties", {})
    additional = schema.get("additionalProperties", True)
    for key, item in value.items():
        where = child_path(path, str(key))
        if key in properties:
            _check(properties[key], item, where, problems)
        elif additional is False:
            problems.append(f"{path}: unexpected property {key!r}")
        elif isinstance(additional, Mapping):
            _check(additional, item, where, problems)
