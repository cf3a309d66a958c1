"""JSON schemas from type hints, docstring parsing, the validator and conversion.

This module deliberately does not use ``from __future__ import annotations``: the
annotations here are real objects (test_tools.py covers string annotations).
"""

import dataclasses
import enum
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, NewType, NotRequired, Optional, Required, TypedDict

import attrs
import pytest

from trio_agents._docstrings import parse_docstring
from trio_agents._signatures import function_schema
from trio_agents._typeschema import (
    ArgumentConversionError,
    compile_type,
    schema_for_type,
    to_json_value,
)
from trio_agents._validator import MAX_ERRORS, validate


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mixed(enum.Enum):
    ONE = 1
    NAME = "name"


class Movie(TypedDict):
    """A movie."""

    title: str
    year: int


class Filters(TypedDict, total=False):
    genre: Required[str]
    rating: float
    color: Color


class Partial(TypedDict):
    name: str
    note: NotRequired[str]


@attrs.define
class Point:
    x: float
    y: float = 0.0


@attrs.frozen
class Shape:
    """A shape made of points.

    More detail that is not part of the description.
    """

    name: str
    points: list[Point] = attrs.field(factory=list)
    color: Color = Color.RED
    _secret: int = 0
    area: float = attrs.field(init=False, default=0.0)


@attrs.define
class Positive:
    value: int = attrs.field(validator=attrs.validators.gt(0))


@attrs.define
class Node:
    name: str
    children: "list[Node]"


class Arbitrary:
    pass


UserId = NewType("UserId", int)


def obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


# ------------------------------------------------------------------ single types


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (None, {"type": "null"}),
        (type(None), {"type": "null"}),
        (Any, {}),
        (object, {}),
        (UserId, {"type": "integer"}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (typing.List[str], {"type": "array", "items": {"type": "string"}}),  # noqa: UP006
        (Sequence[bool], {"type": "array", "items": {"type": "boolean"}}),
        (list, {"type": "array"}),
        (list[Any], {"type": "array"}),
        (tuple[int, ...], {"type": "array", "items": {"type": "integer"}}),
        (tuple, {"type": "array"}),
        (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),
        (Mapping[str, str], {"type": "object", "additionalProperties": {"type": "string"}}),
        (dict, {"type": "object"}),
        (dict[str, Any], {"type": "object"}),
        (Optional[int], {"anyOf": [{"type": "integer"}, {"type": "null"}]}),  # noqa: UP045
        (int | None, {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
        (int | str, {"anyOf": [{"type": "integer"}, {"type": "string"}]}),
        (int | Any, {}),
        (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
        (Literal[1, 2], {"type": "integer", "enum": [1, 2]}),
        (Literal[1, 2.5], {"type": "number", "enum": [1, 2.5]}),
        (Literal[True], {"type": "boolean", "enum": [True]}),
        (Literal[1, "a", None], {"enum": [1, "a", None]}),
        (Color, {"type": "string", "enum": ["red", "green"]}),
        (Level, {"type": "integer", "enum": [1, 2]}),
        (Mixed, {"enum": [1, "name"]}),
        (Annotated[int, "how many"], {"type": "integer", "description": "how many"}),
        (Annotated[str, 42, "a", "b"], {"type": "string", "description": "a b"}),
        (Annotated[int, 42], {"type": "integer"}),
        (
            Annotated[list[Annotated[int, "one"]], "many"],
            {
                "type": "array",
                "items": {"type": "integer", "description": "one"},
                "description": "many",
            },
        ),
        (
            list[int | None],
            {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "null"}]}},
        ),
        (
            dict[str, list[Color]],
            {
                "type": "object",
                "additionalProperties": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["red", "green"]},
                },
            },
        ),
    ],
)
def test_schema_for_type(annotation: Any, expected: dict[str, Any]) -> None:
    assert schema_for_type(annotation) == expected


def test_typeddict_schema() -> None:
    assert schema_for_type(Movie) == {
        **obj({"title": {"type": "string"}, "year": {"type": "integer"}}, ["title", "year"]),
        "description": "A movie.",
    }
    assert schema_for_type(Filters) == obj(
        {
            "genre": {"type": "string"},
            "rating": {"type": "number"},
            "color": {"type": "string", "enum": ["red", "green"]},
        },
        ["genre"],
    )
    assert schema_for_type(Partial) == obj(
        {"name": {"type": "string"}, "note": {"type": "string"}}, ["name"]
    )


def test_attrs_schema() -> None:
    point = obj({"x": {"type": "number"}, "y": {"type": "number", "default": 0.0}}, ["x"])
    assert schema_for_type(Point) == point
    assert schema_for_type(Shape) == {
        **obj(
            {
                "name": {"type": "string"},
                "points": {"type": "array", "items": point},
                "color": {"type": "string", "enum": ["red", "green"], "default": "red"},
                "secret": {"type": "integer", "default": 0},
            },
            ["name"],
        ),
        "description": "A shape made of points.",
    }


@dataclasses.dataclass
class Line:
    """A line between two points."""

    start: Point
    end: Point
    color: Color = Color.RED
    labels: list[str] = dataclasses.field(default_factory=list)
    cache: int = dataclasses.field(default=0, init=False)


@dataclasses.dataclass
class Bare:
    n: int


def test_dataclass_schema_and_conversion() -> None:
    point = obj({"x": {"type": "number"}, "y": {"type": "number", "default": 0.0}}, ["x"])
    assert schema_for_type(Line) == {
        **obj(
            {
                "start": point,
                "end": point,
                "color": {"type": "string", "enum": ["red", "green"], "default": "red"},
                "labels": {"type": "array", "items": {"type": "string"}},
            },
            ["start", "end"],
        ),
        "description": "A line between two points.",
    }
    # The docstring dataclasses generate ("Bare(n: int)") is no description.
    assert schema_for_type(Bare) == obj({"n": {"type": "integer"}}, ["n"])
    schema, convert = compile_type(Line)
    value = {"start": {"x": 1}, "end": {"x": 2, "y": 3}, "color": "green"}
    assert validate(schema, value) == []
    line = convert(value)
    assert line == Line(Point(1.0), Point(2.0, 3.0), Color.GREEN)
    assert to_json_value(line) == (
        True,
        {
            "start": {"x": 1.0, "y": 0.0},
            "end": {"x": 2.0, "y": 3.0},
            "color": "green",
            "labels": [],
            "cache": 0,
        },
    )


def test_dataclass_tool_parameters() -> None:
    def draw(line: Line) -> None:
        """Draw a line."""

    fs = function_schema(draw)
    assert fs.convert({"line": {"start": {"x": 0}, "end": {"x": 1}}}) == {
        "line": Line(Point(0.0), Point(1.0))
    }


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        (Arbitrary, "Arbitrary"),
        (bytes, "bytes"),
        (tuple[int, str], "tuple[T, ...]"),
        (dict[int, str], "dict[str, T]"),
        (list[Arbitrary], "Arbitrary"),
        (Node, "recursive"),
        (Literal[b"x"], "Literal values"),
    ],
)
def test_unsupported_types(annotation: Any, message: str) -> None:
    with pytest.raises(TypeError, match="unsupported type annotation") as info:
        schema_for_type(annotation)
    assert message in str(info.value)


# ----------------------------------------------------------------- functions


def test_function_schema_required_and_defaults() -> None:
    def search(
        query: str,
        limit: int = 10,
        tags: list[str] | None = None,
        color: Color = Color.GREEN,
        when: Arbitrary | None = None,  # not supported, see below
    ) -> None:
        pass

    with pytest.raises(TypeError, match=r"parameter 'when' of .*search.* unsupported"):
        function_schema(search)

    def find(
        query: str,
        limit: int = 10,
        tags: list[str] | None = None,
        color: Color = Color.GREEN,
        shape: tuple[int, ...] = (1, 2),
        sentinel: Any = Arbitrary(),  # noqa: B008 - a default that is not JSON
        *,
        exact: bool = False,
    ) -> None:
        pass

    schema = function_schema(find)
    assert schema.parameters == obj(
        {
            "query": {"type": "string"},
            "limit": {"type": "integer", "default": 10},
            "tags": {
                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                "default": None,
            },
            "color": {"type": "string", "enum": ["red", "green"], "default": "green"},
            "shape": {"type": "array", "items": {"type": "integer"}, "default": [1, 2]},
            "sentinel": {},
            "exact": {"type": "boolean", "default": False},
        },
        ["query"],
    )
    assert schema.description == ""
    assert not schema.takes_context


def test_function_schema_no_parameters_and_no_annotations() -> None:
    def nothing() -> None:
        pass

    def untyped(a, b=1):  # type: ignore[no-untyped-def]
        pass

    assert function_schema(nothing).parameters == obj({}, [])
    assert function_schema(untyped).parameters == obj({"a": {}, "b": {"default": 1}}, ["a"])


def test_function_schema_descriptions() -> None:
    def add(a: int, b: Annotated[int, "the second (annotated wins)"], c: int = 0) -> int:
        """Add numbers.

        Adds them, really.

        Args:
            a: the first number,
                on two lines.
            b: ignored, Annotated wins.
            c (int): the third.

        Returns:
            the sum.
        """
        return a + b + c

    schema = function_schema(add)
    assert schema.description == "Add numbers."
    assert schema.parameters == obj(
        {
            "a": {"type": "integer", "description": "the first number, on two lines."},
            "b": {"type": "integer", "description": "the second (annotated wins)"},
            "c": {"type": "integer", "description": "the third.", "default": 0},
        },
        ["a", "b"],
    )


class Context:
    pass


def test_function_schema_context_parameter() -> None:
    def by_name(ctx, x: int) -> None:  # type: ignore[no-untyped-def]
        pass

    def by_type(context: Context, x: int) -> None:
        pass

    def misplaced(x: int, context: Context) -> None:
        pass

    for fn in (by_name, by_type):
        schema = function_schema(fn, context_type=Context)
        assert schema.takes_context
        assert schema.parameters == obj({"x": {"type": "integer"}}, ["x"])
    with pytest.raises(TypeError, match="the context must be the first parameter"):
        function_schema(misplaced, context_type=Context)
    # without a context type, only the name counts
    with pytest.raises(TypeError, match="parameter 'context'"):
        function_schema(by_type)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(*args: int) -> None: pass", r"parameter 'args' of f: tools cannot take \*args"),
        ("def f(**kw: int) -> None: pass", r"parameter 'kw' of f: tools cannot take \*\*kw"),
        ("def f(a: int, /) -> None: pass", "parameter 'a' of f: tools cannot take positional-only"),
        ("def f(a: 'Missing') -> None: pass", "parameter 'a' of f: cannot evaluate"),
        ("def f(a: Arbitrary) -> None: pass", "parameter 'a' of f has an unsupported type"),
    ],
)
def test_function_schema_rejects(source: str, message: str) -> None:
    namespace: dict[str, Any] = {"Arbitrary": Arbitrary}
    exec(source, namespace)
    with pytest.raises(TypeError, match=message):
        function_schema(namespace["f"])


def test_string_annotations_resolve_in_module_then_locals() -> None:
    class LocalThing(TypedDict):
        n: int

    def f(a: "Color", b: "LocalThing") -> None:
        pass

    with pytest.raises(TypeError, match="cannot evaluate"):
        function_schema(f)
    schema = function_schema(f, localns={"LocalThing": LocalThing})
    assert schema.parameters["properties"]["b"] == obj({"n": {"type": "integer"}}, ["n"])


# ------------------------------------------------------------------ docstrings


def test_parse_docstring_google() -> None:
    doc = """Fetch a page
    from the web.

    Longer explanation that is not the description.

    Args:
        url (str): the address
            to fetch.
        timeout: seconds to wait.

            Still about timeout after a blank line.
        *extra: starred names lose their stars.
        not an entry line
        retries:

    Returns:
        the body.
    """
    description, params = parse_docstring(doc)
    assert description == "Fetch a page from the web."
    assert params == {
        "url": "the address to fetch.",
        "timeout": "seconds to wait. Still about timeout after a blank line.",
        "extra": "starred names lose their stars.",
        "retries": "",
    }


def test_parse_docstring_rest() -> None:
    doc = """Fetch a page.

    :param str url: the address
        to fetch.
    :param timeout: seconds.
    :type timeout: float
    :returns: the body.
    """
    assert parse_docstring(doc) == (
        "Fetch a page.",
        {"url": "the address to fetch.", "timeout": "seconds."},
    )


def test_parse_docstring_edges() -> None:
    assert parse_docstring(None) == ("", {})
    assert parse_docstring("") == ("", {})
    assert parse_docstring("Just one line.") == ("Just one line.", {})
    assert parse_docstring("Summary.\nArgs:\n    a: thing.") == ("Summary.", {"a": "thing."})
    assert parse_docstring("Args:\n    a: thing.") == ("", {"a": "thing."})
    assert parse_docstring(":param a: thing.") == ("", {"a": "thing."})
    # a line that merely ends with a colon is not a section
    assert parse_docstring("Formats:\nall of them.") == ("Formats: all of them.", {})
    assert parse_docstring("Do it.\n\nParameters:\n  x: the x.\nDone.") == (
        "Do it.",
        {"x": "the x."},
    )


# ------------------------------------------------------------------- validator


def test_validate_types() -> None:
    assert validate({"type": "integer"}, 3) == []
    assert validate({"type": "integer"}, 3.0) == []
    assert validate({"type": "integer"}, 3.5) == ["$: expected integer, got number"]
    assert validate({"type": "integer"}, True) == ["$: expected integer, got boolean"]
    assert validate({"type": "number"}, 3) == []
    assert validate({"type": "number"}, False) == ["$: expected number, got boolean"]
    assert validate({"type": "boolean"}, 0) == ["$: expected boolean, got integer"]
    assert validate({"type": "string"}, None) == ["$: expected string, got null"]
    assert validate({"type": "null"}, "x") == ["$: expected null, got string"]
    assert validate({"type": "array"}, {}) == ["$: expected array, got object"]
    assert validate({"type": "object"}, []) == ["$: expected object, got array"]
    assert validate({"type": ["string", "null"]}, None) == []
    assert validate({"type": ["string", "null"]}, 1) == ["$: expected string or null, got integer"]
    assert validate({}, {"anything": [1, None]}) == []


def test_validate_enum_is_type_strict() -> None:
    schema = {"enum": [1, "a", None]}
    assert validate(schema, 1) == []
    assert validate(schema, 1.0) == []
    assert validate(schema, None) == []
    assert validate(schema, True) == ['$: expected one of 1, "a", null; got true']
    assert validate({"enum": [True]}, 1) == ["$: expected one of true; got 1"]
    assert validate(schema_for_type(Color), "blue") == [
        '$: expected one of "red", "green"; got "blue"'
    ]


def test_validate_objects() -> None:
    schema = obj({"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a"])
    assert validate(schema, {"a": 1}) == []
    assert validate(schema, {"a": 1, "b": "2"}) == ["$.b: expected integer, got string"]
    assert validate(schema, {"b": True}) == [
        "$: missing required property 'a'",
        "$.b: expected integer, got boolean",
    ]
    assert validate(schema, {"a": 1, "c": 3, "weird key": 4}) == [
        "$: unexpected property 'c'",
        "$: unexpected property 'weird key'",
    ]
    open_schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert validate(open_schema, {"ok": 1, "not ok": "x", "also": None}) == [
        '$["not ok"]: expected integer, got string',
        "$.also: expected integer, got null",
    ]


def test_validate_nested_paths() -> None:
    schema = schema_for_type(dict[str, list[Point]])
    value = {"shapes": [{"x": 1}, {"x": "1", "z": 0}, {}], "other": "no"}
    assert validate(schema, value) == [
        "$.shapes[1].x: expected number, got string",
        "$.shapes[1]: unexpected property 'z'",
        "$.shapes[2]: missing required property 'x'",
        "$.other: expected array, got string",
    ]


def test_validate_any_of() -> None:
    optional_int = schema_for_type(int | None)
    assert validate(optional_int, None) == []
    assert validate(optional_int, 1) == []
    assert validate(optional_int, "1") == ["$: expected integer or null, got string"]
    # the one branch whose type fits reports its own, more precise, errors
    optional_point = schema_for_type(Point | None)
    assert validate(optional_point, {"y": 1}) == ["$: missing required property 'x'"]
    assert validate(optional_point, 3) == ["$: expected object or null, got integer"]
    literal = schema_for_type(Literal["a", "b"] | None)
    assert validate(literal, "c") == ['$: expected one of "a", "b"; got "c"']
    assert validate(schema_for_type(Color | int), [1]) == [
        '$: expected one of "red", "green" or integer, got array'
    ]


def test_validate_caps_errors() -> None:
    schema = {"type": "array", "items": {"type": "integer"}}
    errors = validate(schema, ["x"] * 50)
    assert len(errors) == MAX_ERRORS
    assert errors[0] == "$[0]: expected integer, got string"
    assert len(validate(schema, ["x"] * 50, max_errors=3)) == 3
    schema = obj({f"p{i}": {"type": "integer"} for i in range(20)}, [f"p{i}" for i in range(20)])
    assert len(validate(schema, {})) == MAX_ERRORS


def test_long_values_are_abbreviated() -> None:
    [error] = validate({"enum": ["a"]}, "x" * 500)
    assert error.startswith('$: expected one of "a"; got "xxx')
    assert error.endswith("...")
    assert len(error) < 120


# ------------------------------------------------------------------ conversion


def test_convert() -> None:
    def f(
        color: Color,
        level: Level,
        point: Point,
        shapes: list[Shape],
        coords: tuple[float, ...],
        ratio: float,
        count: int,
        maybe: Color | None,
        by_name: dict[str, Point],
        filters: Filters,
        anything: Any,
        either: int | Point,
        nested: list[tuple[int, ...]],
    ) -> None:
        pass

    schema = function_schema(f)
    arguments = {
        "color": "green",
        "level": 2,
        "point": {"x": 1},
        "shapes": [{"name": "sq", "points": [{"x": 0, "y": 1}], "color": "green", "secret": 7}],
        "coords": [1, 2.5],
        "ratio": 2,
        "count": 3.0,
        "maybe": None,
        "by_name": {"origin": {"x": 0, "y": 0}},
        "filters": {"genre": "drama", "color": "red"},
        "anything": {"a": [1]},
        "either": {"x": 2},
        "nested": [[1, 2], []],
    }
    assert schema.validate(arguments) == []
    kwargs = schema.convert(arguments)
    assert kwargs == {
        "color": Color.GREEN,
        "level": Level.HIGH,
        "point": Point(1.0, 0.0),
        "shapes": [Shape("sq", [Point(0.0, 1.0)], Color.GREEN, 7)],
        "coords": (1.0, 2.5),
        "ratio": 2.0,
        "count": 3,
        "maybe": None,
        "by_name": {"origin": Point(0.0, 0.0)},
        "filters": {"genre": "drama", "color": Color.RED},
        "anything": {"a": [1]},
        "either": Point(2.0),
        "nested": [(1, 2), ()],
    }
    assert type(kwargs["ratio"]) is float
    assert type(kwargs["count"]) is int
    assert type(kwargs["point"].x) is float
    assert kwargs["level"] is Level.HIGH
    assert schema.convert({"color": "red", "maybe": "red"})["maybe"] is Color.RED
    assert schema.convert({"either": 4}) == {"either": 4}


def test_convert_reports_constructor_errors_with_paths() -> None:
    def f(good: Positive, items: list[Positive]) -> None:
        pass

    schema = function_schema(f)
    arguments = {"good": {"value": 1}, "items": [{"value": 2}, {"value": -1}]}
    assert schema.validate(arguments) == []
    with pytest.raises(ArgumentConversionError) as info:
        schema.convert(arguments)
    [error] = info.value.errors
    assert error.startswith("$.items[1]: ")
    assert "value" in error
    assert isinstance(info.value, ValueError)


def test_parse_docstring_starting_with_a_section() -> None:
    def f(a: int, b: int) -> None:
        """Args:
        a: the a.
            more a.
        b: the b.
        Returns:
            nothing.
        """

    assert parse_docstring(f.__doc__) == ("", {"a": "the a. more a.", "b": "the b."})
