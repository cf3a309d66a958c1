"""Our argument validator (``trio_agents._validator.validate``) against the reference
implementation, ``jsonschema`` (Draft 2020-12), on random schemas of the subset we
support (type, properties, required, additionalProperties, items, enum, anyOf) and
random JSON values: the two must agree on every valid/invalid verdict.

This is why ``_validator.py`` may stay our own (see docs/output.md): on the subset it
implements it is the reference's equal, checked here, not assumed.
"""

from __future__ import annotations

from typing import Any

import hypothesis
import jsonschema
from hypothesis import strategies as st

from trio_agents._validator import validate

KEYS = ("a", "b", "c")
TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(-3, 3, allow_nan=False).map(lambda x: round(x, 1))
    | st.sampled_from(["", "x", "y"]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from((*KEYS, "d")), children, max_size=3)
    ),
    max_leaves=8,
)


def _schemas(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    typed = st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(TYPES)
            | st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True),
            "properties": st.dictionaries(st.sampled_from(KEYS), children, max_size=3),
            "required": st.lists(st.sampled_from(KEYS), max_size=2, unique=True),
            "additionalProperties": st.booleans() | children,
            "items": children,
            "enum": st.lists(json_values, min_size=1, max_size=3),
        },
    )
    return typed | st.builds(
        lambda branches: {"anyOf": branches}, st.lists(children, min_size=1, max_size=3)
    )


schemas = st.recursive(
    st.fixed_dictionaries({}, optional={"type": st.sampled_from(TYPES)}),
    _schemas,
    max_leaves=6,
)


@hypothesis.settings(max_examples=3000, deadline=None, derandomize=True, database=None)
@hypothesis.given(schema=schemas, value=json_values)
def test_our_validator_agrees_with_jsonschema(schema: dict[str, Any], value: Any) -> None:
    reference = jsonschema.Draft202012Validator(schema).is_valid(value)
    ours = validate(schema, value)
    assert (not ours) == reference, (schema, value, ours)


def test_the_differential_test_sees_valid_and_invalid_values() -> None:
    """Guard against a strategy that only ever produces invalid values (the agreement
    above would then say little)."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert validate(schema, {"a": 1}) == []
    assert jsonschema.Draft202012Validator(schema).is_valid({"a": 1})
    assert validate(schema, {"a": "x"}) != []
    assert not jsonschema.Draft202012Validator(schema).is_valid({"a": "x"})
