"""The shared HTTP machinery of the model providers: SSE decoding, retry helpers, error
messages, client ownership, ``from_string``; parsing edge cases over
``httpx.MockTransport``; and why the streams unwind httpx's generator chain."""

from __future__ import annotations

import email.utils
import gc
import json
import warnings
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from tests.support.sse_server import SSE, Reply, SSEServer
from trio_agents import ModelError, ModelRequest, Usage, UserMessage
from trio_agents.models import (
    AnthropicModel,
    DemoModel,
    Finish,
    ModelEvent,
    OpenAIChatModel,
    TextDelta,
    ToolCallDone,
    from_string,
)
from trio_agents.models._call_ids import CallIds
from trio_agents.models._clients import ClientOwnership, make_timeout
from trio_agents.models._error_bodies import error_detail, http_error, one_line, parse_error_body
from trio_agents.models._http import HTTPStreamingModel
from trio_agents.models._model_stream import HTTPRequestSpec, StreamParser
from trio_agents.models._retry import MAX_RETRY_AFTER, backoff_delay, parse_retry_after
from trio_agents.models._sse import SSEDecoder, SSEEvent

REQUEST = ModelRequest(instructions="", items=(UserMessage("hi"),))


async def settle() -> None:
    """Let the garbage collector finalise what a test dropped, and its tasks run."""
    for _ in range(3):
        gc.collect()
        await trio.testing.wait_all_tasks_blocked()


# ------------------------------------------------------------------ SSEDecoder

STREAM = (
    b"\xef\xbb\xbf: a comment first\r\n"
    b"event: greeting\r\n"
    b"data: hello\r\n"
    b"data:  two spaces keep one\r\n"
    b"\r\n"
    b"id: 7\n"
    b"retry: 1000\n"
    b"unknown: field\n"
    b"data:no-space\n"
    b"\n"
    b": keepalive\r\r"
    b"data: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\r"
    b"\r"
    b"data\n"
    b"\n"
    b"event: lonely-event-without-data\n"
    b"\n"
    b"data: last\n"
    b"\n"
)
EXPECTED = [
    SSEEvent("greeting", "hello\n two spaces keep one", None),
    SSEEvent("message", "no-space", "7"),
    SSEEvent("message", "café 日本", "7"),
    SSEEvent("message", "", "7"),
    SSEEvent("message", "last", "7"),
]


def test_sse_decoder_whole_stream() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(STREAM) + decoder.close() == EXPECTED


def test_sse_decoder_split_at_every_byte() -> None:
    for cut in range(len(STREAM) + 1):
        decoder = SSEDecoder()
        events = decoder.feed(STREAM[:cut]) + decoder.feed(STREAM[cut:]) + decoder.close()
        assert events == EXPECTED, cut


def test_sse_decoder_byte_by_byte() -> None:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for byte in STREAM:
        events += decoder.feed(bytes([byte]))
    assert events + decoder.close() == EXPECTED


def test_sse_decoder_end_of_stream() -> None:
    decoder = SSEDecoder()
    # The last event lacks its blank line: still delivered (lenient).
    assert decoder.feed(b"data: [DONE]\n") == []
    assert decoder.close() == [SSEEvent("message", "[DONE]")]
    decoder = SSEDecoder()
    # A last line without its line end is truncated: dropped, and visible as pending.
    assert decoder.feed(b'data: {"trunc') == []
    assert decoder.pending == b'data: {"trunc'
    assert decoder.close() == []
    decoder = SSEDecoder()
    assert decoder.feed(b"data: x\r") == []  # maybe half of "\r\n"
    assert decoder.close() == [SSEEvent("message", "x")]


def test_sse_decoder_rejects_bad_utf8_and_huge_lines() -> None:
    with pytest.raises(ModelError, match="not valid UTF-8"):
        SSEDecoder().feed(b"data: \xff\xfe\n")
    with pytest.raises(ModelError, match="longer than 10 bytes"):
        SSEDecoder(max_line_bytes=10).feed(b"data: 0123456789")


# ------------------------------------------------------------ retry helpers


def test_parse_retry_after() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after("nan") is None
    now = 1_700_000_000.0
    future = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(future, now=now) == pytest.approx(30.0)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after(past, now=now) == 0.0


def test_backoff_delay() -> None:
    for retry in range(8):
        ceiling = min(8.0, 0.5 * 2**retry)
        for _ in range(50):
            delay = backoff_delay(retry, base=0.5, maximum=8.0)
            assert ceiling / 2 <= delay <= ceiling
    assert backoff_delay(3, base=0.5, maximum=8.0, retry_after=0.0) == 0.0
    assert backoff_delay(0, base=0.5, maximum=8.0, retry_after=7.0) == 7.0


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"error": {"message": "bad key", "type": "auth_error"}}', "auth_error: bad key"),
        (b'{"error": {"message": "no type"}}', "no type"),
        (b'{"type": "error", "error": {"type": "x_error", "message": "m"}}', "x_error: m"),
        (b'{"error": "model not found"}', "model not found"),
        (b'{"detail": "Not Found"}', "Not Found"),
        (b'{"detail": [{"loc": ["body"]}]}', '[{"loc": ["body"]}]'),
        (b"<html>gateway</html>", "<html>gateway</html>"),
        (b"", None),
    ],
)
def test_error_detail(body: bytes, detail: str | None) -> None:
    assert error_detail(body) == detail


@pytest.mark.parametrize(
    ("body", "status", "kind", "message"),
    [
        # LiteLLM proxy: placeholders, and the status again as the code.
        (
            b'{"error": {"message": "m", "type": "None", "param": "None", "code": "400"}}',
            400,
            None,
            "m",
        ),
        (b'{"error": {"message": "m", "type": null, "code": 500}}', 500, None, "m"),
        (
            b'{"error": {"message": "m", "type": null, "code": "model_not_found"}}',
            404,
            "model_not_found",
            "m",
        ),
        (b'{"error": {"message": "a\\n  b\\r\\nc", "type": "t"}}', 500, "t", "a b c"),
        (b'{"error": "x", "error_type": "validation"}', 422, "validation", "x"),
        (b'{"error": {"type": "only_a_kind"}}', 500, "only_a_kind", None),
        (b"plain\ntext", 502, None, "plain text"),
        (b"[1, 2]", 500, None, "[1, 2]"),
    ],
)
def test_parse_error_body(body: bytes, status: int, kind: str | None, message: str | None) -> None:
    info = parse_error_body(body, status)
    assert (info.kind, info.message) == (kind, message)


@pytest.mark.parametrize(
    ("body", "permanent"),
    [
        # llama-cpp-python: a schema error is an HTTP 500 with pydantic's report.
        (
            b'{"error": {"message": "1 validation error:\\n  {\'msg\': \'Input should be a'
            b' valid string\'}", "type": "internal_server_error", "code": null}}',
            True,
        ),
        (b'{"error": {"message": "Field required", "type": "internal_server_error"}}', True),
        (b'{"error": {"message": "x", "type": "invalid_request_error"}}', True),
        (b'{"object": "error", "message": "x", "type": "BadRequestError", "code": 400}', True),
        (b'{"error": {"message": "x", "code": "context_length_exceeded"}}', True),
        (b'{"error": {"message": "x", "code": "400"}}', True),
        (b'{"error": {"message": "x", "type": "insufficient_quota"}}', True),
        (b'{"error": {"code": 400, "message": "Failed to parse messages: y"}}', True),
        (b"This model's maximum context length is 4096 tokens", True),
        (b'{"error": {"message": "x", "code": 429}}', False),
        (b'{"error": {"message": "upstream timed out", "type": "server_error"}}', False),
        (b'{"error": {"message": "overloaded", "type": "overloaded_error"}}', False),
        (b"<html>502 Bad Gateway</html>", False),
        (b"", False),
    ],
)
def test_permanent_errors(body: bytes, permanent: bool) -> None:
    assert parse_error_body(body, 500).permanent is permanent


def test_http_error_reasons() -> None:
    error = http_error("p (u)", 500, b'{"error": {"message": "Input should be a valid string"}}')
    assert (str(error), error.retryable, error.status_code) == (
        "p (u): HTTP 500: Input should be a valid string",
        False,
        500,
    )
    error = http_error("p (u)", 503, b"")
    assert (str(error), error.retryable) == ("p (u): HTTP 503 with an empty body", True)
    error = http_error("p (u)", 404, b'{"error": {"type": "not_found_error"}}')
    assert (str(error), error.retryable) == ("p (u): HTTP 404 not_found_error", False)


def test_one_line() -> None:
    assert one_line("a\n\n b\tc\r\n") == "a b c"
    assert one_line("x" * 10, 5) == "xxxx\u2026"


def test_call_ids() -> None:
    ids = CallIds(["a", "a_2", "b"])
    assert [ids.unique(i) for i in ("a", "c", "c", "b", "a")] == ["a_3", "c", "c_2", "b_2", "a_4"]
    assert CallIds().unique("x") == "x"


def test_sse_decoder_counts_event_stream_lines() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"<html>\nnot: a stream\n\n")
    assert decoder.fields == 0
    decoder.feed(b": comment\nretry: 5\n")
    assert decoder.fields == 2


def test_timeouts_have_no_read_timeout() -> None:
    timeout = make_timeout(3.0)
    assert timeout.read is None
    assert timeout.connect == 3.0
    assert timeout.pool is None


# ----------------------------------------------------------- client ownership


def is_closed(client: httpx.AsyncClient) -> bool:
    return client.is_closed


async def test_client_ownership() -> None:
    ownership = ClientOwnership(None, make_timeout(1.0))
    client, owned = ownership.borrow()
    assert owned
    await client.aclose()
    ownership.open()
    ownership.open()  # nested `async with model:` blocks share one pooled client
    pooled = ownership.pooled
    assert pooled is not None
    assert ownership.borrow() == (pooled, False)
    await ownership.close()
    assert not is_closed(pooled)
    await ownership.close()
    assert is_closed(pooled)
    assert ownership.pooled is None

    async with httpx.AsyncClient() as given:
        ownership = ClientOwnership(given, make_timeout(1.0))
        ownership.open()
        assert ownership.borrow() == (given, False)
        await ownership.close()
        assert not given.is_closed


async def test_async_with_model_is_reentrant() -> None:
    model = OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1")
    async with model as entered:
        assert entered is model
        async with model:
            pass


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="model"):
        OpenAIChatModel("")
    with pytest.raises(ValueError, match="max_retries"):
        OpenAIChatModel("m", max_retries=-1)
    with pytest.raises(ValueError, match="connect_timeout"):
        AnthropicModel("m", connect_timeout=-1)
    with pytest.raises(ValueError, match="max_tokens"):
        AnthropicModel("m", max_tokens=0)
    with pytest.raises(TypeError, match=r"httpx\.AsyncClient"):
        OpenAIChatModel("m", client="nope")  # type: ignore[arg-type]
    assert "sk-secret" not in repr(OpenAIChatModel("m", api_key="sk-secret"))
    assert "sk-secret" not in repr(AnthropicModel("m", api_key="sk-secret"))


# ------------------------------------------------------ httpx.MockTransport


def sse_response(body: bytes, status: int = 200) -> httpx.Response:
    return httpx.Response(status, headers={"content-type": "text/event-stream"}, content=body)


async def collect(model: HTTPStreamingModel) -> list[ModelEvent]:
    async with model.stream(REQUEST) as stream:
        return [event async for event in stream]


async def test_mock_transport_crlf_comments_event_lines_and_multiline_data() -> None:
    first = json.dumps({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}, indent=1)
    data_lines = b"".join(b"data: " + line.encode() + b"\r\n" for line in first.split("\n"))
    body = (
        b": keepalive\r\n\r\n"
        b"event: message\r\n" + data_lines + b"\r\n"
        b'data: {"choices": [{"index": 0, "delta": {"content": " there"}}]}\r\n\r\n'
        b": keepalive\r\n\r\n"
        b'data: {"choices": [{"index": 1, "delta": {"content": "other choice"}}]}\r\n\r\n'
        b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\r\n\r\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return sse_response(body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel("m", base_url="http://llm.test/v1", client=client, api_key="k")
        with trio.fail_after(10):
            events = await collect(model)
        assert not client.is_closed
    assert events == [TextDelta("Hi"), TextDelta(" there"), Usage(3, 2), Finish("stop")]
    assert str(seen[0].url) == "http://llm.test/v1/chat/completions"
    assert seen[0].headers["authorization"] == "Bearer k"


async def test_mock_transport_tool_call_without_index_or_id() -> None:
    # Some OpenAI-compatible servers leave out the index, and sometimes the id.
    chunks = [
        {"choices": [{"delta": {"tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"function": {"arguments": "}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
    ]
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    body += b"data: [DONE]\n\n"
    transport = httpx.MockTransport(lambda request: sse_response(body))
    async with httpx.AsyncClient(transport=transport) as client:
        events = await collect(OpenAIChatModel("m", base_url="http://x/v1", client=client))
    call = events[0]
    assert isinstance(call, ToolCallDone)
    assert call.call.name == "f"
    assert call.call.arguments == "{}"
    assert call.call.call_id.startswith("call_")
    assert events[1] == Finish("tool_calls")


async def test_mock_transport_connect_errors_are_retried_then_given_up() -> None:
    attempts = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        raise httpx.ConnectError("connection refused", request=request)

    transport = httpx.MockTransport(handler)
    async with httpx.AsyncClient(transport=transport) as client:
        model = OpenAIChatModel(
            "m", base_url="http://x/v1", client=client, max_retries=4, retry_base_delay=0.001
        )
        with trio.fail_after(10), pytest.raises(ModelError, match="gave up after 5 attempts"):
            await collect(model)
    assert attempts == 5


async def test_mock_transport_zero_retries() -> None:
    attempts = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        return httpx.Response(503, text="upstream down")

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel("m", base_url="http://x/v1", client=client, max_retries=0)
        with trio.fail_after(10), pytest.raises(ModelError, match="HTTP 503: upstream down"):
            await collect(model)
    assert attempts == 1


async def test_mock_transport_retry_after_too_long_is_not_waited_for() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"retry-after": "3600"}, json={"error": "quota"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel("m", base_url="http://x/v1", client=client)
        with trio.fail_after(10), pytest.raises(ModelError, match="retry after 3600 s") as info:
            await collect(model)
    assert info.value.status_code == 429
    assert info.value.retryable


async def test_unsupported_url_fails_without_retry() -> None:
    model = OpenAIChatModel("m", base_url="ftp://example.invalid/v1", retry_base_delay=30)
    with trio.fail_after(10), pytest.raises(ModelError, match="UnsupportedProtocol"):
        await collect(model)


async def test_mock_transport_anthropic_crlf() -> None:
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"message": {"usage": {"input_tokens": 4, "output_tokens": 1}}}),
        ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": "A"}}),
        ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "B"}}),
        ("content_block_stop", {"index": 0}),
        ("message_delta", {"delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 9}}),
        ("message_stop", {}),
    ]
    body = b"".join(
        f"event: {kind}\r\ndata: {json.dumps({'type': kind, **data})}\r\n\r\n".encode()
        for kind, data in events
    )
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return sse_response(body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = AnthropicModel("c", base_url="http://x", client=client)
        got = await collect(model)
    assert got == [TextDelta("A"), TextDelta("B"), Usage(4, 9), Finish("length")]
    assert str(seen[0].url) == "http://x/v1/messages"
    assert "x-api-key" not in seen[0].headers


# -------------------------------------------- why the stream unwinds httpx


async def test_abandoned_httpx_generators_warn_but_model_streams_do_not(
    nursery: trio.Nursery,
) -> None:
    """The control: iterating ``response.aiter_bytes()`` and being cancelled between
    chunks leaves httpx's inner async generators to the GC, and Trio warns. A model
    stream cancelled at the same point leaves nothing behind."""
    server = SSEServer()
    await nursery.start(server.serve)
    hold = Reply(events=[SSE({"choices": [{"index": 0, "delta": {"content": "x"}}]})], end="hold")
    server.add(hold, hold)

    # A bound against hangs, never a wait: gc.collect() over a whole suite's heap on a
    # loaded machine once took longer than 10 s here.
    with trio.fail_after(60):
        with warnings.catch_warnings(record=True) as naive:
            warnings.simplefilter("always")
            async with httpx.AsyncClient() as client:
                with trio.CancelScope() as scope:
                    async with client.stream("POST", f"{server.base_url}/v1/x") as response:
                        async for _chunk in response.aiter_bytes():
                            scope.cancel()
                            await trio.sleep_forever()
                await settle()
        assert any("garbage collected" in str(w.message) for w in naive), naive

        with warnings.catch_warnings(record=True) as ours:
            warnings.simplefilter("always")
            model = OpenAIChatModel("m", base_url=f"{server.base_url}/v1")
            with trio.CancelScope() as scope:
                async with model.stream(REQUEST) as stream:
                    async for _event in stream:
                        scope.cancel()
                        await trio.sleep_forever()
            await settle()
        assert [str(w.message) for w in ours] == []
        await server.connections[1].closed.wait()


# ------------------------------------------------------------------ from_string


def test_from_string_openai() -> None:
    model = from_string("openai:gpt-4o-mini")
    assert isinstance(model, OpenAIChatModel)
    assert model.model == "gpt-4o-mini"
    assert model.base_url == "https://api.openai.com/v1"


def test_from_string_openai_with_base_url() -> None:
    model = from_string("openai:model@http://127.0.0.1:8000/v1")
    assert isinstance(model, OpenAIChatModel)
    assert (model.model, model.base_url) == ("model", "http://127.0.0.1:8000/v1")
    ollama = from_string("openai:llama3.1:8b@http://127.0.0.1:11434/v1/")
    assert isinstance(ollama, OpenAIChatModel)
    assert (ollama.model, ollama.base_url) == ("llama3.1:8b", "http://127.0.0.1:11434/v1")


def test_from_string_anthropic() -> None:
    model = from_string("anthropic:claude-3-5-haiku-latest")
    assert isinstance(model, AnthropicModel)
    assert model.model == "claude-3-5-haiku-latest"
    assert model.base_url == "https://api.anthropic.com"
    vertex_style = from_string("anthropic:claude-3-5-sonnet@20240620")
    assert isinstance(vertex_style, AnthropicModel)
    assert vertex_style.model == "claude-3-5-sonnet@20240620"
    proxied = from_string("anthropic:claude-x@https://proxy.test")
    assert isinstance(proxied, AnthropicModel)
    assert (proxied.model, proxied.base_url) == ("claude-x", "https://proxy.test")


def test_from_string_demo_and_options() -> None:
    assert isinstance(from_string("demo"), DemoModel)
    model = from_string("openai:m", api_key="k", temperature=0.3)
    assert isinstance(model, OpenAIChatModel)
    assert model.settings == {"temperature": 0.3}


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "gpt-4o",
        "openai:",
        "openai:@http://x",
        "openai-responses:",
        "openai-chat:gpt",
        "mistral:large",
        "demo:x",
        "OpenAI:gpt",
    ],
)
def test_from_string_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError, match="unknown model spec") as info:
        from_string(spec)
    forms = ('"demo"', '"openai:<model>"', '"openai-responses:<model>"', '"anthropic:<model>"')
    for form in (*forms, "<base_url>"):
        assert form in str(info.value)


def test_from_string_type_error() -> None:
    bad: Any = 42
    with pytest.raises(TypeError):
        from_string(bad)


def test_max_retry_after_is_sane() -> None:
    assert 1 <= MAX_RETRY_AFTER <= 600


class StallingUpload(httpx.AsyncBaseTransport):
    """A transport that reads the first chunk of the request body and then hangs: a
    cancellation lands while the body's iterator is suspended mid-upload."""

    def __init__(self) -> None:
        self.started = trio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        async for _chunk in request.stream:
            self.started.set()
            await trio.sleep_forever()
        raise AssertionError("unreachable")


async def test_cancel_during_the_request_upload_leaves_no_generator() -> None:
    """httpx's own request body (``ByteStream.__aiter__``) is an async generator that a
    cancellation during the upload abandons (the control); the model's body is not."""

    # A bound against hangs, never a wait: gc.collect() over a whole suite's heap on a
    # loaded machine once took longer than 10 s here.
    with trio.fail_after(60):
        with warnings.catch_warnings(record=True) as naive:
            warnings.simplefilter("always")
            transport = StallingUpload()
            async with httpx.AsyncClient(transport=transport) as client:
                with trio.CancelScope() as scope:
                    async with trio.open_nursery() as nursery:

                        async def send() -> None:
                            async with client.stream("POST", "http://x/", json={"a": 1}):
                                pass

                        nursery.start_soon(send)
                        await transport.started.wait()
                        scope.cancel()
                await settle()
        assert any("ByteStream" in str(w.message) for w in naive), naive

        with warnings.catch_warnings(record=True) as ours:
            warnings.simplefilter("always")
            transport = StallingUpload()
            async with httpx.AsyncClient(transport=transport) as client:
                model = OpenAIChatModel("m", base_url="http://x/v1", client=client)
                with trio.CancelScope() as scope:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(collect, model)
                        await transport.started.wait()
                        scope.cancel()
                await settle()
        assert [str(w.message) for w in ours] == []


# ------------------------------------------- every failure is a ModelError


async def test_a_setting_that_is_not_json_is_a_model_error() -> None:
    transport = httpx.MockTransport(lambda request: sse_response(b"data: [DONE]\n\n"))
    async with httpx.AsyncClient(transport=transport) as client:
        model = OpenAIChatModel("m", base_url="http://x/v1", client=client, seed=object())
        with trio.fail_after(10), pytest.raises(ModelError, match="request cannot be built"):
            await collect(model)


class _KeyErrorParser:
    done = False

    def feed(self, event: SSEEvent) -> list[ModelEvent]:
        return [TextDelta(json.loads(event.data)["missing"])]

    def at_eof(self) -> list[ModelEvent] | None:
        return None


class _CarelessModel(HTTPStreamingModel):
    """A provider whose parser assumes every event has a field."""

    _provider = "careless"

    def _build_request(self, request: ModelRequest) -> HTTPRequestSpec:
        return HTTPRequestSpec("http://x/v1/go", {}, {})

    def _new_parser(self, call_ids: CallIds) -> StreamParser:
        return _KeyErrorParser()


async def test_a_parser_bug_reaches_the_caller_as_a_model_error() -> None:
    transport = httpx.MockTransport(lambda request: sse_response(b'data: {"x": 1}\n\n'))
    async with httpx.AsyncClient(transport=transport) as client:
        model = _CarelessModel(
            "careless-model",
            client=client,
            max_retries=0,
            connect_timeout=1,
            retry_base_delay=0,
            retry_max_delay=0,
        )
        with trio.fail_after(10), pytest.raises(ModelError) as info:
            await collect(model)
    assert str(info.value) == (
        "careless (http://x/v1/go): could not read the event '{\"x\": 1}': KeyError: 'missing'"
    )
    assert isinstance(info.value.__cause__, KeyError)
