"""The cache figures a LiteLLM proxy reports, read by ``OpenAIChatModel`` (DESIGN §21).

LiteLLM answers in OpenAI's Chat Completions shape for every provider it fronts, and
names the cache figures its own way (``litellm/types/utils.py``, ``Usage``, and
``litellm/llms/anthropic/chat/transformation.py``, ``calculate_usage``, in LiteLLM's
repository):

* ``prompt_tokens`` counts every input token: for an Anthropic model it is Anthropic's
  ``input_tokens + cache_creation_input_tokens + cache_read_input_tokens``;
* ``prompt_tokens_details.cached_tokens``: the tokens read from the cache (OpenAI's
  field, filled for every provider), and, in its newer releases (1.106.2 here),
  ``prompt_tokens_details.cache_write_tokens`` (mirrored as ``cache_creation_tokens``):
  those written to it;
* for an Anthropic model, the top-level ``cache_read_input_tokens`` and
  ``cache_creation_input_tokens`` as well (Anthropic's names, passed on);
* DeepSeek's ``prompt_cache_hit_tokens`` becomes ``cached_tokens`` too.

Each shape is served here by a real loopback server (``sse_server.py``) exactly as the
proxy streams it: the usage chunk after the finish, with an empty choice of its own.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.chat_wire import DONE, chunk
from tests.support.models_requests import chat_model
from tests.support.sse_server import SSE, Reply, SSEServer
from trio_agents.models import TokenPrices

# An Anthropic model behind the proxy: 100 uncached input tokens, 800 read from the
# cache and 50 written to it, 20 output tokens.
UNCACHED, READ, WRITTEN, OUTPUT = 100, 800, 50, 20
PROMPT = UNCACHED + READ + WRITTEN


def _litellm_usage(**fields: Any) -> dict[str, Any]:
    """The proxy's last chunk: its usage, and an empty choice (LiteLLM sends one)."""
    return {
        **chunk(),
        "model": "claude-sonnet-4-5",
        "usage": {
            "prompt_tokens": PROMPT,
            "completion_tokens": OUTPUT,
            "total_tokens": PROMPT + OUTPUT,
            **fields,
        },
    }


SHAPES = {
    # LiteLLM's current releases, an Anthropic model: both places.
    "anthropic, newer": _litellm_usage(
        prompt_tokens_details={
            "audio_tokens": None,
            "cached_tokens": READ,
            "text_tokens": None,
            "image_tokens": None,
            "cache_write_tokens": WRITTEN,
            "cache_creation_tokens": WRITTEN,
        },
        cache_creation_input_tokens=WRITTEN,
        cache_read_input_tokens=READ,
    ),
    # Its older releases: no cache_write_tokens in the details.
    "anthropic, older": _litellm_usage(
        prompt_tokens_details={"cached_tokens": READ},
        cache_creation_input_tokens=WRITTEN,
        cache_read_input_tokens=READ,
    ),
    # A proxy that passes Anthropic's names on without OpenAI's details.
    "anthropic names only": _litellm_usage(
        cache_creation_input_tokens=WRITTEN, cache_read_input_tokens=READ
    ),
}


def _reply(usage_chunk: dict[str, Any]) -> Reply:
    return Reply(
        events=[
            SSE(chunk("", role="assistant")),
            SSE(chunk("cached")),
            SSE(chunk(finish="stop")),
            SSE(usage_chunk),
            DONE,
        ]
    )


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_litellm_cache_fields_reach_the_runs_usage_and_its_cost(
    server: SSEServer, shape: str
) -> None:
    # Before: the cache writes were dropped (only cached_tokens was read), so a cache
    # write was priced as plain input.
    server.add(_reply(SHAPES[shape]))
    prices = TokenPrices(
        input_mtok="3", output_mtok="15", cache_read_mtok="0.3", cache_write_mtok="3.75"
    )
    agent = ta.Agent(name="a", model=chat_model(server, prices=prices))
    with trio.fail_after(10):
        result = await ta.run(agent, "hi")
    assert result.final_output == "cached"
    usage = result.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens) == (PROMPT, OUTPUT)
    assert (usage.cache_read_tokens, usage.cache_write_tokens) == (READ, WRITTEN)
    # 100 x 3 + 800 x 0.3 + 50 x 3.75 + 20 x 15, per million tokens, exactly.
    assert usage.cost == Decimal("0.0010275")


async def test_deepseek_cache_hits_through_a_proxy_are_cache_reads(server: SSEServer) -> None:
    server.add(_reply(_litellm_usage(prompt_cache_hit_tokens=READ, prompt_cache_miss_tokens=150)))
    agent = ta.Agent(name="a", model=chat_model(server))
    with trio.fail_after(10):
        result = await ta.run(agent, "hi")
    assert result.usage == ta.Usage(PROMPT, OUTPUT, cache_read_tokens=READ)


async def test_an_openai_model_behind_the_proxy_reports_no_cache_writes(server: SSEServer) -> None:
    # OpenAI never says what it wrote to the cache: unknown, not zero.
    server.add(_reply(_litellm_usage(prompt_tokens_details={"cached_tokens": 0})))
    agent = ta.Agent(name="a", model=chat_model(server))
    with trio.fail_after(10):
        result = await ta.run(agent, "hi")
    assert result.usage == ta.Usage(PROMPT, OUTPUT, cache_read_tokens=0)
