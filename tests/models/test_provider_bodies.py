"""What every HTTP provider says when a 200 response is not an event stream.

docs/models.md: an HTTP 200 whose body is not an event stream fails at once (no retry:
the same request gets the same answer), and the message *quotes the body* — cut to a
few hundred characters, on one line. Run against a real loopback server, per provider.
"""

from __future__ import annotations

import json

import pytest
import trio

from tests.support.model_streams import collect
from tests.support.provider_table import PROVIDERS, REQUEST
from tests.support.sse_server import Raw, Reply, SSEServer
from trio_agents import ModelError
from trio_agents.models import from_string


async def _fail(name: str, reply: Reply, nursery: trio.Nursery) -> tuple[ModelError, SSEServer]:
    server = SSEServer()
    server.add(reply, PROVIDERS[name].reply())
    await nursery.start(server.serve)
    model = from_string(f"{name}:m@{server.base_url}/v1", retry_base_delay=0)
    with trio.fail_after(10), pytest.raises(ModelError) as caught:
        await collect(model, REQUEST)
    assert len(server.requests) == 1, "the same request would get the same answer"
    message = str(caught.value)
    assert "\n" not in message
    assert caught.value.status_code == 200
    return caught.value, server


@pytest.mark.parametrize("name", PROVIDERS)
async def test_a_whole_json_answer_is_quoted(name: str, nursery: trio.Nursery) -> None:
    """Issue 29 item 13: Anthropic read the message's ``"type": "message"`` as an error
    type and said only ``... 'application/json': message``."""
    whole = PROVIDERS[name].whole
    error, _ = await _fail(name, Reply.json(200, whole), nursery)
    message = str(error)
    assert "expected an event stream, got HTTP 200 'application/json'" in message
    assert json.dumps(whole)[:60] in message, message
    assert not message.endswith(": message")


@pytest.mark.parametrize("name", PROVIDERS)
@pytest.mark.parametrize(
    "body",
    [
        {"error": {"type": "overloaded_error", "message": "try later"}},
        {"type": "error", "error": {"type": "overloaded_error", "message": "try later"}},
    ],
)
async def test_a_json_error_with_status_200_names_the_error(
    name: str, body: object, nursery: trio.Nursery
) -> None:
    error, _ = await _fail(name, Reply.json(200, body), nursery)
    assert str(error).endswith("'application/json': overloaded_error: try later")


@pytest.mark.parametrize("name", PROVIDERS)
@pytest.mark.parametrize("content_type", ["application/json", "text/html", "text/event-stream"])
async def test_an_empty_body_says_so(name: str, content_type: str, nursery: trio.Nursery) -> None:
    reply = Reply(headers=[("content-type", content_type)], body=b"")
    error, _ = await _fail(name, reply, nursery)
    assert "empty body" in str(error)


@pytest.mark.parametrize("name", PROVIDERS)
async def test_an_html_page_is_quoted(name: str, nursery: trio.Nursery) -> None:
    page = b"<!DOCTYPE html>\n<html><head><title>Gateway login</title></head>\n<body/></html>\n"
    reply = Reply(headers=[("content-type", "text/html; charset=utf-8")], body=page)
    error, _ = await _fail(name, reply, nursery)
    assert "not an event stream" in str(error)
    assert "<title>Gateway login</title>" in str(error)


@pytest.mark.parametrize("name", PROVIDERS)
@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json", json.dumps({"padding": "x" * 300_000}).encode()),
        ("application/json", json.dumps({"error": {"message": "y" * 300_000}}).encode()),
        ("text/html", b"<html>" + b"z" * 30_000),
        ("text/html", b"<p>line</p>\n" * 30_000),
        ("text/plain", b"w" * 30_000),
    ],
)
async def test_a_huge_body_is_cut_in_the_message(
    name: str, content_type: str, body: bytes, nursery: trio.Nursery
) -> None:
    reply = Reply(headers=[("content-type", content_type)], events=[Raw(body)])
    error, _ = await _fail(name, reply, nursery)
    assert len(str(error)) < 1000, len(str(error))
    assert "\u2026" in str(error)


@pytest.mark.parametrize("name", PROVIDERS)
@pytest.mark.parametrize("status", [400, 502])
async def test_a_huge_error_body_is_cut_in_the_message(
    name: str, status: int, nursery: trio.Nursery
) -> None:
    server = SSEServer()
    page = b"<html><body>" + b"Bad gateway. " * 100_000 + b"</body></html>"
    server.add(Reply(status=status, headers=[("content-type", "text/html")], body=page))
    await nursery.start(server.serve)
    model = from_string(f"{name}:m@{server.base_url}/v1", max_retries=0)
    with trio.fail_after(10), pytest.raises(ModelError) as caught:
        await collect(model, REQUEST)
    message = str(caught.value)
    assert f"HTTP {status}" in message
    assert "Bad gateway." in message
    assert len(message) < 1000, len(message)
