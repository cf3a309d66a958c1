"""Model strings and API keys, for every HTTP provider, against real loopback servers.

A model string must never send a request to a host its writer did not name
(docs/models.md, "Model strings"): the tests point the provider's default base URL
(``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL``) at a *decoy* loopback server, so a string
misparsed into "the default host" is caught by the decoy receiving a request. Keys are
read when the model is called, not when it is built.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import trio_agents as ta
from tests.support.provider_table import PROVIDERS, REQUEST
from tests.support.sse_server import SSEServer
from trio_agents.models import OpenAIChatModel, from_string
from trio_agents.models._model_string import ModelSpecError

DEFAULT_BASES = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}


async def _serve(nursery: trio.Nursery) -> SSEServer:
    server = SSEServer()
    await nursery.start(server.serve)
    return server


async def _call(model: Any) -> None:
    async with model.stream(REQUEST) as stream:
        async for _event in stream:
            pass


# ------------------------------------------------------------ where requests go


@pytest.mark.parametrize("name", PROVIDERS)
async def test_a_model_string_sends_exactly_where_it_names(
    name: str, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = PROVIDERS[name]
    target, decoy = await _serve(nursery), await _serve(nursery)
    monkeypatch.setenv(provider.base_env, decoy.base_url)
    target.add(provider.reply(), provider.reply())
    for spec in (
        f"{name}:gpt-x@{target.base_url}/v1",
        f"{name}:org/gpt-x:8b@20240620@{target.base_url}/v1/",  # '@' and ':' in the name
    ):
        model = from_string(spec)
        assert isinstance(model, provider.cls)
        await _call(model)
    assert [r.path for r in target.requests] == [provider.path] * 2
    assert [r.json["model"] for r in target.requests] == ["gpt-x", "org/gpt-x:8b@20240620"]
    assert decoy.requests == []


@pytest.mark.parametrize("name", PROVIDERS)
async def test_a_base_url_with_user_info_is_refused_and_nothing_is_sent(
    name: str, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29 item 7: the user info used to hide the URL, and the whole rest became
    the model name, sent with its credentials to the default (public) host."""
    provider = PROVIDERS[name]
    target, decoy = await _serve(nursery), await _serve(nursery)
    monkeypatch.setenv(provider.base_env, decoy.base_url)
    decoy.add(provider.reply())
    spec = f"{name}:gpt-x@http://user:s3cr3t-pw@127.0.0.1:{target.port}/v1"

    async def build_and_call() -> None:
        await _call(from_string(spec))  # before the fix: reached the decoy

    with pytest.raises(ValueError, match="carries credentials") as caught:
        await build_and_call()
    assert "s3cr3t-pw" not in str(caught.value)
    assert "***" in str(caught.value)
    with pytest.raises(ValueError, match="carries credentials") as caught:
        ta.Agent(name="a", model=spec)
    assert "s3cr3t-pw" not in str(caught.value)
    assert str(caught.value).startswith("Agent(model='")
    assert decoy.requests == target.requests == []


AMBIGUOUS = [
    ("gpt-x@http://user:s3cr3t-pw@127.0.0.1:4000/v1", "carries credentials"),
    ("gpt-x@https://:s3cr3t-pw@127.0.0.1/v1", "carries credentials"),
    ("gpt-x@http://user@127.0.0.1/v1", "carries credentials"),
    ("gpt-x@127.0.0.1:4000/v1", "host without a scheme"),
    ("gpt-x@localhost", "host without a scheme"),
    ("gpt-x@LocalHost", "host without a scheme"),
    ("gpt-x@api.example.com", "host without a scheme"),
    ("gpt-x@", "followed by nothing"),
    ("gpt-x@@http://127.0.0.1/v1", "followed by nothing"),
    ("gpt-x@ftp://127.0.0.1/v1", "holds a URL"),
    ("gpt-x@HTTP://127.0.0.1/v1", "holds a URL"),
    ("gpt-x@ws://127.0.0.1/v1", "holds a URL"),
    ("gpt-x://y", "holds a URL"),
    ("gpt-x@http://evil.test@http://127.0.0.1/v1", "holds a URL"),
    ("gpt-x\uff20http://127.0.0.1/v1", "holds a URL"),  # a full-width at sign
    ("gpt-x@http://", "no valid host"),
    ("gpt-x@http:///v1", "no valid host"),
    ("gpt-x@http://-bad/v1", "no valid host"),
    ("gpt-x@http://127.0.0.1:0/v1", "port"),
    ("gpt-x@http://127.0.0.1:65536/v1", "port"),
    ("gpt-x@http://127.0.0.1:/v1", "port"),
    ("gpt-x@http://127.0.0.1:80a/v1", "port"),
    ("gpt-x@http://::1/v1", "no valid host"),
    ("gpt-x@http://127.0.0.1/v1?key=1", "query or fragment"),
    ("gpt-x@http://127.0.0.1/v1#x", "query or fragment"),
    ("gpt-x@http://127.0.0.1/v1?", "query or fragment"),
    ("gpt-x@http://%31%32%37.0.0.1/v1", "escape"),
    ("gpt-x@http://127.0.0.1\\@evil.test/v1", "escape"),
    ("gpt-x@http://\u0430pi.example.com/v1", "non-ASCII"),  # a Cyrillic a
    ("gpt-x @http://127.0.0.1/v1", "whitespace"),
    ("gpt-x@http://127.0.0.1/v 1", "whitespace"),
    ("gpt-x\t@http://127.0.0.1/v1", "whitespace"),
    ("gpt\u200b-x@http://127.0.0.1/v1", "control character"),  # zero-width space
    ("gpt-x\n", None),  # stripped at the ends: accepted (see ACCEPTED)
]


@pytest.mark.parametrize("name", PROVIDERS)
@pytest.mark.parametrize(("rest", "problem"), [a for a in AMBIGUOUS if a[1] is not None])
def test_an_ambiguous_model_string_is_refused(name: str, rest: str, problem: str) -> None:
    spec = f"{name}:{rest}"
    with pytest.raises(ModelSpecError, match=problem) as caught:
        from_string(spec)
    assert "s3cr3t-pw" not in str(caught.value)
    with pytest.raises(ValueError, match=problem):
        ta.Agent(name="a", model=spec)


ACCEPTED = [
    ("gpt-x", "gpt-x", None),
    ("gpt-x \n", "gpt-x", None),  # the whole string is stripped at its ends
    ("llama3.1:8b@http://127.0.0.1:11434/v1", "llama3.1:8b", "http://127.0.0.1:11434/v1"),
    ("claude-3-5-sonnet@20240620", "claude-3-5-sonnet@20240620", None),
    ("claude@20240620@https://proxy.test", "claude@20240620", "https://proxy.test"),
    ("m@http://[::1]:8000/v1/", "m", "http://[::1]:8000/v1"),
    ("m@http://[::1]/v1", "m", "http://[::1]/v1"),
    ("m@http://LOCALHOST:1/", "m", "http://LOCALHOST:1"),
    ("m@https://host.test:65535", "m", "https://host.test:65535"),
    ("modèle-ü", "modèle-ü", None),  # a non-ASCII model name is the server's business
    ("org/name:tag", "org/name:tag", None),
]


@pytest.mark.parametrize("name", ["openai", "anthropic"])
@pytest.mark.parametrize(("rest", "model", "base_url"), ACCEPTED)
def test_accepted_model_strings(name: str, rest: str, model: str, base_url: str | None) -> None:
    built: Any = from_string(f"{name}:{rest}")
    assert built.model == model
    # What the model's constructor makes of the URL (Anthropic's drops a final /v1).
    expected = type(built)("x", base_url=base_url).base_url if base_url else DEFAULT_BASES[name]
    assert built.base_url == expected


_PIECES = st.sampled_from(
    ["@", ":", "/", ".", "http", "https", "://", "h", "1", "user", "[", "]", "%", "?", "-", "é"]
)


@given(rest=st.lists(_PIECES, max_size=12).map("".join))
def test_any_model_string_names_its_host_or_none(rest: str) -> None:
    """Whatever the string: either it is refused, or it names no URL at all and the
    default base is used, or its base URL is exactly the text after the last
    ``@http(s)://`` and the model name is exactly the text before it."""
    spec = f"openai:{rest}"
    try:
        model = from_string(spec)
    except ValueError:
        return
    assert isinstance(model, OpenAIChatModel)
    cut = max(rest.rfind("@http://"), rest.rfind("@https://"))
    if cut < 0:
        assert "://" not in rest
        assert model.base_url == DEFAULT_BASES["openai"]
        assert model.model == rest.strip()
    else:
        assert model.model == rest[:cut]
        assert model.base_url == rest[cut + 1 :].rstrip("/").removesuffix("/chat/completions")
        assert "://" not in model.model
        assert "@" not in model.base_url


# ------------------------------------------------------------------------- API keys


@pytest.mark.parametrize("name", PROVIDERS)
async def test_the_api_key_is_read_when_the_model_is_called(
    name: str, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29 item 8: an agent built at import time, before a .env is loaded, sends
    the key the environment has when the model is called, every call anew."""
    provider = PROVIDERS[name]
    server = await _serve(nursery)
    server.add(*(provider.reply() for _ in range(4)))
    agent = ta.Agent(name="early", model=f"{name}:m@{server.base_url}/v1")  # "import time"
    explicit = from_string(f"{name}:m@{server.base_url}/v1", api_key="explicit-key")
    monkeypatch.setenv(provider.key_env, "loaded-later")  # the .env is loaded
    await _call(agent.model)
    monkeypatch.setenv(provider.key_env, "rotated")
    await _call(agent.model)
    await _call(explicit)  # an explicit api_key= wins over the environment
    monkeypatch.delenv(provider.key_env)
    await _call(agent.model)
    sent = [r.headers.get(provider.key_header) for r in server.requests]
    assert sent == [
        provider.key_value("loaded-later"),
        provider.key_value("rotated"),
        provider.key_value("explicit-key"),
        None,
    ]


@pytest.mark.parametrize("name", PROVIDERS)
async def test_an_explicit_empty_api_key_sends_none(
    name: str, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = PROVIDERS[name]
    server = await _serve(nursery)
    server.add(provider.reply())
    model = from_string(f"{name}:m@{server.base_url}/v1", api_key="")
    monkeypatch.setenv(provider.key_env, "from-env")
    await _call(model)
    assert server.requests[0].headers.get(provider.key_header) is None


def test_a_base_url_in_the_string_and_as_an_option_is_refused() -> None:
    with pytest.raises(ModelSpecError, match="base_url= is given too"):
        from_string("openai:m@http://127.0.0.1:1/v1", base_url="http://127.0.0.1:2/v1")
    # Without a URL in the string, base_url= is the one named.
    model = from_string("openai:m", base_url="http://127.0.0.1:2/v1")
    assert model.base_url == "http://127.0.0.1:2/v1"  # type: ignore[attr-defined]
