"""Validate chat messages against llama-cpp-python's own request schema.

Run by ``test_llama_cpp_schema.py`` with the interop venv's Python (which has pydantic):
reads ``{"schema": <path to llama_types.py>, "cases": [[message, ...], ...]}`` as JSON on
stdin and prints, for each case, ``null`` when pydantic accepts the messages as
``List[llama_types.ChatCompletionRequestMessage]`` (the type of
``CreateChatCompletionRequest.messages`` in ``llama_cpp.server``), else the error text.
``llama_types.py`` is taken from the llama-cpp-python source distribution on PyPI: it
is pure Python (TypedDicts), so no native library has to be built for this.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from typing import Any


def main() -> None:
    request = json.load(sys.stdin)
    spec = importlib.util.spec_from_file_location("llama_types", request["schema"])
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # In the interop venv only; imported untyped so mypy passes with or without it
    # (the dev extras pull pydantic in through mcp).
    pydantic: Any = importlib.import_module("pydantic")

    messages_type = types.GenericAlias(list, (module.ChatCompletionRequestMessage,))
    adapter: Any = pydantic.TypeAdapter(messages_type)
    results: list[str | None] = []
    for messages in request["cases"]:
        try:
            adapter.validate_python(messages)
        except pydantic.ValidationError as exc:
            results.append(str(exc))
        else:
            results.append(None)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
