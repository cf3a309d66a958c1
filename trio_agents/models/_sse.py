"""Server-sent events: an incremental ``text/event-stream`` decoder and JSON event data.

Every HTTP provider's response is an event stream; :class:`SSEDecoder` turns its bytes,
as they arrive, into :class:`SSEEvent` values (``\\n``, ``\\r\\n`` and ``\\r`` line ends,
split anywhere, multi-line ``data:``, comments, ``event:`` lines), and
:func:`parse_json_event` reads one event's data as the JSON object the providers send.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final, final

import attrs

from .._exceptions import ModelError

__all__ = ["MAX_LINE_BYTES", "SSEDecoder", "SSEEvent", "parse_json_event"]

MAX_LINE_BYTES: Final = 16 * 1024 * 1024
"""An event-stream line longer than this is treated as a protocol error."""


@attrs.frozen
class SSEEvent:
    """One dispatched server-sent event: its type, its data, and its last event id."""

    event: str = "message"
    data: str = ""
    id: str | None = None


_LINE_END = re.compile(rb"\r\n|\r|\n")


@final
class SSEDecoder:
    """An incremental decoder for the ``text/event-stream`` format (WHATWG HTML §9.2).

    Feed it the body's bytes as they arrive, split anywhere (even inside a UTF-8
    character or between the ``\\r`` and ``\\n`` of a line end); it returns the events
    completed by each chunk. Comment lines (``: keepalive``) are skipped, ``data:``
    lines of one event are joined with ``\\n``, ``event:`` names the event type.
    """

    def __init__(self, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._buffer = bytearray()
        self._max_line_bytes = max_line_bytes
        self._first_line = True
        self._event_type = ""
        self._data: list[str] = []
        self._last_id: str | None = None
        self.lines = 0
        """How many complete lines have been decoded."""
        self.fields = 0
        """How many of them were event-stream lines: comments, ``data``, ``event``,
        ``id`` or ``retry`` fields (a body with none is not an event stream)."""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode ``chunk`` and return the events it completed.

        Raises:
            ModelError: a line is not valid UTF-8, or is longer than the limit.
        """
        self._buffer += chunk
        events: list[SSEEvent] = []
        position = 0
        buffer = self._buffer
        while True:
            match = _LINE_END.search(buffer, position)
            if match is None:
                break
            if match.group() == b"\r" and match.end() == len(buffer):
                break  # maybe the first half of a "\r\n": wait for the next byte
            event = self._line(bytes(buffer[position : match.start()]))
            if event is not None:
                events.append(event)
            position = match.end()
        del buffer[:position]
        if len(buffer) > self._max_line_bytes:
            raise ModelError(
                f"event-stream line longer than {self._max_line_bytes} bytes:"
                f" {bytes(buffer[:200])!r}..."
            )
        return events

    def close(self) -> list[SSEEvent]:
        """Signal the end of the body; return an event left without its blank line.

        The spec drops an event the stream ended in the middle of; this decoder is
        lenient about the last blank line only: a final event whose lines were all
        complete is still returned. A last line without its line end is dropped.
        """
        events: list[SSEEvent] = []
        if self._buffer.endswith(b"\r"):
            events.extend(self.feed(b"\n"))
        self._buffer.clear()
        if self._data:
            event = self._line(b"")
            if event is not None:
                events.append(event)
        return events

    @property
    def pending(self) -> bytes:
        """Bytes of an unfinished line (for error messages)."""
        return bytes(self._buffer)

    def _line(self, raw: bytes) -> SSEEvent | None:
        self.lines += 1
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ModelError(
                f"event-stream line is not valid UTF-8 ({exc}): {raw[:200]!r}"
            ) from None
        if self._first_line:
            self._first_line = False
            line = line.removeprefix("\ufeff")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            self.fields += 1
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name in ("data", "event", "id", "retry"):
            self.fields += 1
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event_type = value
        elif name == "id" and "\0" not in value:
            self._last_id = value
        return None  # "retry" and unknown fields are ignored

    def _dispatch(self) -> SSEEvent | None:
        event_type, self._event_type = self._event_type, ""
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        return SSEEvent(event=event_type or "message", data=data, id=self._last_id)


def parse_json_event(provider: str, event: SSEEvent) -> dict[str, Any]:
    """Parse an event's data as a JSON object.

    Raises:
        ModelError: the data is not JSON or not an object; the message quotes it.
    """
    try:
        value = json.loads(event.data)
    except ValueError as exc:
        raise ModelError(
            f"{provider}: malformed JSON in the event stream ({exc}): {_quote(event.data)}"
        ) from None
    if not isinstance(value, dict):
        raise ModelError(
            f"{provider}: expected a JSON object in the event stream, got {_quote(event.data)}"
        )
    return value


def _quote(text: str, limit: int = 300) -> str:
    if len(text) > limit:
        return repr(text[:limit]) + "..."
    return repr(text)
