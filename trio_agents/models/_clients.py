"""Client ownership: which ``httpx.AsyncClient`` a model uses, and who closes it (DESIGN §8).

A caller's client is used and never closed; ``async with model:`` owns one pooled
client for the block; otherwise each stream opens and closes its own
(:class:`ClientOwnership`). Every client we create shares one SSL context and the
timeouts of :func:`make_timeout`.
"""

from __future__ import annotations

import ssl
from typing import Final, final

import httpx
import trio

__all__ = ["CLEANUP_BOUND", "ClientOwnership", "make_timeout"]

CLEANUP_BOUND: Final = 5.0
"""Upper bound (seconds) on closing a response and a per-call client, shielded."""


def make_timeout(connect_timeout: float) -> httpx.Timeout:
    """The timeouts every model stream uses.

    No read timeout: a token stream may pause for as long as the model thinks, and
    deadlines are the caller's Trio cancel scopes. Connecting and each write are
    bounded by ``connect_timeout``. Waiting for a free connection in a client's pool
    is not bounded either: it is a queue, and Trio scopes bound it too.
    """
    return httpx.Timeout(connect=connect_timeout, read=None, write=connect_timeout, pool=None)


_ssl_context: ssl.SSLContext | None = None


def _shared_ssl_context() -> ssl.SSLContext:
    """One default SSL context for every client we create (building one costs ~30 ms)."""
    global _ssl_context
    if _ssl_context is None:
        _ssl_context = httpx.create_ssl_context()
    return _ssl_context


def _new_client(timeout: httpx.Timeout) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=timeout, verify=_shared_ssl_context())


@final
class ClientOwnership:
    """Which ``httpx.AsyncClient`` a model uses, and who closes it (DESIGN §8).

    * A client given by the caller is used for every stream and never closed.
    * Between :meth:`open` and :meth:`close` (``async with model:``) the model owns one
      pooled client; nested blocks share it, and the outermost one closes it.
    * Otherwise every stream gets a client of its own and closes it when it ends.
    """

    def __init__(self, client: httpx.AsyncClient | None, timeout: httpx.Timeout) -> None:
        self._given = client
        self._timeout = timeout
        self._pooled: httpx.AsyncClient | None = None
        self._depth = 0

    @property
    def pooled(self) -> httpx.AsyncClient | None:
        """The pooled client of an ``async with model:`` block, if one is open."""
        return self._pooled

    def borrow(self) -> tuple[httpx.AsyncClient, bool]:
        """Return ``(client, owned)``: ``owned`` means the borrower must close it."""
        if self._given is not None:
            return self._given, False
        if self._pooled is not None:
            return self._pooled, False
        return _new_client(self._timeout), True

    def open(self) -> None:
        """Enter an ``async with model:`` block."""
        self._depth += 1
        if self._given is None and self._pooled is None:
            self._pooled = _new_client(self._timeout)

    async def close(self) -> None:
        """Leave an ``async with model:`` block; the outermost one closes the pool."""
        self._depth -= 1
        if self._depth > 0 or self._pooled is None:
            return
        client, self._pooled = self._pooled, None
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_BOUND):
            await client.aclose()
