"""Usage.cost (DESIGN §21): each HTTP model prices its own requests from genai-prices'
data, only at the provider's own API root unless the user says whose prices apply;
sums over a run tree are exact. Whole runs on loopback servers speaking each wire."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import genai_prices
import httpx
import pytest
import trio

import trio_agents as ta
from tests.support import chat_wire
from tests.support.core_runs import assert_failed_with
from tests.support.core_trees import root_calling
from tests.support.provider_wires import WIRES, RoutedTransport
from tests.support.sse_server import SSE, Reply, SSEServer
from trio_agents.models import (
    AnthropicModel,
    FallbackModel,
    OpenAIChatModel,
    OpenAIResponsesModel,
    ScriptedModel,
    TokenPrices,
    Turn,
)


@ta.function_tool
def ping() -> str:
    """Answers pong."""
    return "pong"


# Each wire, a model name genai-prices knows, and its provider id there.
KNOWN: dict[str, tuple[Any, str, str]] = {
    "chat": (OpenAIChatModel, "gpt-4o", "openai"),
    "responses": (OpenAIResponsesModel, "gpt-4o", "openai"),
    "anthropic": (AnthropicModel, "claude-sonnet-4-5", "anthropic"),
}


def _genai_cost(usage: ta.Usage, model: str, provider: str) -> Decimal:
    counts = {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_read_tokens": usage.cache_read_tokens or 0,
        "cache_write_tokens": usage.cache_write_tokens or 0,
    }
    price = genai_prices.calc_price(genai_prices.Usage(**counts), model, provider_id=provider)
    return Decimal(price.total_price)


@pytest.mark.parametrize("name", list(KNOWN))
async def test_the_provider_api_root_is_priced_from_genai_prices(
    name: str, server: SSEServer
) -> None:
    wire = WIRES[name]
    cls, model_name, provider = KNOWN[name]
    server.add(wire.cached())
    async with httpx.AsyncClient(transport=RoutedTransport(server)) as client:
        agent = ta.Agent(name="a", model=cls(model_name, client=client))  # default base URL
        with trio.fail_after(10):
            result = await ta.run(agent, "hi")
    assert result.usage is not None
    expected = _genai_cost(wire.cached_usage, model_name, provider)
    assert expected > 0
    assert result.usage.cost == expected
    assert result.usage.cache_read_tokens == wire.cached_usage.cache_read_tokens
    assert result.usage.to_json()["cost"] == str(expected)


@pytest.mark.parametrize("name", list(KNOWN))
async def test_an_unknown_model_or_another_base_url_has_no_cost(
    name: str, server: SSEServer
) -> None:
    wire = WIRES[name]
    cls, model_name, _ = KNOWN[name]
    server.add(wire.cached(), wire.cached())
    async with httpx.AsyncClient(transport=RoutedTransport(server)) as client:
        unknown = ta.Agent(name="a", model=cls("my-own-finetune-xyz", client=client))
        # A known model name on a local server: whose prices apply is not guessed.
        base = f"{server.base_url}/v1" if name != "anthropic" else server.base_url
        local = ta.Agent(name="b", model=cls(model_name, base_url=base))
        with trio.fail_after(10):
            results = [await ta.run(unknown, "hi"), await ta.run(local, "hi")]
    for result in results:
        assert result.usage == wire.cached_usage
        assert result.usage is not None
        assert result.usage.cost is None
        assert "cost" not in result.usage.to_json()


async def test_prices_given_price_a_local_server(server: SSEServer) -> None:
    wire = WIRES["chat"]
    server.add(wire.cached(), wire.cached())
    base = f"{server.base_url}/v1"
    own = TokenPrices(input_mtok="0.3", output_mtok=Decimal("1.1"), cache_read_mtok=0.03)
    theirs = ta.Agent(name="a", model=OpenAIChatModel("gpt-4o", base_url=base, prices="openai"))
    mine = ta.Agent(name="b", model=OpenAIChatModel("llama-3-local", base_url=base, prices=own))
    with trio.fail_after(10):
        priced_as_openai = await ta.run(theirs, "hi")
        priced_as_mine = await ta.run(mine, "hi")
    assert priced_as_openai.usage is not None
    assert priced_as_mine.usage is not None
    assert priced_as_openai.usage.cost == _genai_cost(wire.cached_usage, "gpt-4o", "openai")
    # (2006 - 1920) uncached at 0.3, 1920 cached at 0.03, 300 out at 1.1, per million:
    # 25.8 + 57.6 + 330 = 413.4 millionths of a dollar.
    assert priced_as_mine.usage.cost == Decimal("0.0004134")


def test_prices_that_cannot_apply_are_refused() -> None:
    with pytest.raises(ValueError, match="no provider 'no-such-provider'"):
        OpenAIChatModel("gpt-4o", base_url="http://127.0.0.1:1/v1", prices="no-such-provider")
    with pytest.raises(ValueError, match="no price of 'my-llama'"):
        OpenAIChatModel("my-llama", base_url="http://127.0.0.1:1/v1", prices="openai")
    with pytest.raises(TypeError, match="prices must be"):
        OpenAIChatModel("gpt-4o", prices=1.5)  # type: ignore[arg-type]  # what a caller may pass
    with pytest.raises(ValueError, match="finite number >= 0"):
        TokenPrices(input_mtok="-1", output_mtok=1)


async def test_costs_add_up_exactly_over_a_three_level_tree(nursery: trio.Nursery) -> None:
    # root -> two mids in parallel -> each two leaves in parallel (2 + 2*2 + 4
    # requests), each mid on its own loopback server (its replies in order), priced
    # with prices of ours whose per-request costs are not binary fractions.
    servers = [SSEServer() for _ in range(4)]
    for one in servers:
        await nursery.start(one.serve)
    root_server, mid1_server, mid2_server, leaf_server = servers
    prices = TokenPrices(input_mtok="0.1", output_mtok="0.7")

    def model(server: SSEServer) -> OpenAIChatModel:
        return OpenAIChatModel("m", base_url=f"{server.base_url}/v1", prices=prices)

    leaf = ta.Agent(name="leaf", model=model(leaf_server))
    for _ in range(4):
        leaf_server.add(chat_wire.text_reply("leaf ", "done"))  # usage (9, 2)
    mids = []
    for index, mid_server in enumerate((mid1_server, mid2_server), 1):
        mid_server.add(
            chat_wire.tool_reply(("c1", "leaf", '{"input": "x"}'), ("c2", "leaf", '{"input": "y"}'))
        )  # usage (20, 5)
        mid_server.add(chat_wire.text_reply("mid done"))  # usage (9, 1)
        mids.append(ta.Agent(name=f"mid{index}", model=model(mid_server), tools=[leaf.as_tool()]))
    root_server.add(
        chat_wire.tool_reply(("r1", "mid1", '{"input": "a"}'), ("r2", "mid2", '{"input": "b"}')),
        chat_wire.text_reply("all ", "done"),
    )  # usage (20, 5) then (9, 2)
    root = ta.Agent(name="root", model=model(root_server), tools=[mid.as_tool() for mid in mids])
    with trio.fail_after(20):
        result = await ta.run(root, "go")
    assert result.final_output == "all done"

    def cost(input_tokens: int, output_tokens: int) -> Decimal:
        return (input_tokens * Decimal("0.1") + output_tokens * Decimal("0.7")) / 1_000_000

    root_cost = cost(20, 5) + cost(9, 2)
    mid_cost = cost(20, 5) + cost(9, 1)
    leaf_cost = cost(9, 2)
    assert result.usage is not None
    assert result.tree_usage is not None
    assert result.usage.cost == root_cost
    assert result.tree_usage.cost == root_cost + 2 * mid_cost + 4 * leaf_cost
    assert result.tree_usage.input_tokens == 29 + 2 * 29 + 4 * 9


async def test_a_scripted_cost_is_kept_through_a_fallback_and_summed() -> None:
    usage = ta.Usage(10, 2, cache_read_tokens=4, cost=Decimal("0.000123"))
    model = FallbackModel(
        ScriptedModel([Turn(tool_calls=[("ping", {})], usage=usage), Turn("ok", usage=usage)])
    )
    agent = ta.Agent(name="a", model=model, tools=[ping])
    result = await ta.run(agent, "hi")
    assert result.usage is not None
    assert result.usage.cost == Decimal("0.000246")
    assert result.usage.cache_read_tokens == 8
    assert result.usage.cache_write_tokens is None  # no part said
    assert result.usage.to_json() == {
        "input_tokens": 20,
        "output_tokens": 4,
        "model": result.usage.model,
        "cache_read_tokens": 8,
        "cost": "0.000246",
    }


@pytest.mark.parametrize(
    "usage",
    [
        ta.Usage(1, 1, cost=0.5),  # type: ignore[arg-type]  # a float is not exact
        ta.Usage(1, 1, cost=Decimal("NaN")),
        ta.Usage(1, 1, cache_read_tokens=-1),
    ],
)
async def test_an_invalid_cost_or_cache_figure_fails_the_run(usage: ta.Usage) -> None:
    agent = ta.Agent(name="a", model=ScriptedModel([Turn("ok", usage=usage)]))
    result = await ta.run(agent, "hi")
    assert result.status == "failed"
    assert result.reason is not None
    assert "invalid usage" in result.reason


async def test_a_cost_limit_passed_in_a_child_fails_the_root_and_stops_the_siblings(
    nursery: trio.Nursery,
) -> None:
    spender_server, waiter_server = SSEServer(), SSEServer()
    for one in (spender_server, waiter_server):
        await nursery.start(one.serve)

    @ta.function_tool
    async def wait_for_the_sibling() -> str:
        """Returns once the sibling's request is streaming."""
        await waiter_server.wait_for_requests(1)
        return "it streams"

    # Output only, 2 USD per million: (20 in, 5 out) is 10 millionths, (9, 1) 2 more.
    # Input is free so that the estimate before each request (its input, priced from
    # the body's size) never refuses one: this is the check after a response.
    prices = TokenPrices(input_mtok=0, output_mtok=2)
    spender_server.add(
        chat_wire.tool_reply(("w1", "wait_for_the_sibling", "{}")),
        chat_wire.text_reply("spent"),
    )
    spender = ta.Agent(
        name="spender",
        model=OpenAIChatModel("m", base_url=f"{spender_server.base_url}/v1", prices=prices),
        tools=[wait_for_the_sibling],
    )
    waiter_server.add(Reply(events=[SSE(chat_wire.chunk("partial"))], end="hold"))
    waiter = ta.Agent(
        name="waiter", model=OpenAIChatModel("m", base_url=f"{waiter_server.base_url}/v1")
    )
    root = root_calling(spender, waiter)
    limits = ta.UsageLimits(cost=Decimal("0.000011"))
    with trio.fail_after(20):
        async with ta.open_run(root, "go", limits=limits) as run:
            tree = [e async for e in run.events(tree=True)]
        await waiter_server.connections[0].closed.wait()  # the sibling's stream was cut
    reason = "usage limit: cost 0.000012/0.000011"
    _, error = assert_failed_with(run, reason, ta.UsageLimitExceeded)
    assert (error.name, error.used, error.limit) == ("cost", Decimal("0.000012"), limits.cost)
    for child in run.children:
        assert child.result is not None
        assert child.result.status == "cancelled"
        terminal = [e for e in tree if e.run_id == child.id and isinstance(e, ta.RunUpdated)][-1]
        assert terminal.detail["by"] == run.id
        assert terminal.detail["reason"] == reason


async def test_an_unpriced_model_spends_nothing_of_a_cost_limit(server: SSEServer) -> None:
    server.add(WIRES["chat"].cached())
    agent = ta.Agent(name="a", model=OpenAIChatModel("m", base_url=f"{server.base_url}/v1"))
    result = await ta.run(agent, "hi", limits=ta.UsageLimits(cost=0))
    assert result.status == "completed"


def test_cost_limit_validation() -> None:
    assert ta.UsageLimits(cost=0.1).cost == Decimal("0.1")  # exactly, not the float
    assert ta.UsageLimits(cost="2.50").cost == Decimal("2.50")
    with pytest.raises(ValueError, match="cost must be a finite number"):
        ta.UsageLimits(cost=-1)
    with pytest.raises(TypeError, match="cost must be"):
        ta.UsageLimits(cost=True)


async def test_a_fault_in_the_price_data_never_fails_the_run(
    server: SSEServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_args: object, **_kwargs: object) -> object:
        raise RuntimeError("corrupt price data")

    server.add(WIRES["chat"].cached())
    monkeypatch.setattr(genai_prices, "calc_price", broken)
    async with httpx.AsyncClient(transport=RoutedTransport(server)) as client:
        agent = ta.Agent(name="a", model=OpenAIChatModel("gpt-4o", client=client))
        with trio.fail_after(10):
            result = await ta.run(agent, "hi")
    assert result.status == "completed"
    assert result.usage == WIRES["chat"].cached_usage  # cost None: unknown
    assert "genai-prices failed to price 'gpt-4o'" in caplog.text


# ------------------------------------------------------- the estimate before a request


async def test_a_request_whose_estimated_input_cost_passes_the_budget_is_not_sent(
    server: SSEServer,
) -> None:
    server.add(chat_wire.text_reply("never sent"))
    # 1 USD per million input tokens; the request body is over 4,000 bytes, so over
    # 1,000 tokens (four bytes a token): over 0.001 USD, twice the budget.
    model = OpenAIChatModel(
        "m", base_url=f"{server.base_url}/v1", prices=TokenPrices(input_mtok=1, output_mtok=0)
    )
    agent = ta.Agent(name="a", model=model)
    limits = ta.UsageLimits(cost=Decimal("0.0005"))
    async with model, ta.open_run(agent, "x" * 4000, limits=limits) as run:
        result = await run.wait()
    assert server.requests == []  # nothing was sent
    assert result.status == "failed"
    assert isinstance(result.error, ta.UsageLimitExceeded)
    error = result.error
    assert (error.name, error.limit, error.estimated) == ("cost", limits.cost, True)
    assert Decimal("0.001") < error.used < Decimal("0.0012")
    assert (
        result.reason == f"usage limit: cost {error.used:g}/0.0005 (estimated before the request)"
    )
    assert result.turns == 1  # the turn began; its request was refused before sending


async def test_an_estimate_within_the_budget_sends_the_request(server: SSEServer) -> None:
    server.add(chat_wire.text_reply("ok"))
    model = OpenAIChatModel(
        "m", base_url=f"{server.base_url}/v1", prices=TokenPrices(input_mtok=1, output_mtok=0)
    )
    request = ta.ModelRequest("", (ta.UserMessage("x" * 4000),))
    estimate = model.estimate_cost(request)
    assert estimate is not None
    assert Decimal("0.001") < estimate < Decimal("0.0012")
    async with model:
        result = await ta.run(
            ta.Agent(name="a", model=model), "x" * 4000, limits=ta.UsageLimits(cost="0.01")
        )
    assert result.status == "completed"
    assert len(server.requests) == 1
    # A model that knows no price makes no estimate.
    unpriced = OpenAIChatModel("m", base_url=f"{server.base_url}/v1")
    assert unpriced.estimate_cost(request) is None


class _Estimated:
    """A model of one's own that estimates its requests' cost (the optional method)."""

    def __init__(self, inner: ScriptedModel, estimate: object) -> None:
        self.inner = inner
        self.estimate = estimate

    def estimate_cost(self, request: ta.ModelRequest) -> object:
        return self.estimate

    def stream(self, request: ta.ModelRequest) -> Any:
        return self.inner.stream(request)


async def test_a_model_of_ones_own_may_estimate_the_cost_of_its_requests() -> None:
    scripted = ScriptedModel([Turn("a", usage=ta.Usage(1, 1, cost=Decimal("0.3")))])
    agent = ta.Agent(name="a", model=_Estimated(scripted, Decimal("0.5")))
    # 0 spent + 0.5 estimated fits 0.6: sent; it does not fit 0.4: refused.
    result = await ta.run(agent, "hi", limits=ta.UsageLimits(cost="0.6"))
    assert result.status == "completed"
    refused = await ta.run(agent, "hi", limits=ta.UsageLimits(cost="0.4"))
    assert refused.reason == "usage limit: cost 0.5/0.4 (estimated before the request)"
    assert len(scripted.requests) == 1  # the refused run sent nothing
    wrong = ta.Agent(name="b", model=_Estimated(scripted, 0.5))
    failed = await ta.run(wrong, "hi", limits=ta.UsageLimits(cost=1))
    assert failed.status == "failed"
    assert isinstance(failed.error, TypeError)
    assert "estimate_cost must return a Decimal or None, not float" in str(failed.error)


def test_a_fallback_model_estimates_with_its_first_member() -> None:
    priced = OpenAIChatModel(
        "m", base_url="http://127.0.0.1:9/v1", prices=TokenPrices(input_mtok=1, output_mtok=0)
    )
    request = ta.ModelRequest("", (ta.UserMessage("x" * 4000),))
    assert FallbackModel(priced, ScriptedModel([])).estimate_cost(request) == (
        priced.estimate_cost(request)
    )
    assert FallbackModel(ScriptedModel([]), priced).estimate_cost(request) is None
