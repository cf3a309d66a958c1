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
* here, :class:`HTTPStreamingModel` — the settings every provider takes (model name,
  base URL, API key, body settings, client, retries) and ``stream()``.
"""

from __future__ import annotations

import abc
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Self

import httpx
import trio

from .._items import ToolCall, ToolResult
from .._model import ModelEvent, ModelRequest
from ._call_ids import CallIds
from ._clients import ClientOwnership, make_timeout
from ._model_stream import HTTPRequestSpec, ModelStream, StreamParser
from ._retry import RetryPolicy

__all__ = ["HTTPStreamingModel", "bearer_headers", "check_model_name", "check_native_output"]


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """``Authorization: Bearer <key>`` (OpenAI's scheme), or no header without a key
    (fine for local servers)."""
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def check_model_name(model: object) -> None:
    """Refuse a model name that is not a non-empty string (first, before the rest).

    Raises:
        ValueError: it is not.
    """
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a non-empty str, got {model!r}")


def check_native_output(native_output: object) -> bool:
    """The ``native_output`` setting of the OpenAI providers, checked.

    Raises:
        TypeError: it is not a bool.
    """
    if not isinstance(native_output, bool):
        raise TypeError(f"native_output must be a bool, not {type(native_output).__name__}")
    return native_output


class HTTPStreamingModel(abc.ABC):
    """Base class of the HTTP providers: client ownership, retries, ``stream()``.

    Subclasses describe the request (:meth:`_build_request`) and the response format
    (:meth:`_new_parser`); they are used as ``async with model:`` to share one pooled
    client (see :class:`~._clients.ClientOwnership`). A provider at a base URL also
    calls :meth:`_set_endpoint` from its constructor.
    """

    _provider: str = "model"
    _api_key_env: str = ""
    """The environment variable the API key is read from, at each call, when none was given."""

    def __init__(
        self,
        client: httpx.AsyncClient | None,
        max_retries: int,
        connect_timeout: float,
        retry_base_delay: float,
        retry_max_delay: float,
    ) -> None:
        if client is not None and not isinstance(client, httpx.AsyncClient):
            raise TypeError(f"client must be an httpx.AsyncClient, not {type(client).__name__}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        for name, value in (
            ("connect_timeout", connect_timeout),
            ("retry_base_delay", retry_base_delay),
            ("retry_max_delay", retry_max_delay),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        self._timeout = make_timeout(float(connect_timeout))
        self._clients = ClientOwnership(client, self._timeout)
        self._retry = RetryPolicy(max_retries, float(retry_base_delay), float(retry_max_delay))
        self._model = ""
        self._base_url = ""
        self._api_key: str | None = None
        self._settings: dict[str, Any] = {}

    def _set_endpoint(
        self, model: str, base_url: str, api_key: str | None, settings: Mapping[str, Any]
    ) -> None:
        """Keep the model name, the API root, an explicit API key and the body settings.

        Only an explicit key is kept: :attr:`_api_key_env` is read at each call
        (:meth:`_current_api_key`), so an agent built at import time, before a .env is
        loaded, still sends it.
        """
        self._model = model
        self._base_url = base_url
        self._api_key = api_key
        self._settings = dict(settings)

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
    def max_retries(self) -> int:
        """How many times a request is retried before any output (so attempts - 1)."""
        return self._retry.max_retries

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
        )

    @abc.abstractmethod
    def _build_request(self, request: ModelRequest) -> HTTPRequestSpec:
        """The provider's HTTP request for ``request``."""

    @abc.abstractmethod
    def _new_parser(self, call_ids: CallIds) -> StreamParser:
        """A fresh parser for one response; it makes its tool-call ids unique with
        ``call_ids`` (:meth:`CallIds.unique`)."""
