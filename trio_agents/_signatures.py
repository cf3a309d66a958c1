"""A tool function's schema: its signature, type hints and docstring put together.

A tool's parameters are described to the model as a JSON schema built from the tool
function's signature, its type hints (:mod:`._typeschema`) and its docstring
(:mod:`._docstrings`): :func:`function_schema`. The arguments the model sends back are
checked against that schema (:meth:`FunctionSchema.validate`) and then turned into the
Python values the function expects (:meth:`FunctionSchema.convert`).
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ._docstrings import parse_docstring
from ._typeschema import (
    ArgumentConversionError,
    Compiled,
    Unsupported,
    compile_annotation,
    object_schema,
    run_converter,
    to_json_value,
    type_name,
)
from ._validator import MAX_ERRORS, child_path, validate

__all__ = ["FunctionSchema", "function_schema"]


@attrs.frozen
class _Parameter:
    name: str
    compiled: Compiled


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
                kwargs[param.name] = run_converter(
                    param.compiled, arguments[param.name], child_path("$", param.name)
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
            compiled = compile_annotation(annotation, frozenset())
        except Unsupported as exc:
            raise TypeError(
                f"{where} has an unsupported type annotation {type_name(annotation)}: {exc}"
            ) from None
        schema = dict(compiled.schema)
        if "description" not in schema and param.name in param_docs:
            schema["description"] = param_docs[param.name]
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
        else:
            ok, default = to_json_value(param.default)
            if ok:
                schema["default"] = default
        properties[param.name] = schema
        params.append(_Parameter(param.name, compiled))
    return FunctionSchema(
        description=description,
        parameters=object_schema(properties, required),
        takes_context=takes_context,
        params=tuple(params),
    )
