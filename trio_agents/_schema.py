"""JSON schemas from Python signatures, a validator for them, and argument conversion.

A tool's parameters are described to the model as a JSON schema built from the tool
function's signature, its type hints and its docstring (:func:`function_schema`). The
arguments the model sends back are checked against that schema (:func:`validate`) and
then turned into the Python values the function expects (:meth:`FunctionSchema.convert`:
``Enum`` members, attrs instances, tuples, floats).

Supported annotations: ``str``, ``int``, ``float``, ``bool``, ``None``, ``list[T]``,
``Sequence[T]``, ``tuple[T, ...]``, ``dict[str, T]``, ``Mapping[str, T]``, unions and
``Optional``, ``Literal[...]``, ``enum.Enum`` subclasses, ``Annotated[T, "description"]``,
``TypedDict`` classes, attrs classes, dataclasses, ``NewType``, ``typing.Any`` and ``object``. A
parameter without an annotation accepts any value.

The validator understands exactly the keywords the generator produces: ``type``,
``properties``, ``required``, ``additionalProperties``, ``items``, ``enum``, ``anyOf``
(and ignores ``description`` and ``default``).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import functools
import inspect
import json
import math
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ._util import describe_error, error_message

__all__ = [
    "MAX_ERRORS",
    "ArgumentConversionError",
    "FunctionSchema",
    "compile_type",
    "function_schema",
    "parse_docstring",
    "schema_for_type",
    "to_json_value",
    "validate",
]

MAX_ERRORS = 10
"""The most errors :func:`validate` reports for one value."""

_Converter = Callable[[Any, str], Any]
"""Turns a validated JSON value into the Python value; the second argument is its path."""


class ArgumentConversionError(ValueError):
    """Validated arguments could not be turned into Python values.

    This happens when constructing a nested object fails (an attrs class whose
    validator rejects a value). ``errors`` holds one message per failure, each starting
    with the JSON path of the value, like :func:`validate`'s messages.
    """

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)


class _Unsupported(Exception):
    """An annotation the generator cannot describe (turned into a TypeError)."""


@attrs.frozen
class _Compiled:
    """The schema of one annotation and how to convert a value that matches it."""

    schema: dict[str, Any]
    convert: _Converter | None = None  # None: the JSON value is used as is


def _run_converter(compiled: _Compiled, value: Any, path: str) -> Any:
    if compiled.convert is None:
        return value
    return compiled.convert(value, path)


# ----------------------------------------------------------------------------- paths


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _child_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENTIFIER.match(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


# ------------------------------------------------------------------- JSON utilities


def _json_type(value: object) -> str:
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


def _json_equal(a: object, b: object) -> bool:
    """JSON equality: ``true`` is not ``1``, but ``1`` is ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _render(value: object, limit: int = 60) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def _json_default(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    if attrs.has(type(value)):
        return attrs.asdict(value)  # type: ignore[arg-type]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


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


def _as_json_value(value: object) -> tuple[bool, object]:
    """Return ``(True, json_value)`` if ``value`` can be written as JSON."""
    try:
        return True, json.loads(json.dumps(value, default=_json_default, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return False, None


def _scalar_type(values: Sequence[object]) -> str | None:
    """The JSON type shared by all ``values``, or None if they differ."""
    kinds = {_json_type(v) for v in values}
    if kinds == {"integer", "number"}:
        return "number"
    if len(kinds) == 1:
        kind = kinds.pop()
        if kind in ("null", "boolean", "integer", "number", "string"):
            return kind
    return None


# ------------------------------------------------------------------- the validator


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
    actual = _json_type(value)
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
                errors.append(f"{path}: expected {_describe(schema)}, got {_json_type(value)}")
            return
    expected = _types_of(schema)
    if expected is not None and not _type_matches(expected, value):
        errors.append(f"{path}: expected {' or '.join(expected)}, got {_json_type(value)}")
        return
    if "enum" in schema and not any(_json_equal(value, choice) for choice in schema["enum"]):
        choices = ", ".join(_render(choice) for choice in schema["enum"])
        errors.append(f"{path}: expected one of {choices}; got {_render(value)}")
        return
    if isinstance(value, Mapping):
        _check_object(schema, value, path, errors, max_errors)
    elif isinstance(value, list | tuple) and "items" in schema:
        for index, item in enumerate(value):
            _check(schema["items"], item, _child_path(path, index), errors, max_errors)


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
            _check(sub, item, _child_path(path, key), errors, max_errors)
        elif additional is False:
            errors.append(f"{path}: unexpected property {key!r}")
        elif isinstance(additional, Mapping):
            _check(additional, item, _child_path(path, str(key)), errors, max_errors)


# --------------------------------------------------------------- schema generation


def _is_typeddict(tp: object) -> bool:
    return isinstance(tp, type) and typing.is_typeddict(tp)


_REQUIRED_FORMS: tuple[object, ...] = tuple(
    getattr(typing, name)
    for name in ("Required", "NotRequired", "ReadOnly")
    if hasattr(typing, name)
)

_SEQUENCE_ORIGINS: tuple[object, ...] = (list, collections.abc.Sequence)
_MAPPING_ORIGINS: tuple[object, ...] = (dict, collections.abc.Mapping)


def schema_for_type(annotation: object) -> dict[str, Any]:
    """Return the JSON schema describing values of ``annotation``.

    Raises:
        TypeError: ``annotation`` is not one of the supported types.
    """
    try:
        return _compile(annotation, frozenset()).schema
    except _Unsupported as exc:
        raise TypeError(f"unsupported type annotation {_type_name(annotation)}: {exc}") from None


def compile_type(annotation: object) -> tuple[dict[str, Any], Callable[[Any], Any]]:
    """Return the JSON schema of ``annotation`` and a function that turns a JSON value
    valid against it into the Python value (attrs and dataclass instances, ``Enum``
    members, tuples, floats).

    The converter raises :class:`ArgumentConversionError` when a class refuses the
    value (its validator raised).

    Raises:
        TypeError: ``annotation`` is not one of the supported types.
    """
    try:
        compiled = _compile(annotation, frozenset())
    except _Unsupported as exc:
        raise TypeError(f"unsupported type annotation {_type_name(annotation)}: {exc}") from None
    return compiled.schema, functools.partial(_run_converter, compiled, path="$")


def to_json_value(value: object) -> tuple[bool, object]:
    """Return ``(True, json_value)`` if ``value`` can be written as JSON (attrs and
    dataclass instances as objects, ``Enum`` members as their values, tuples as arrays),
    else ``(False, None)``."""
    return _as_json_value(value)


def _type_name(tp: object) -> str:
    if isinstance(tp, type):
        return tp.__qualname__
    return repr(tp).replace("typing.", "")


def _compile(tp: object, seen: frozenset[object]) -> _Compiled:
    if tp is inspect.Parameter.empty or tp is Any or tp is object:
        return _Compiled({})
    if tp is None or tp is type(None):
        return _Compiled({"type": "null"})
    if tp is bool:
        return _Compiled({"type": "boolean"})
    if tp is int:
        return _Compiled({"type": "integer"}, _to_int)
    if tp is float:
        return _Compiled({"type": "number"}, _to_float)
    if tp is str:
        return _Compiled({"type": "string"})
    supertype = getattr(tp, "__supertype__", None)  # typing.NewType
    if supertype is not None:
        return _compile(supertype, seen)
    if type(tp).__name__ == "TypeAliasType":  # a Python 3.12 ``type X = ...`` alias
        return _compile(tp.__value__, seen)  # type: ignore[attr-defined]

    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _compile_annotated(args, seen)
    if origin in _REQUIRED_FORMS:
        return _compile(args[0], seen)
    if origin is typing.Union or origin is types.UnionType:
        return _compile_union(args, seen)
    if origin is typing.Literal:
        return _compile_literal(args)
    if tp in _SEQUENCE_ORIGINS or origin in _SEQUENCE_ORIGINS:
        return _compile_array(args[0] if args else Any, list, seen)
    if tp is tuple or origin is tuple:
        if args and (len(args) != 2 or args[1] is not Ellipsis):
            raise _Unsupported("only variable-length tuples (tuple[T, ...]) are supported")
        return _compile_array(args[0] if args else Any, tuple, seen)
    if tp in _MAPPING_ORIGINS or origin in _MAPPING_ORIGINS:
        return _compile_mapping(args, seen)
    if isinstance(tp, type):
        if issubclass(tp, enum.Enum):
            return _compile_enum(tp)
        if _is_typeddict(tp) or attrs.has(tp) or dataclasses.is_dataclass(tp):
            if tp in seen:
                raise _Unsupported(
                    f"{tp.__qualname__} refers to itself; recursive types are not supported"
                )
            if _is_typeddict(tp):
                return _compile_typeddict(tp, seen | {tp})
            if attrs.has(tp):
                return _compile_attrs(tp, seen | {tp})
            return _compile_dataclass(tp, seen | {tp})
    raise _Unsupported(
        "use str, int, float, bool, None, list, tuple[T, ...], dict[str, T], a union,"
        " Literal, an Enum, a TypedDict, an attrs class, a dataclass or Any"
    )


def _to_int(value: Any, path: str) -> Any:
    return int(value) if isinstance(value, float) else value


def _to_float(value: Any, path: str) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # a JSON integer of 309 digits or more
            raise ArgumentConversionError(
                [f"{path}: the number is too large for a float"]
            ) from None
    return value


def _compile_annotated(args: tuple[Any, ...], seen: frozenset[object]) -> _Compiled:
    inner = _compile(args[0], seen)
    descriptions = [meta for meta in args[1:] if isinstance(meta, str)]
    if not descriptions:
        return inner
    return _Compiled({**inner.schema, "description": " ".join(descriptions)}, inner.convert)


def _compile_union(args: tuple[Any, ...], seen: frozenset[object]) -> _Compiled:
    branches = [_compile(arg, seen) for arg in args]
    if any(not branch.schema for branch in branches):  # a union with Any is Any
        return _Compiled({})
    schema = {"anyOf": [branch.schema for branch in branches]}
    if all(branch.convert is None for branch in branches):
        return _Compiled(schema)

    def convert(value: Any, path: str) -> Any:
        for branch in branches:
            if not validate(branch.schema, value, max_errors=1):
                return _run_converter(branch, value, path)
        return value

    return _Compiled(schema, convert)


def _compile_literal(args: tuple[Any, ...]) -> _Compiled:
    values: list[object] = []
    for arg in args:
        if arg is not None and not isinstance(arg, str | int | float | bool):
            raise _Unsupported(f"Literal values must be str, int, float, bool or None, not {arg!r}")
        values.append(arg)
    schema: dict[str, Any] = {"enum": values}
    kind = _scalar_type(values)
    if kind is not None:
        schema = {"type": kind, **schema}
    return _Compiled(schema)


def _compile_enum(cls: type[enum.Enum]) -> _Compiled:
    members = list(cls)
    values: list[object] = []
    for member in members:
        value = member.value
        if value is not None and not isinstance(value, str | int | float | bool):
            raise _Unsupported(
                f"the values of enum {cls.__qualname__} must be str, int, float, bool or None"
            )
        values.append(value)
    schema: dict[str, Any] = {"enum": values}
    kind = _scalar_type(values)
    if kind is not None:
        schema = {"type": kind, **schema}

    def convert(value: Any, path: str) -> Any:
        for member in members:
            if _json_equal(member.value, value):
                return member
        raise ArgumentConversionError([f"{path}: {value!r} is not a valid {cls.__qualname__}"])

    return _Compiled(schema, convert)


def _compile_array(item_type: object, container: type[Any], seen: frozenset[object]) -> _Compiled:
    item = _compile(item_type, seen)
    schema: dict[str, Any] = {"type": "array"}
    if item.schema:
        schema["items"] = item.schema

    def convert(value: Any, path: str) -> Any:
        return container(
            _run_converter(item, element, _child_path(path, index))
            for index, element in enumerate(value)
        )

    if item.convert is None and container is list:
        return _Compiled(schema)
    return _Compiled(schema, convert)


def _compile_mapping(args: tuple[Any, ...], seen: frozenset[object]) -> _Compiled:
    if args and args[0] is not str:
        raise _Unsupported("JSON object keys are strings: use dict[str, T]")
    value_type = _compile(args[1] if args else Any, seen)
    schema: dict[str, Any] = {"type": "object"}
    if value_type.schema:
        schema["additionalProperties"] = value_type.schema
    if value_type.convert is None:
        return _Compiled(schema)

    def convert(value: Any, path: str) -> Any:
        return {
            key: _run_converter(value_type, item, _child_path(path, key))
            for key, item in value.items()
        }

    return _Compiled(schema, convert)


def _class_hints(cls: type[Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:
        raise _Unsupported(f"cannot resolve the type hints of {cls.__qualname__}: {exc}") from None


def _with_doc(schema: dict[str, Any], cls: type[Any]) -> dict[str, Any]:
    doc = cls.__dict__.get("__doc__")
    if isinstance(doc, str):
        description, _ = parse_docstring(doc)
        if description:
            schema["description"] = description
    return schema


def _object_schema(properties: dict[str, dict[str, Any]], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _compile_typeddict(cls: type[Any], seen: frozenset[object]) -> _Compiled:
    hints = _class_hints(cls)
    required_keys: frozenset[str] = getattr(cls, "__required_keys__", frozenset(hints))
    fields = {name: _compile(hint, seen) for name, hint in hints.items()}
    schema = _with_doc(
        _object_schema(
            {name: field.schema for name, field in fields.items()},
            [name for name in hints if name in required_keys],
        ),
        cls,
    )

    def convert(value: Any, path: str) -> Any:
        return {
            key: _run_converter(fields[key], item, _child_path(path, key))
            if key in fields
            else item
            for key, item in value.items()
        }

    if all(field.convert is None for field in fields.values()):
        return _Compiled(schema)
    return _Compiled(schema, convert)


def _construction_error(exc: Exception) -> str:
    """What went wrong constructing a class from arguments. Its validators are user code
    and may raise anything (an ``assert`` raises ``AssertionError``; a ``__str__`` may
    raise too): every failure to build the value means the value is invalid."""
    if isinstance(exc, TypeError | ValueError):
        return error_message(exc)
    return describe_error(exc)


def _compile_attrs(cls: type[Any], seen: frozenset[object]) -> _Compiled:
    hints = _class_hints(cls)
    properties: dict[str, dict[str, Any]] = {}
    required: list[str] = []
    fields: dict[str, _Compiled] = {}
    for field in attrs.fields(cls):
        if not field.init:
            continue
        name = field.alias or field.name.lstrip("_")
        compiled = _compile(hints.get(field.name, field.type or Any), seen)
        schema = dict(compiled.schema)
        if field.default is attrs.NOTHING:
            required.append(name)
        elif not isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            ok, default = _as_json_value(field.default)
            if ok:
                schema["default"] = default
        properties[name] = schema
        fields[name] = compiled
    schema = _with_doc(_object_schema(properties, required), cls)

    def convert(value: Any, path: str) -> Any:
        kwargs = {
            key: _run_converter(fields[key], item, _child_path(path, key))
            for key, item in value.items()
            if key in fields
        }
        try:
            return cls(**kwargs)
        except ArgumentConversionError:
            raise
        except Exception as exc:
            raise ArgumentConversionError([f"{path}: {_construction_error(exc)}"]) from exc

    return _Compiled(schema, convert)


def _compile_dataclass(cls: type[Any], seen: frozenset[object]) -> _Compiled:
    """A dataclass, like an attrs class: its ``init`` fields, required unless they
    have a default (a plain default is shown in the schema, a factory is not)."""
    hints = _class_hints(cls)
    properties: dict[str, dict[str, Any]] = {}
    required: list[str] = []
    fields: dict[str, _Compiled] = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        compiled = _compile(hints.get(field.name, Any), seen)
        schema = dict(compiled.schema)
        if field.default is dataclasses.MISSING:
            if field.default_factory is dataclasses.MISSING:
                required.append(field.name)
        else:
            ok, default = _as_json_value(field.default)
            if ok:
                schema["default"] = default
        properties[field.name] = schema
        fields[field.name] = compiled
    schema = _with_doc(_object_schema(properties, required), cls)
    # A dataclass without a docstring gets a generated one ("Point(x: int, y: int)"):
    # that is no description.
    if schema.get("description", "").startswith(f"{cls.__name__}("):
        del schema["description"]

    def convert(value: Any, path: str) -> Any:
        kwargs = {
            key: _run_converter(fields[key], item, _child_path(path, key))
            for key, item in value.items()
            if key in fields
        }
        try:
            return cls(**kwargs)
        except ArgumentConversionError:
            raise
        except Exception as exc:
            raise ArgumentConversionError([f"{path}: {_construction_error(exc)}"]) from exc

    return _Compiled(schema, convert)


# ------------------------------------------------------------------------ docstrings


_SECTION_NAMES = frozenset(
    {
        "args",
        "arguments",
        "attributes",
        "example",
        "examples",
        "keyword args",
        "keyword arguments",
        "note",
        "notes",
        "other parameters",
        "parameters",
        "params",
        "raises",
        "return",
        "returns",
        "see also",
        "todo",
        "warning",
        "warnings",
        "yield",
        "yields",
    }
)
_ARGS_SECTIONS = frozenset(
    {"args", "arguments", "keyword args", "keyword arguments", "parameters", "params"}
)
_SECTION_HEADER = re.compile(r"^\s*([A-Za-z][A-Za-z ]*?)\s*:\s*$")
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:(?:\s+(.*)|$)")
_REST_PARAM = re.compile(
    r"^:(?:param|parameter|arg|argument|key|keyword)\s+(?:[^:]*?\s)?\*{0,2}(\w+)\s*:(.*)$"
)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _section(line: str) -> str | None:
    match = _SECTION_HEADER.match(line)
    if match and match.group(1).lower() in _SECTION_NAMES:
        return match.group(1).lower()
    return None


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into a description and per-parameter descriptions.

    The description is the first paragraph, its lines joined by spaces. Parameter
    descriptions come from a Google-style ``Args:`` section (``name: text``, with
    more-indented continuation lines; ``name (type): text`` works too) and from reST
    fields (``:param name: text`` or ``:param type name: text``).
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    if lines and _section(lines[0]) is not None:
        # cleandoc dedents everything after the first line: re-indent a section that
        # starts on the first line ("Args:" right after the quotes)
        lines[1:] = ["    " + line if line.strip() else line for line in lines[1:]]
    summary: list[str] = []
    for line in lines:
        stripped = line.strip()
        if not stripped or _section(line) is not None or stripped.startswith(":"):
            break
        summary.append(stripped)
    params: dict[str, str] = {}
    _parse_google(lines, params)
    _parse_rest(lines, params)
    return " ".join(summary), {name: " ".join(text.split()) for name, text in params.items()}


def _next_nonblank(lines: Sequence[str], start: int) -> int | None:
    for index in range(start, len(lines)):
        if lines[index].strip():
            return index
    return None


def _parse_google(lines: Sequence[str], params: dict[str, str]) -> None:
    index = 0
    while index < len(lines):
        section = _section(lines[index])
        header_indent = _indent(lines[index])
        index += 1
        if section not in _ARGS_SECTIONS:
            continue
        entry_indent: int | None = None
        current: str | None = None
        while index < len(lines):
            line = lines[index]
            if not line.strip():
                following = _next_nonblank(lines, index)
                if following is None or _indent(lines[following]) <= header_indent:
                    break
                index += 1
                continue
            indent = _indent(line)
            if indent <= header_indent or _section(line) is not None:
                break
            if entry_indent is None:
                entry_indent = indent
            if indent <= entry_indent:
                match = _GOOGLE_ENTRY.match(line.strip())
                current = None
                if match:
                    current = match.group(1)
                    params[current] = match.group(2) or ""
            elif current is not None:
                params[current] += " " + line.strip()
            index += 1


def _parse_rest(lines: Sequence[str], params: dict[str, str]) -> None:
    current: str | None = None
    field_indent = 0
    for line in lines:
        stripped = line.strip()
        match = _REST_PARAM.match(stripped)
        if match:
            current = match.group(1)
            field_indent = _indent(line)
            params[current] = match.group(2)
        elif current is not None and stripped and _indent(line) > field_indent:
            params[current] += " " + stripped
        else:
            current = None


# ------------------------------------------------------------------------ functions


@attrs.frozen
class _Parameter:
    name: str
    compiled: _Compiled


@attrs.frozen
class FunctionSchema:
    """What :func:`function_schema` learned about a function.

    Attributes:
        description: the first paragraph of the docstring ("" without one).
        parameters: the JSON schema of the arguments object.
        takes_context: whether the first parameter is the context, which is passed
            positionally and is not part of the schema.
    """

    description: str
    parameters: dict[str, Any]
    takes_context: bool
    _params: tuple[_Parameter, ...] = attrs.field(repr=False)

    def validate(self, arguments: object) -> list[str]:
        """Return the problems of ``arguments`` (the decoded JSON object), if any."""
        return validate(self.parameters, arguments)

    def convert(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Turn validated ``arguments`` into the keyword arguments of the call.

        Raises:
            ArgumentConversionError: a nested object could not be constructed.
        """
        kwargs: dict[str, Any] = {}
        errors: list[str] = []
        for param in self._params:
            if param.name not in arguments:
                continue
            try:
                kwargs[param.name] = _run_converter(
                    param.compiled, arguments[param.name], _child_path("$", param.name)
                )
            except ArgumentConversionError as exc:
                errors.extend(exc.errors)
        if errors:
            raise ArgumentConversionError(errors[:MAX_ERRORS])
        return kwargs


def _function_name(fn: Callable[..., Any]) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__qualname__


def _globals_of(fn: object) -> dict[str, Any]:
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = inspect.unwrap(fn)  # type: ignore[arg-type]
    namespace = getattr(fn, "__globals__", None)
    if namespace is None and callable(fn):
        namespace = getattr(type(fn).__call__, "__globals__", None)
    return namespace if isinstance(namespace, dict) else {}


class _Holder:
    """Something ``typing.get_type_hints`` can read one annotation from."""

    def __init__(self, name: str, annotation: object) -> None:
        self.__annotations__ = {name: annotation}


def _resolve(
    name: str,
    annotation: object,
    globalns: dict[str, Any],
    localns: Mapping[str, Any] | None,
) -> object:
    """Evaluate one (possibly string) annotation, falling back on ``localns``."""
    holder = _Holder(name, annotation)
    try:
        return typing.get_type_hints(holder, globalns=globalns, include_extras=True)[name]
    except NameError:
        if localns is None:
            raise
        return typing.get_type_hints(
            holder, globalns=globalns, localns=dict(localns), include_extras=True
        )[name]


def function_schema(
    fn: Callable[..., Any],
    *,
    context_type: type[Any] | None = None,
    localns: Mapping[str, Any] | None = None,
) -> FunctionSchema:
    """Build the :class:`FunctionSchema` of ``fn`` from its signature and docstring.

    A first parameter named ``ctx``, or annotated with ``context_type``, is the context:
    it is left out of the schema. Parameters with defaults are optional and carry their
    default (when it is JSON-serialisable); the others are required. String
    annotations are evaluated in ``fn``'s module, then in ``localns`` (for types
    defined inside a function).

    Raises:
        TypeError: a parameter has an unsupported annotation, is ``*args``,
            ``**kwargs`` or positional-only, or an annotation cannot be evaluated.
    """
    fn_name = _function_name(fn)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot read the signature of {fn_name}: {exc}") from None
    globalns = _globals_of(fn)
    description, param_docs = parse_docstring(inspect.getdoc(fn))

    takes_context = False
    properties: dict[str, dict[str, Any]] = {}
    required: list[str] = []
    params: list[_Parameter] = []
    for position, param in enumerate(signature.parameters.values()):
        where = f"parameter {param.name!r} of {fn_name}"
        try:
            annotation = _resolve(param.name, param.annotation, globalns, localns)
            resolve_error: Exception | None = None
        except Exception as exc:
            annotation, resolve_error = None, exc
        is_context = context_type is not None and annotation is context_type
        if position == 0 and (param.name == "ctx" or is_context):
            if param.kind is inspect.Parameter.VAR_POSITIONAL or param.kind is (
                inspect.Parameter.VAR_KEYWORD
            ):
                raise TypeError(f"{where}: the context parameter cannot be *args or **kwargs")
            takes_context = True
            continue
        if is_context:
            raise TypeError(f"{where}: the context must be the first parameter")
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            raise TypeError(f"{where}: tools cannot take *{param.name}")
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            raise TypeError(f"{where}: tools cannot take **{param.name}")
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise TypeError(f"{where}: tools cannot take positional-only parameters")
        if resolve_error is not None:
            raise TypeError(
                f"{where}: cannot evaluate the annotation {param.annotation!r}: {resolve_error}"
            )
        try:
            compiled = _compile(annotation, frozenset())
        except _Unsupported as exc:
            raise TypeError(
                f"{where} has an unsupported type annotation {_type_name(annotation)}: {exc}"
            ) from None
        schema = dict(compiled.schema)
        if "description" not in schema and param.name in param_docs:
            schema["description"] = param_docs[param.name]
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
        else:
            ok, default = _as_json_value(param.default)
            if ok:
                schema["default"] = default
        properties[param.name] = schema
        params.append(_Parameter(param.name, compiled))
    return FunctionSchema(
        description=description,
        parameters=_object_schema(properties, required),
        takes_context=takes_context,
        params=tuple(params),
    )
