"""S1: validating tool arguments — our ``_validator.validate`` against ``jsonschema``.

``python -m benchmarks.schema`` prints, for three argument shapes a tool typically
gets, the time per validation of a valid and of an invalid value with our validator,
with ``jsonschema``'s ``Draft202012Validator`` (the validator built once, as a run
would cache it), and the ratio. The verdicts are compared on every value. ``jsonschema``
is in the dev environment (the MCP SDK depends on it); it is not a dependency of
trio_agents. The figures are recorded in docs/output.md.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any

import jsonschema

from trio_agents._validator import validate

SHAPES: dict[str, tuple[dict[str, Any], Any, Any]] = {
    "flat (3 scalars)": (
        {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
        {"city": "Oslo", "days": 3, "metric": True},
        {"city": "Oslo", "days": "3"},
    ),
    "nested (list of objects, enum)": (
        {
            "type": "object",
            "properties": {
                "rows": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "integer"},
                            "kind": {"enum": ["a", "b", "c"]},
                            "tags": {"type": "array", "items": {"type": "string"}},
                        },
                        "required": ["id", "kind"],
                    },
                }
            },
            "required": ["rows"],
        },
        {"rows": [{"id": i, "kind": "a", "tags": ["x", "y"]} for i in range(10)]},
        {"rows": [{"id": i, "kind": "z", "tags": ["x", 1]} for i in range(10)]},
    ),
    "optional (anyOf with null)": (
        {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            },
            "required": ["query"],
        },
        {"query": "q", "limit": None},
        {"query": "q", "limit": "ten"},
    ),
}


def _per_call(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best


def _all_errors(validator: Any, value: Any) -> list[Any]:
    return list(validator.iter_errors(value))


def main(n: int = 20_000) -> list[dict[str, Any]]:
    rows = []
    for name, (schema, good, bad) in SHAPES.items():
        reference = jsonschema.Draft202012Validator(schema)
        for label, value in (("valid", good), ("invalid", bad)):
            assert (not validate(schema, value)) == reference.is_valid(value), (name, label)
            ours = _per_call(functools.partial(validate, schema, value), n)
            # is_valid for a yes/no; iter_errors when the errors are wanted (as ours
            # always returns them, for the model to read).
            theirs_valid = _per_call(functools.partial(reference.is_valid, value), n)
            theirs_errors = _per_call(functools.partial(_all_errors, reference, value), n)
            rows.append(
                {
                    "shape": name,
                    "value": label,
                    "ours_us": round(ours * 1e6, 2),
                    "jsonschema_is_valid_us": round(theirs_valid * 1e6, 2),
                    "jsonschema_errors_us": round(theirs_errors * 1e6, 2),
                    "speedup_vs_errors": round(theirs_errors / ours, 1),
                }
            )
    return rows


if __name__ == "__main__":
    for row in main():
        print(json.dumps(row))
