"""The base class of the HTTP model providers, and the map of what they share.

The providers (:mod:`._openai`, :mod:`._responses`, :mod:`._anthropic`) only describe
their wire format: how to build the request body from a
:class:`~trio_agents.models.ModelRequest`, and how to turn server-sent events into model
events (a :class:`~._model_stream.StreamParser`). What they share is one module per job:

* :mod:`._sse` — the incremental ``text/event-stream`` decoder;
* :mod:`._error_bodies` — what an error response says, as a one-line ``ModelError``;
* :mod:`._retry` — which failures are retried, and the backoff (honouring
  ``Retry-After``);
* :mod:`._clients` — DESIGN §8: a caller's client is used and never closed;
  ``async with model:`` owns one pooled client for the block; otherwise each stream
  opens and closes its own;
* :mod:`._call_ids` — tool-call ids kept unique within a conversation;
* :mod:`._model_stream` — the async context manager and iterator ``stream()`` returns,
  and why it is a class that closes httpx's body with care;
* here, :class:`HTTPStreamingModel` — the constructor every provider shares (model
  name, base URL, API key, body settings, client, retries) and ``stream()``.
"""

from __future__ import annotations

import abc
import hashlib
import json
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from decimal import Decimal
from types import TracebackType
from typing import Any, Self

import httpx
import trio

from .._items import ToolCall, ToolResult
from .._model import ModelEvent, ModelRequest, Usage
from ._call_ids import CallIds
from ._clients import ClientOwnership, make_timeout
from ._model_stream import HTTPRequestSpec, ModelStream, StreamParser
from ._prices import Prices, make_pricer
from ._ratelimit import RateLimit, estimate_tokens
from ._retry import RetryPolicy

__all__ = [
    "HTTPStreamingModel",
    "bearer_headers",
    "cached_tokens",
    "check_count",
    "check_model_name",
    "prompt_cache_key",
    "reason_map",
    "take_cache",
    "take_native_output",
]


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """``Authorization: Bearer <key>`` (OpenAI's scheme), or no header without a key
    (fine for local servers)."""
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def cached_tokens(usage: Mapping[str, Any], details: str) -> int | None:
    """OpenAI's ``usage[details].cached_tokens`` (Chat: ``prompt_tokens_details``,
    Responses: ``input_tokens_details``): how many input tokens were read from the
    prompt cache; ``None`` when the server does not say."""
    found = usage.get(details)
    value = found.get("cached_tokens") if isinstance(found, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def take_cache(settings: dict[str, Any]) -> bool | str:
    """The ``cache`` setting (DESIGN §21: prompt caching), taken out of the body
    ``settings`` (it is ours, never a body field) and checked: ``False`` (absent),
    ``True``, or a non-empty str (OpenAI's ``prompt_cache_key``).

    Raises:
        TypeError: it is none of those.
    """
    cache = settings.pop("cache", False)
    if cache is None:
        return False
    if isinstance(cache, bool) or (isinstance(cache, str) and cache):
        return cache
    raise TypeError(f"the cache setting must be a bool or a non-empty str, not {cache!r}")


def prompt_cache_key(cache: bool | str, model: str, request: ModelRequest) -> str | None:
    """OpenAI's ``prompt_cache_key`` for ``cache``: the given str, or for ``True`` one
    derived from what stays the same across an agent's turns (the model, the
    instructions, the tools), so every request of an agent shares it and requests of
    other agents do not; ``None`` without caching."""
    if not cache:
        return None
    if isinstance(cache, str):
        return cache
    stable = json.dumps(
        [
            model,
            request.instructions,
            [[t.name, t.description, t.parameters] for t in request.tools],
        ],
        sort_keys=True,
        default=str,
    )
    return "trio-agents-" + hashlib.sha256(stable.encode()).hexdigest()[:32]


def check_count(name: str, value: object, minimum: int) -> int:
    """``value`` if it is an int (not a bool) of at least ``minimum``.

    Raises:
        ValueError: it is not; the message names ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def reason_map(**ours: tuple[str, ...]) -> dict[str, str]:
    """A provider's finish (stop) reasons -> the :class:`~trio_agents.models.Finish`
    reason, written grouped by ours: ``reason_map(length=("length", "max_tokens"))``."""
    return {theirs: reason for reason, names in ours.items() for theirs in names}


def check_model_name(model: object) -> None:
    """Refuse a model name that is not a non-empty string (first, before the rest).

    Raises:
        ValueError: it is not.
    """
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a non-empty str, got {model!r}")


def take_native_output(settings: dict[str, Any]) -> bool:
    """The ``native_output`` keyword of the OpenAI providers (default True), taken out
    of the body ``settings`` and checked.

    Raises:
        TypeError: it is not a bool.
    """
    native_output = settings.pop("native_output", True)
    if not isinstance(native_output, bool):
        raise TypeError(f"native_output must be a bool, not {type(native_output).__name__}")
    return native_output


class HTTPStreamingModel(abc.ABC):
    """Base class of the HTTP providers: the constructor, client ownership, retries,
    ``stream()``.

    The constructor is every provider's: one signature, checked in one place. A
    provider names its environment variables and default API root in class attributes,
    says where its API root is in a given base URL (:meth:`_api_root`), takes its own
    keywords out of the settings (:meth:`_configure`), and describes the request
    (:meth:`_build_request`) and the response format (:meth:`_new_parser`). Used as
    ``async with model:`` it shares one pooled client (see
    :class:`~._clients.ClientOwnership`).

    Args:
        model: the model name sent with every request.
        base_url: the API root; default the provider's ``*_BASE_URL`` environment
            variable, else its public endpoint.
        api_key: default the provider's ``*_API_KEY`` environment variable, read at
            each call (so an agent built before a .env is loaded still sends it); with
            neither, no key is sent (fine for local servers).
        client: an ``httpx.AsyncClient`` to use; it is never closed by the model.
            Without one, ``async with model:`` keeps one pooled client for the block,
            and outside such a block every stream opens and closes its own.
        max_retries: retries of connection failures, 408, 429 and 5xx (and the
            provider's overloaded errors), before any output; never of an error whose
            body blames the request (docs/models.md, "HTTP behaviour").
        connect_timeout: seconds to connect (and per write). There is no read timeout:
            deadlines are Trio cancel scopes.
        retry_base_delay, retry_max_delay: the exponential backoff (seconds); a
            ``Retry-After`` header takes precedence.
        rate_limit: a :class:`~trio_agents.models.RateLimit` every request of this
            model (each attempt, retries included) waits for; shared by every run using
            the model, and by other models given the same object. A 429 with
            ``Retry-After`` pauses every request sharing it.
        prices: whose prices give each request's ``Usage.cost`` (USD): ``None``
            (default) the provider's, from the ``genai-prices`` package, and only at
            the provider's own default API root (any other base URL gives
            ``cost=None``); a genai-prices provider id (``"openai"``, ...) whose prices
            apply whatever the base URL; ``True``: the provider's own, whatever the base
            URL; a :class:`~trio_agents.models.TokenPrices` of your own; ``False``:
            never priced. Pricing never touches the network.
        **settings: request body fields (``temperature``, ...), which
            ``request.settings`` override; and the provider's own keywords, which its
            class documents.

    Raises:
        ValueError, TypeError: a keyword is out of range or of the wrong type (checked
            in this order: the model name, the provider's own keywords, the rest).
    """

    _provider: str = "model"
    """The name errors and traces give the provider."""
    _api_key_env: str = ""
    """The environment variable the API key is read from, at each call, when none was given."""
    _base_url_env: str = ""
    """The environment variable the API root is read from when no ``base_url`` was given."""
    _default_base_url: str = ""
    """The API root used when neither ``base_url`` nor :attr:`_base_url_env` gives one."""
    _prices_provider: str = ""
    """genai-prices' id of the provider whose prices apply at :attr:`_default_base_url`."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: httpx.AsyncClient | None = None,
        max_retries: int = 3,
        connect_timeout: float = 10.0,
        retry_base_delay: float = 0.5,
        retry_max_delay: float = 20.0,
        rate_limit: RateLimit | None = None,
        prices: Prices = None,
        **settings: Any,
    ) -> None:
        check_model_name(model)
        body = dict(settings)
        take_cache(dict(body))  # checked now; taken out of each request's body
        self._configure(body)
        if client is not None and not isinstance(client, httpx.AsyncClient):
            raise TypeError(f"client must be an httpx.AsyncClient, not {type(client).__name__}")
        check_count("max_retries", max_retries, 0)
        for name, value in (
            ("connect_timeout", connect_timeout),
            ("retry_base_delay", retry_base_delay),
            ("retry_max_delay", retry_max_delay),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if rate_limit is not None and not isinstance(rate_limit, RateLimit):
            raise TypeError(
                f"rate_limit must be a RateLimit or None, not {type(rate_limit).__name__}"
            )
        self._rate_limit = rate_limit
        self._timeout = make_timeout(float(connect_timeout))
        self._clients = ClientOwnership(client, self._timeout)
        self._retry = RetryPolicy(max_retries, float(retry_base_delay), float(retry_max_delay))
        self._model = model
        base = base_url or os.environ.get(self._base_url_env) or self._default_base_url
        self._base_url = self._api_root(base.rstrip("/"))
        # Only an explicit key is kept: _api_key_env is read at each call.
        self._api_key = api_key
        self._settings = body
        # Priced only at the provider's own API root unless the user says whose
        # prices apply (a local server or a proxy is never guessed at).
        self._pricer = make_pricer(
            prices,
            provider_id=self._prices_provider,
            model=model,
            default_url=self._base_url == self._api_root(self._default_base_url.rstrip("/")),
        )

    def _configure(self, settings: dict[str, Any]) -> None:
        """Take the provider's own keywords out of ``settings`` (checked), and check the
        body settings it relies on; what is left is sent in every request body.

        Raises:
            ValueError, TypeError: one of them is out of range or of the wrong type.
        """
        del settings  # a provider without keywords of its own sends every setting

    def _api_root(self, base_url: str) -> str:
        """The API root in ``base_url`` (given without a trailing slash); a provider that
        accepts a pasted endpoint URL strips the endpoint's path here."""
        return base_url

    def _current_api_key(self) -> str | None:
        """The explicit API key, else the environment's (``None``: send no key)."""
        return self._api_key if self._api_key is not None else os.environ.get(self._api_key_env)

    @property
    def model(self) -> str:
        """The model name sent with every request."""
        return self._model

    @property
    def base_url(self) -> str:
        """The API root (without a trailing slash)."""
        return self._base_url

    @property
    def settings(self) -> Mapping[str, Any]:
        """The constructor's settings (a copy)."""
        return dict(self._settings)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._model!r}, base_url={self._base_url!r})"

    @property
    def rate_limit(self) -> RateLimit | None:
        """The :class:`~trio_agents.models.RateLimit` this model's requests wait for."""
        return self._rate_limit

    @property
    def max_retries(self) -> int:
        """How many times a request is retried before any output (so attempts - 1)."""
        return self._retry.max_retries

    def estimate_cost(self, request: ModelRequest) -> Decimal | None:
        """What ``request``'s input will cost, in USD, estimated before it is sent (a
        run checks it against ``UsageLimits(cost=...)``): its body's size at about four
        bytes a token (the estimate a :class:`~trio_agents.models.RateLimit` makes),
        priced as input tokens. ``None`` when the model knows no price, or the body
        cannot be built (sending it then fails with the reason)."""
        if self._pricer is None:
            return None
        try:
            body = json.dumps(
                dict(self._build_request(request).body),
                ensure_ascii=False,
                separators=(",", ":"),
                allow_nan=False,
            )
        except (TypeError, ValueError):
            return None
        return self._pricer(Usage(estimate_tokens(len(body.encode())), 0)).cost

    async def __aenter__(self) -> Self:
        """Own one pooled ``httpx.AsyncClient`` until the block ends (no-op with ``client=``)."""
        await trio.lowlevel.checkpoint()
        self._clients.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close the pooled client (shielded, bounded)."""
        await self._clients.close()

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        """Open a streaming response for ``request`` (see :class:`ModelStream`).

        Raises:
            ModelError: on entering, when the provider fails (after the retries);
                while iterating, when the stream breaks off or is malformed.
        """
        return ModelStream(
            provider=self._provider,
            spec=self._build_request(request),
            new_parser=self._new_parser,
            taken_call_ids=(
                item.call_id for item in request.items if isinstance(item, ToolCall | ToolResult)
            ),
            clients=self._clients,
            timeout=self._timeout,
            retry=self._retry,
            rate_limit=self._rate_limit,
            price=self._pricer,
            on_wait=request.on_wait,
        )

    @abc.abstractmethod
    def _build_request(self, request: ModelRequest) -> HTTPRequestSpec:
        """The provider's HTTP request for ``request``."""

    @abc.abstractmethod
    def _new_parser(self, call_ids: CallIds) -> StreamParser:
        """A fresh parser for one response; it makes its tool-call ids unique with
        ``call_ids`` (:meth:`CallIds.unique`)."""
