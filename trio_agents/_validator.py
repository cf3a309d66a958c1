"""What a JSON value is, and the JSON-schema validator tool arguments and answers meet.

The arguments a model sends for a tool (and a structured final answer) are checked
against the schema :mod:`._typeschema` built for them before anything is converted:
:func:`validate` reports every problem (up to :data:`MAX_ERRORS`) with the JSON path of
the offending value, so the model can be told exactly what to fix. :func:`loads_json`
decodes what the model sent, refusing what only Python's ``json`` accepts.

The validator understands exactly the keywords :mod:`._typeschema` produces: ``type``,
``properties``, ``required``, ``additionalProperties``, ``items``, ``enum``, ``anyOf``
(and ignores ``description`` and ``default``). Why it is our own rather than
``jsonschema``: docs/output.md (faster on that subset, and it agrees with the reference
there, checked by tests/test_schema_differential.py).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "MAX_ERRORS",
    "child_path",
    "json_equal",
    "json_type",
    "loads_json",
    "validate",
]

MAX_ERRORS = 10
"""The most errors :func:`validate` reports for one value."""


# ---------------------------------------------------------------------- paths


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def child_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENTIFIER.match(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


# ---------------------------------------------------------------- JSON values


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        # NaN and the infinities are no JSON numbers (json.dumps(allow_nan=False) and
        # every strict parser refuse them): a value holding one is invalid.
        return "number" if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def json_equal(a: object, b: object) -> bool:
    """JSON equality: ``true`` is not ``1``, but ``1`` is ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _render(value: object, limit: int = 60) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: valid JSON that no float holds
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def loads_json(text: str | bytes | bytearray) -> Any:
    """``json.loads`` for what a model sends (tool arguments, final answers): it also
    refuses ``NaN`` / ``Infinity`` (Python's extension, not JSON) and numbers too large
    for a float (``1e400``, which would become ``inf``).

    Raises:
        ValueError: not JSON (``RecursionError``: nested too deeply to decode).
    """
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


# -------------------------------------------------------------- the validator


def validate(
    schema: Mapping[str, Any], value: object, *, max_errors: int = MAX_ERRORS
) -> list[str]:
    """Check ``value`` against ``schema`` and return the problems, at most ``max_errors``.

    Each message starts with the JSON path of the offending value, for example
    ``"$.b: expected integer, got string"`` or ``"$: missing required property 'a'"``.
    An empty list means the value is valid. ``true``/``false`` are never integers or
    numbers; a number with an integral value (``2.0``) is an integer.
    """
    errors: list[str] = []
    _check(schema, value, "$", errors, max_errors)
    return errors[:max_errors]


def _types_of(schema: Mapping[str, Any]) -> list[str] | None:
    kind = schema.get("type")
    if kind is None:
        return None
    return [kind] if isinstance(kind, str) else list(kind)


def _type_matches(expected: Sequence[str], value: object) -> bool:
    actual = json_type(value)
    if actual in expected:
        return True
    if actual == "integer" and "number" in expected:
        return True
    return (
        actual == "number"
        and "integer" in expected
        and isinstance(value, float)
        and value.is_integer()
    )


def _admits(schema: Mapping[str, Any], value: object) -> bool:
    """Whether ``schema``'s type (if any) fits ``value``: the branch the value meant."""
    if "anyOf" in schema:
        return any(_admits(branch, value) for branch in schema["anyOf"])
    expected = _types_of(schema)
    return expected is None or _type_matches(expected, value)


def _describe(schema: Mapping[str, Any]) -> str:
    if "anyOf" in schema:
        return " or ".join(_describe(branch) for branch in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(_render(v) for v in schema["enum"])
    expected = _types_of(schema)
    if expected is None:
        return "any value"
    return " or ".join(expected)


def _check(
    schema: Mapping[str, Any], value: object, path: str, errors: list[str], max_errors: int
) -> None:
    if len(errors) >= max_errors:
        return
    if "anyOf" in schema:
        failures: list[tuple[Mapping[str, Any], list[str]]] = []
        for branch in schema["anyOf"]:
            branch_errors: list[str] = []
            _check(branch, value, path, branch_errors, max_errors)
            if not branch_errors:
                break
            failures.append((branch, branch_errors))
        else:
            candidates = [errs for branch, errs in failures if _admits(branch, value)]
            if len(candidates) == 1:
                errors.extend(candidates[0])
            else:
                errors.append(f"{path}: expected {_describe(schema)}, got {json_type(value)}")
            return
    expected = _types_of(schema)
    if expected is not None and not _type_matches(expected, value):
        errors.append(f"{path}: expected {' or '.join(expected)}, got {json_type(value)}")
        return
    if "enum" in schema and not any(json_equal(value, choice) for choice in schema["enum"]):
        choices = ", ".join(_render(choice) for choice in schema["enum"])
        errors.append(f"{path}: expected one of {choices}; got {_render(value)}")
        return
    if isinstance(value, Mapping):
        _check_object(schema, value, path, errors, max_errors)
    elif isinstance(value, list | tuple) and "items" in schema:
        for index, item in enumerate(value):
            _check(schema["items"], item, child_path(path, index), errors, max_errors)


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _check_object(
    schema: Mapping[str, Any],
    value: Mapping[Any, Any],
    path: str,
    errors: list[str],
    max_errors: int,
) -> None:
    for name in schema.get("required", ()):
        if name not in value:
            errors.append(f"{path}: missing required property {name!r}")
    properties: Mapping[str, Any] = schema.get("properties", {})
    additional = schema.get("additionalProperties", True)
    for key, item in value.items():
        if len(errors) >= max_errors:
            return
        if key in properties:
            sub = properties[key]
            if type(item) in _SCALARS and "anyOf" not in sub and "enum" not in sub:
                # A scalar against a plain typed schema (most tool arguments): the type
                # check is all of _check, and the path is only needed for an error.
                expected = _types_of(sub)
                if expected is None or _type_matches(expected, item):
                    continue
            _check(sub, item, child_path(path, key), errors, max_errors)
        elif additional is False:
            errors.append(f"{path}: unexpected property {key!r}")
        elif isinstance(additional, Mapping):
            _check(additional, item, child_path(path, str(key)), errors, max_errors)
