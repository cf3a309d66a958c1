"""The type compiler: a Python annotation to a JSON schema and a converter back.

:func:`compile_type` describes the values of an annotation as a JSON schema (what the
model is shown) and returns a converter that turns a JSON value valid against that
schema (checked by :func:`._validator.validate`) into the Python value the code expects:
``Enum`` members, attrs and dataclass instances, tuples, floats. Each annotation
compiles to a :class:`Compiled` pair once, when the tool or output type is defined, so
a call only walks the value.

Supported annotations: ``str``, ``int``, ``float``, ``bool``, ``None``, ``list[T]``,
``Sequence[T]``, ``tuple[T, ...]``, ``dict[str, T]``, ``Mapping[str, T]``, unions and
``Optional``, ``Literal[...]``, ``enum.Enum`` subclasses, ``Annotated[T, "description"]``,
``TypedDict`` classes, attrs classes, dataclasses, ``NewType``, ``typing.Any`` and ``object``. A
parameter without an annotation accepts any value. A class's docstring (read by
:mod:`._docstrings`) becomes its schema's description.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import functools
import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ._docstrings import parse_docstring
from ._error_text import describe_error, error_message
from ._validator import child_path, json_equal, json_type, validate

__all__ = [
    "ArgumentConversionError",
    "Compiled",
    "Unsupported",
    "compile_annotation",
    "compile_type",
    "object_schema",
    "run_converter",
    "schema_for_type",
    "to_json_value",
    "type_name",
]

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


class Unsupported(Exception):
    """An annotation the generator cannot describe (turned into a TypeError)."""


@attrs.frozen
class Compiled:
    """The schema of one annotation and how to convert a value that matches it."""

    schema: dict[str, Any]
    convert: _Converter | None = None  # None: the JSON value is used as is


def run_converter(compiled: Compiled, value: Any, path: str) -> Any:
    if compiled.convert is None:
        return value
    return compiled.convert(value, path)


# --------------------------------------------- JSON values from Python values


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


def _as_json_value(value: object) -> tuple[bool, object]:
    """Return ``(True, json_value)`` if ``value`` can be written as JSON."""
    try:
        return True, json.loads(json.dumps(value, default=_json_default, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return False, None


def _scalar_type(values: Sequence[object]) -> str | None:
    """The JSON type shared by all ``values``, or None if they differ."""
    kinds = {json_type(v) for v in values}
    if kinds == {"integer", "number"}:
        return "number"
    if len(kinds) == 1:
        kind = kinds.pop()
        if kind in ("null", "boolean", "integer", "number", "string"):
            return kind
    return None


# ---------------------------------------------------------- schema generation


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
        return compile_annotation(annotation, frozenset()).schema
    except Unsupported as exc:
        raise TypeError(f"unsupported type annotation {type_name(annotation)}: {exc}") from None


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
        compiled = compile_annotation(annotation, frozenset())
    except Unsupported as exc:
        raise TypeError(f"unsupported type annotation {type_name(annotation)}: {exc}") from None
    return compiled.schema, functools.partial(run_converter, compiled, path="$")


def to_json_value(value: object) -> tuple[bool, object]:
    """Return ``(True, json_value)`` if ``value`` can be written as JSON (attrs and
    dataclass instances as objects, ``Enum`` members as their values, tuples as arrays),
    else ``(False, None)``."""
    return _as_json_value(value)


def type_name(tp: object) -> str:
    if isinstance(tp, type):
        return tp.__qualname__
    return repr(tp).replace("typing.", "")


def compile_annotation(tp: object, seen: frozenset[object]) -> Compiled:
    if tp is inspect.Parameter.empty or tp is Any or tp is object:
        return Compiled({})
    if tp is None or tp is type(None):
        return Compiled({"type": "null"})
    if tp is bool:
        return Compiled({"type": "boolean"})
    if tp is int:
        return Compiled({"type": "integer"}, _to_int)
    if tp is float:
        return Compiled({"type": "number"}, _to_float)
    if tp is str:
        return Compiled({"type": "string"})
    supertype = getattr(tp, "__supertype__", None)  # typing.NewType
    if supertype is not None:
        return compile_annotation(supertype, seen)
    if type(tp).__name__ == "TypeAliasType":  # a Python 3.12 ``type X = ...`` alias
        return compile_annotation(tp.__value__, seen)  # type: ignore[attr-defined]

    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _compile_annotated(args, seen)
    if origin in _REQUIRED_FORMS:
        return compile_annotation(args[0], seen)
    if origin is typing.Union or origin is types.UnionType:
        return _compile_union(args, seen)
    if origin is typing.Literal:
        return _compile_literal(args)
    if tp in _SEQUENCE_ORIGINS or origin in _SEQUENCE_ORIGINS:
        return _compile_array(args[0] if args else Any, list, seen)
    if tp is tuple or origin is tuple:
        if args and (len(args) != 2 or args[1] is not Ellipsis):
            raise Unsupported("only variable-length tuples (tuple[T, ...]) are supported")
        return _compile_array(args[0] if args else Any, tuple, seen)
    if tp in _MAPPING_ORIGINS or origin in _MAPPING_ORIGINS:
        return _compile_mapping(args, seen)
    if isinstance(tp, type):
        if issubclass(tp, enum.Enum):
            return _compile_enum(tp)
        if _is_typeddict(tp) or attrs.has(tp) or dataclasses.is_dataclass(tp):
            if tp in seen:
                raise Unsupported(
                    f"{tp.__qualname__} refers to itself; recursive types are not supported"
                )
            if _is_typeddict(tp):
                return _compile_typeddict(tp, seen | {tp})
            if attrs.has(tp):
                return _compile_attrs(tp, seen | {tp})
            return _compile_dataclass(tp, seen | {tp})
    raise Unsupported(
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


def _compile_annotated(args: tuple[Any, ...], seen: frozenset[object]) -> Compiled:
    inner = compile_annotation(args[0], seen)
    descriptions = [meta for meta in args[1:] if isinstance(meta, str)]
    if not descriptions:
        return inner
    return Compiled({**inner.schema, "description": " ".join(descriptions)}, inner.convert)


def _compile_union(args: tuple[Any, ...], seen: frozenset[object]) -> Compiled:
    branches = [compile_annotation(arg, seen) for arg in args]
    if any(not branch.schema for branch in branches):  # a union with Any is Any
        return Compiled({})
    schema = {"anyOf": [branch.schema for branch in branches]}
    if all(branch.convert is None for branch in branches):
        return Compiled(schema)

    def convert(value: Any, path: str) -> Any:
        for branch in branches:
            if not validate(branch.schema, value, max_errors=1):
                return run_converter(branch, value, path)
        return value

    return Compiled(schema, convert)


def _compile_literal(args: tuple[Any, ...]) -> Compiled:
    values: list[object] = []
    for arg in args:
        if arg is not None and not isinstance(arg, str | int | float | bool):
            raise Unsupported(f"Literal values must be str, int, float, bool or None, not {arg!r}")
        values.append(arg)
    schema: dict[str, Any] = {"enum": values}
    kind = _scalar_type(values)
    if kind is not None:
        schema = {"type": kind, **schema}
    return Compiled(schema)


def _compile_enum(cls: type[enum.Enum]) -> Compiled:
    members = list(cls)
    values: list[object] = []
    for member in members:
        value = member.value
        if value is not None and not isinstance(value, str | int | float | bool):
            raise Unsupported(
                f"the values of enum {cls.__qualname__} must be str, int, float, bool or None"
            )
        values.append(value)
    schema: dict[str, Any] = {"enum": values}
    kind = _scalar_type(values)
    if kind is not None:
        schema = {"type": kind, **schema}

    def convert(value: Any, path: str) -> Any:
        for member in members:
            if json_equal(member.value, value):
                return member
        raise ArgumentConversionError([f"{path}: {value!r} is not a valid {cls.__qualname__}"])

    return Compiled(schema, convert)


def _compile_array(item_type: object, container: type[Any], seen: frozenset[object]) -> Compiled:
    item = compile_annotation(item_type, seen)
    schema: dict[str, Any] = {"type": "array"}
    if item.schema:
        schema["items"] = item.schema

    def convert(value: Any, path: str) -> Any:
        return container(
            run_converter(item, element, child_path(path, index))
            for index, element in enumerate(value)
        )

    if item.convert is None and container is list:
        return Compiled(schema)
    return Compiled(schema, convert)


def _compile_mapping(args: tuple[Any, ...], seen: frozenset[object]) -> Compiled:
    if args and args[0] is not str:
        raise Unsupported("JSON object keys are strings: use dict[str, T]")
    value_type = compile_annotation(args[1] if args else Any, seen)
    schema: dict[str, Any] = {"type": "object"}
    if value_type.schema:
        schema["additionalProperties"] = value_type.schema
    if value_type.convert is None:
        return Compiled(schema)

    def convert(value: Any, path: str) -> Any:
        return {
            key: run_converter(value_type, item, child_path(path, key))
            for key, item in value.items()
        }

    return Compiled(schema, convert)


def _class_hints(cls: type[Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:
        raise Unsupported(f"cannot resolve the type hints of {cls.__qualname__}: {exc}") from None


def _with_doc(schema: dict[str, Any], cls: type[Any]) -> dict[str, Any]:
    doc = cls.__dict__.get("__doc__")
    if isinstance(doc, str):
        description, _ = parse_docstring(doc)
        if description:
            schema["description"] = description
    return schema


def object_schema(properties: dict[str, dict[str, Any]], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _compile_typeddict(cls: type[Any], seen: frozenset[object]) -> Compiled:
    hints = _class_hints(cls)
    required_keys: frozenset[str] = getattr(cls, "__required_keys__", frozenset(hints))
    fields = {name: compile_annotation(hint, seen) for name, hint in hints.items()}
    schema = _with_doc(
        object_schema(
            {name: field.schema for name, field in fields.items()},
            [name for name in hints if name in required_keys],
        ),
        cls,
    )

    def convert(value: Any, path: str) -> Any:
        return {
            key: run_converter(fields[key], item, child_path(path, key)) if key in fields else item
            for key, item in value.items()
        }

    if all(field.convert is None for field in fields.values()):
        return Compiled(schema)
    return Compiled(schema, convert)


def _construction_error(exc: Exception) -> str:
    """What went wrong constructing a class from arguments. Its validators are user code
    and may raise anything (an ``assert`` raises ``AssertionError``; a ``__str__`` may
    raise too): every failure to build the value means the value is invalid."""
    if isinstance(exc, TypeError | ValueError):
        return error_message(exc)
    return describe_error(exc)


def _constructor(cls: type[Any], fields: Mapping[str, Compiled]) -> _Converter:
    """The converter of an attrs class or a dataclass: its fields converted, then the
    class called; a failure of its validators is an :class:`ArgumentConversionError`."""

    def convert(value: Any, path: str) -> Any:
        kwargs = {
            key: run_converter(fields[key], item, child_path(path, key))
            for key, item in value.items()
            if key in fields
        }
        try:
            return cls(**kwargs)
        except ArgumentConversionError:
            raise
        except Exception as exc:
            raise ArgumentConversionError([f"{path}: {_construction_error(exc)}"]) from exc

    return convert


def _compile_attrs(cls: type[Any], seen: frozenset[object]) -> Compiled:
    hints = _class_hints(cls)
    properties: dict[str, dict[str, Any]] = {}
    required: list[str] = []
    fields: dict[str, Compiled] = {}
    for field in attrs.fields(cls):
        if not field.init:
            continue
        name = field.alias or field.name.lstrip("_")
        compiled = compile_annotation(hints.get(field.name, field.type or Any), seen)
        schema = dict(compiled.schema)
        if field.default is attrs.NOTHING:
            required.append(name)
        elif not isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            ok, default = _as_json_value(field.default)
            if ok:
                schema["default"] = default
        properties[name] = schema
        fields[name] = compiled
    schema = _with_doc(object_schema(properties, required), cls)
    return Compiled(schema, _constructor(cls, fields))


def _compile_dataclass(cls: type[Any], seen: frozenset[object]) -> Compiled:
    """A dataclass, like an attrs class: its ``init`` fields, required unless they
    have a default (a plain default is shown in the schema, a factory is not)."""
    hints = _class_hints(cls)
    properties: dict[str, dict[str, Any]] = {}
    required: list[str] = []
    fields: dict[str, Compiled] = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        compiled = compile_annotation(hints.get(field.name, Any), seen)
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
    schema = _with_doc(object_schema(properties, required), cls)
    # A dataclass without a docstring gets a generated one ("Point(x: int, y: int)"):
    # that is no description.
    if schema.get("description", "").startswith(f"{cls.__name__}("):
        del schema["description"]
    return Compiled(schema, _constructor(cls, fields))
