"""Request validators that make the loopback server (``sse_server.py``) as strict as
the OpenAI-compatible servers people run, each answering a bad request the way that
server does (status code and error body).

They are written from each server's documented request schema, not copied from it:

* :func:`llama_cpp_python` — llama-cpp-python's ``llama_cpp.server``: messages are
  validated by pydantic against ``llama_types.ChatCompletionRequestMessage`` (an
  assistant ``content`` is ``NotRequired[str]``: a ``null`` is "Input should be a valid
  string"; a tool message needs ``content`` and ``tool_call_id``), and *any* exception
  in the route — the validation error included — is answered with HTTP 500
  ``{"error": {"message": str(error), "type": "internal_server_error", "param": null,
  "code": null}}``. An assistant turn without ``content`` gets past the schema and
  breaks the chat template instead.
* :func:`ollama` — Ollama's ``/v1/chat/completions`` (``openai.FromChatRequest``):
  ``content`` must be a string or a list of parts, ``null`` only beside ``tool_calls``
  (else 400 "invalid message content type: <nil>"), and tool-call arguments must parse
  as a JSON object (else 400 "invalid tool call arguments").
* :func:`llama_cpp_server` — llama.cpp's ``llama-server``
  (``common_chat_msgs_parse_oaicompat``): an assistant needs ``content`` or
  ``tool_calls``; ``name``, ``tool_call_id`` and a call's ``id`` are read as strings
  (a ``null`` throws); failures are 400 ``invalid_request_error`` "Failed to parse
  messages: ...".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.support.sse_server import RecordedRequest, Reply

__all__ = ["STRICT_SERVERS", "llama_cpp_python", "llama_cpp_server", "ollama"]

Validator = Callable[[RecordedRequest], Reply | None]


def _messages(request: RecordedRequest) -> list[Any]:
    body = request.json
    assert isinstance(body, dict), body
    messages = body.get("messages")
    assert isinstance(messages, list), body
    return messages


# ------------------------------------------------------------ llama-cpp-python


def _pydantic_error(kind: str, loc: tuple[Any, ...], msg: str, value: Any) -> str:
    return repr({"type": kind, "loc": ("body", *loc), "msg": msg, "input": value})


def _check_str(errors: list[str], loc: tuple[Any, ...], value: Any, *, optional: bool) -> None:
    if isinstance(value, str) or (optional and value is None):
        return
    errors.append(_pydantic_error("string_type", loc, "Input should be a valid string", value))


def _check_tool_calls(errors: list[str], loc: tuple[Any, ...], calls: Any) -> None:
    if not isinstance(calls, list):
        errors.append(_pydantic_error("list_type", loc, "Input should be a valid list", calls))
        return
    for n, call in enumerate(calls):
        if not isinstance(call, dict):
            errors.append(_pydantic_error("dict_type", (*loc, n), "Input should be a dict", call))
            continue
        _check_str(errors, (*loc, n, "id"), call.get("id"), optional=False)
        if call.get("type") != "function":
            errors.append(
                _pydantic_error(
                    "literal_error",
                    (*loc, n, "type"),
                    "Input should be 'function'",
                    call.get("type"),
                )
            )
        function = call.get("function")
        if not isinstance(function, dict):
            errors.append(
                _pydantic_error("dict_type", (*loc, n, "function"), "Field required", function)
            )
            continue
        _check_str(errors, (*loc, n, "function", "name"), function.get("name"), optional=False)
        _check_str(
            errors, (*loc, n, "function", "arguments"), function.get("arguments"), optional=False
        )


def llama_cpp_python(request: RecordedRequest) -> Reply | None:
    """Reject what llama-cpp-python's server rejects, with its HTTP 500."""
    errors: list[str] = []
    template_error: str | None = None
    for i, message in enumerate(_messages(request)):
        loc: tuple[Any, ...] = ("messages", i, "typed-dict")
        role = message.get("role") if isinstance(message, dict) else None
        if role in ("system", "user", "tool", "function"):
            if "content" not in message:
                errors.append(_pydantic_error("missing", (*loc, "content"), "Field required", None))
            elif role != "user":
                _check_str(errors, (*loc, "content"), message["content"], optional=True)
            if role == "tool":
                _check_str(
                    errors, (*loc, "tool_call_id"), message.get("tool_call_id"), optional=False
                )
        elif role == "assistant":
            if "content" in message:
                _check_str(errors, (*loc, "content"), message["content"], optional=False)
            else:
                template_error = "'dict object' has no attribute 'content'"
            if "tool_calls" in message:
                _check_tool_calls(errors, (*loc, "tool_calls"), message["tool_calls"])
        else:
            errors.append(_pydantic_error("union_tag_invalid", loc, "Input tag not found", role))
    if errors:
        plural = "s" if len(errors) > 1 else ""
        text = f"{len(errors)} validation error{plural}:\n" + "\n".join(f"  {e}" for e in errors)
    elif template_error is not None:
        text = template_error
    else:
        return None
    error = {"message": text, "type": "internal_server_error", "param": None, "code": None}
    return Reply.json(500, {"error": error})


# ----------------------------------------------------------------------- Ollama


def ollama(request: RecordedRequest) -> Reply | None:
    """Reject what Ollama's OpenAI-compatible endpoint rejects, with its HTTP 400."""
    for message in _messages(request):
        content = message.get("content")
        calls = message.get("tool_calls")
        if not isinstance(content, str | list) and calls is None:
            return _ollama_error(f"invalid message content type: {_go_type(content)}")
        for call in calls or ():
            try:
                arguments = json.loads(call["function"]["arguments"])
            except (ValueError, TypeError, KeyError):
                arguments = None
            if not isinstance(arguments, dict):
                return _ollama_error("invalid tool call arguments")
    return None


def _go_type(value: Any) -> str:
    return "<nil>" if value is None else type(value).__name__


def _ollama_error(message: str) -> Reply:
    return Reply.json(400, {"error": {"message": message, "type": "invalid_request_error"}})


# ------------------------------------------------------------------ llama-server


def llama_cpp_server(request: RecordedRequest) -> Reply | None:
    """Reject what llama.cpp's ``llama-server`` rejects, with its HTTP 400."""
    for message in _messages(request):
        for key in ("name", "tool_call_id", "reasoning_content"):
            if key in message and not isinstance(message[key], str):
                return _llama_error("[json.exception.type_error.302] type must be string")
        content = message.get("content")
        has_content = "content" in message and content is not None
        if has_content and not isinstance(content, str | list):
            return _llama_error(f"Invalid 'content' type: {json.dumps(content)}")
        calls = message.get("tool_calls")
        if calls is not None:
            for call in calls:
                if "id" in call and not isinstance(call["id"], str):
                    return _llama_error("[json.exception.type_error.302] type must be string")
                if call.get("type") != "function" or "name" not in call.get("function", {}):
                    return _llama_error(f"Missing tool call name: {json.dumps(call)}")
        if message.get("role") == "assistant" and not has_content and not calls:
            return _llama_error("Expected 'content' or 'tool_calls'")
    for tool in request.json.get("tools") or ():
        function = tool.get("function", {})
        if "description" in function and not isinstance(function["description"], str):
            return _llama_error("[json.exception.type_error.302] type must be string")
    return None


def _llama_error(message: str) -> Reply:
    error = {"code": 400, "message": f"Failed to parse messages: {message}"}
    return Reply.json(400, {"error": {**error, "type": "invalid_request_error"}})


STRICT_SERVERS: dict[str, Validator] = {
    "llama-cpp-python": llama_cpp_python,
    "ollama": ollama,
    "llama.cpp": llama_cpp_server,
}
