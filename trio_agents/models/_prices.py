"""What a model request cost (DESIGN §21): each HTTP model prices its own ``Usage``.

Prices come from the ``genai-prices`` package (the ``prices`` extra), never from a
table of ours, or from a :class:`TokenPrices` the user gives. Which prices apply is
decided once, when the model is built (:func:`make_pricer`):

- ``prices=None`` (the default): the provider's prices, and only for the provider's own
  default API root; a model served from another base URL (a local server, a proxy) is
  not priced (``cost=None``) — a guess would be worse than no figure;
- ``prices="<provider id>"``: genai-prices' prices of that provider (``"openai"``,
  ``"anthropic"``, ``"groq"``, ...), whatever the base URL;
- ``prices=True``: the provider's own prices whatever the base URL (a proxy that
  forwards to the provider);
- ``prices=TokenPrices(...)``: the user's own per-million-token prices;
- ``prices=False``: never priced.

Pricing never touches the network: genai-prices prices from the data it ships with
(its ``UpdatePrices`` background updater is never started here; a program that starts
it itself gets its fresher data). Its data is loaded when the model is built, so the
first request of a run does not stall the event loop on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final, TypeAlias, final

import attrs

from .._model import Usage

__all__ = ["Pricer", "Prices", "TokenPrices", "make_pricer"]

_MILLION: Final = Decimal(1_000_000)
logger = logging.getLogger("trio_agents.models")


def _to_decimal(value: object) -> Decimal:
    """A price as an exact Decimal (a float goes through its shortest repr, so ``0.15``
    is 0.15, not its binary neighbour)."""
    if isinstance(value, bool) or not isinstance(value, Decimal | int | float | str):
        raise TypeError(f"a price must be a Decimal, int, float or str, not {type(value).__name__}")
    price = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if not price.is_finite() or price < 0:
        raise ValueError(f"a price must be a finite number >= 0, got {value!r}")
    return price


def _to_optional_decimal(value: object) -> Decimal | None:
    return None if value is None else _to_decimal(value)


@final
@attrs.frozen(kw_only=True)
class TokenPrices:
    """Your own prices, in USD per million tokens, for a model genai-prices does not
    know (a private deployment, a local server you account for):
    ``OpenAIChatModel("llama3", base_url=..., prices=TokenPrices(input_mtok="0.2",
    output_mtok="0.6"))``.

    ``input_tokens`` counts every input token (DESIGN §21): the cache reads and writes
    among them are charged at ``cache_read_mtok`` / ``cache_write_mtok`` (default: the
    input price), the rest at ``input_mtok``.

    Attributes:
        input_mtok: USD per million uncached input tokens.
        output_mtok: USD per million output tokens.
        cache_read_mtok: USD per million input tokens read from the prompt cache.
        cache_write_mtok: USD per million input tokens written to the prompt cache.
    """

    input_mtok: Decimal = attrs.field(converter=_to_decimal)
    output_mtok: Decimal = attrs.field(converter=_to_decimal)
    cache_read_mtok: Decimal | None = attrs.field(default=None, converter=_to_optional_decimal)
    cache_write_mtok: Decimal | None = attrs.field(default=None, converter=_to_optional_decimal)

    def cost(self, usage: Usage) -> Decimal:
        """What ``usage`` costs at these prices, in USD (exact)."""
        read = usage.cache_read_tokens or 0
        write = usage.cache_write_tokens or 0
        uncached = max(usage.input_tokens - read - write, 0)
        read_price = self.input_mtok if self.cache_read_mtok is None else self.cache_read_mtok
        write_price = self.input_mtok if self.cache_write_mtok is None else self.cache_write_mtok
        total = (
            uncached * self.input_mtok
            + read * read_price
            + write * write_price
            + usage.output_tokens * self.output_mtok
        )
        return total / _MILLION


Prices: TypeAlias = "str | TokenPrices | bool | None"
"""What an HTTP model's ``prices=`` accepts (see :func:`make_pricer`)."""

Pricer: TypeAlias = Callable[[Usage], Usage]
"""Gives a ``Usage`` its ``cost``."""


def _genai_prices() -> Any:
    """The ``genai_prices`` module, or None when the ``prices`` extra is not installed."""
    try:
        # Optional, and slow to import (half a second): only when a model is priced.
        import genai_prices
    except ImportError:
        return None
    return genai_prices


def _genai_pricer(module: Any, provider_id: str, model: str) -> Pricer | None:
    """genai-prices' price of ``model`` at ``provider_id``; None if it knows no price."""
    from genai_prices import data_snapshot

    try:
        # Loads the bundled data now (not at the first request) and checks the model.
        data_snapshot.get_snapshot().find_provider_model(model, None, provider_id, None)
    except LookupError:
        return None
    calc_price = module.calc_price
    usage_type = module.Usage

    def price(usage: Usage) -> Usage:
        if usage.cost is not None:
            return usage
        counts: dict[str, int] = {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
        }
        if usage.cache_read_tokens:
            counts["cache_read_tokens"] = usage.cache_read_tokens
        if usage.cache_write_tokens:
            counts["cache_write_tokens"] = usage.cache_write_tokens
        try:
            found = calc_price(usage_type(**counts), model, provider_id=provider_id)
            cost = Decimal(found.total_price)
        except (LookupError, ValueError):
            return usage  # e.g. a model whose price ended: unknown, never a guess
        except Exception:
            # A price is a figure beside the answer: a fault in the price data must
            # never fail the run that was answered. Unknown, and said once in the log.
            logger.warning(
                "genai-prices failed to price %r at %r", model, provider_id, exc_info=True
            )
            return usage
        return attrs.evolve(usage, cost=cost)

    return price


def _own_pricer(prices: TokenPrices) -> Pricer:
    def price(usage: Usage) -> Usage:
        if usage.cost is not None:
            return usage
        return attrs.evolve(usage, cost=prices.cost(usage))

    return price


def make_pricer(
    prices: object, *, provider_id: str, model: str, default_url: bool
) -> Pricer | None:
    """The pricer of an HTTP model (see the module docstring), or None: not priced.

    Args:
        prices: the model's ``prices=`` keyword.
        provider_id: genai-prices' id of the provider whose API the model speaks.
        model: the model name sent with every request.
        default_url: whether the model is served from the provider's own API root.

    Raises:
        TypeError: ``prices`` is of the wrong type.
        ValueError: ``prices`` names a provider genai-prices does not know.
        ImportError: ``prices`` names a provider, and genai-prices is not installed.
    """
    if isinstance(prices, TokenPrices):
        return _own_pricer(prices)
    if prices is False:
        return None
    if prices is None or prices is True:
        if prices is None and not default_url:
            return None
        module = _genai_prices()
        return None if module is None else _genai_pricer(module, provider_id, model)
    if not isinstance(prices, str):
        raise TypeError(
            f"prices must be a provider id (str), a TokenPrices, a bool or None, "
            f"not {type(prices).__name__}"
        )
    module = _genai_prices()
    if module is None:
        raise ImportError(
            f"prices={prices!r} needs the genai-prices package: pip install 'trio-agents[prices]'"
        )
    from genai_prices import data_snapshot

    snapshot = data_snapshot.get_snapshot()
    if data_snapshot.find_provider_by_id(snapshot.providers, prices) is None:
        raise ValueError(f"prices: genai-prices knows no provider {prices!r}")
    pricer = _genai_pricer(module, prices, model)
    if pricer is None:
        raise ValueError(f"prices: genai-prices knows no price of {model!r} at {prices!r}")
    return pricer
