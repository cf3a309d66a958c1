"""The docstring parser: a function's or class's description and its parameters'.

A tool's description and the description of each of its parameters come from the
docstring of the tool function (:mod:`._signatures`); an attrs class, dataclass or
TypedDict is described by its own (:mod:`._typeschema`). Google-style ``Args:`` sections
and reST ``:param name:`` fields are understood; everything else is left out.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence

__all__ = ["parse_docstring"]


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
