"""``RateLimit``: requests per minute, tokens per minute and concurrency, per model object.

DESIGN §21. A limit is given to a model (``OpenAIChatModel(..., rate_limit=limit)``,
every HTTP provider and ``ScriptedModel``) and holds for every run of the process that
uses that model object; give the same limit to several models that share an account.

How it waits, all on Trio primitives so a waiting request is cancellable at once:

* ``concurrency``: a ``trio.CapacityLimiter`` held for the whole stream (its retries
  included), borrowed on behalf of the stream (one task may open several);
* the rates: token buckets on ``trio.current_time()``, each holding one second's worth
  (at least one request) and refilling continuously, so the rate is smooth rather than
  the whole minute in one burst (providers enforce their per-minute limits over shorter
  windows too). A request is let through when every bucket holds its cost (or is full,
  for a cost above the capacity) and then takes its cost, which may put a bucket in
  debt: a request larger than a second's worth still goes, and the next one waits for
  the debt to be repaid. Tokens are estimated before a request
  (four bytes of the request body a token) and corrected by the ``Usage`` it reports;
* a 429 carrying ``Retry-After`` (HTTP providers) pauses every request sharing the
  limit until then;
* fairness: waiters pass one at a time through a ``trio.Lock``, which Trio hands over in
  FIFO order (as it does the ``CapacityLimiter``), so nobody is overtaken;
* what the run shows: a request that has to wait (for a slot, the rates or a pause)
  tells its ``ModelRequest.on_wait`` through a :class:`WaitNotice`, once when it starts
  waiting and once when it goes out; one that never waits says nothing.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Self, final

import attrs
import trio

from .._model import ModelEvent, ModelRequest, Usage

__all__ = ["RateLimit", "RateLimitedStream", "WaitNotice", "estimate_tokens"]

_THROTTLED = "rate limit"  # the reason a waiting request gives (DESIGN §21)


def _check_rate(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a number > 0 or None, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def estimate_tokens(size: int) -> int:
    """A request's input tokens, estimated from its size in bytes (about four a token)."""
    return max(1, size // 4)


@final
class WaitNotice:
    """Tells a request's ``on_wait`` (``ModelRequest.on_wait``) that it waits for its
    rate limit, then that it goes out: each once per wait, however many steps the wait
    takes (a slot, then the rates; a 429's pause, then the next attempt)."""

    __slots__ = ("_on_wait", "_waiting")

    def __init__(self, on_wait: Callable[[str | None], None] | None) -> None:
        self._on_wait = on_wait
        self._waiting = False

    def waiting(self) -> None:
        """The request is held back (called before each blocking step)."""
        if self._on_wait is not None and not self._waiting:
            self._waiting = True
            self._on_wait(_THROTTLED)

    def resumed(self) -> None:
        """The request goes out now (a no-op unless it waited)."""
        if self._on_wait is not None and self._waiting:
            self._waiting = False
            self._on_wait(None)


@attrs.define(eq=False)
class _Bucket:
    """A token bucket refilled continuously; its level may go below 0 (a debt)."""

    rate: float  # per second
    capacity: float
    level: float
    at: float | None = None  # when `level` was last brought up to date

    def refill(self, now: float) -> None:
        if self.at is not None and now > self.at:
            self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now

    def ready_at(self, now: float, cost: float) -> float:
        """When the bucket holds ``cost`` (or is full, for a cost above its capacity)."""
        self.refill(now)
        need = min(cost, self.capacity)
        return now if self.level >= need else now + (need - self.level) / self.rate


@final
class RateLimit:
    """Limits on the requests a model (or several sharing this object) makes.

    Args:
        requests_per_minute: requests started per minute (each retry is one).
        tokens_per_minute: input plus output tokens per minute: estimated before a
            request from its size, corrected by the ``Usage`` the model reports.
        concurrency: streams open at once.

    Each is ``None`` for no limit. Waiting for a slot is cancellable at once, and
    waiters go in the order they came (FIFO). A 429 answer with ``Retry-After`` pauses
    every request that shares this limit until then (:meth:`pause`).

    Raises:
        ValueError: a limit is not a positive number (``concurrency``: an int >= 1).
    """

    def __init__(
        self,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        concurrency: int | None = None,
    ) -> None:
        rpm = _check_rate("requests_per_minute", requests_per_minute)
        tpm = _check_rate("tokens_per_minute", tokens_per_minute)
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise ValueError(f"concurrency must be an int >= 1 or None, got {concurrency!r}")
        self._rpm, self._tpm, self._concurrency = rpm, tpm, concurrency
        self._requests = self._bucket(rpm)
        self._tokens = self._bucket(tpm)
        self._slots = trio.CapacityLimiter(concurrency) if concurrency is not None else None
        self._gate = trio.Lock()
        self._paused_until = -math.inf
        self._run: object = None  # the Trio run whose clock the times above are on

    @staticmethod
    def _bucket(per_minute: float | None) -> _Bucket | None:
        if per_minute is None:
            return None
        capacity = max(1.0, per_minute / 60)
        return _Bucket(rate=per_minute / 60, capacity=capacity, level=capacity)

    @property
    def requests_per_minute(self) -> float | None:
        """The request rate limit (``None``: none)."""
        return self._rpm

    @property
    def tokens_per_minute(self) -> float | None:
        """The token rate limit (``None``: none)."""
        return self._tpm

    @property
    def concurrency(self) -> int | None:
        """How many streams may be open at once (``None``: no limit)."""
        return self._concurrency

    @property
    def in_use(self) -> int:
        """How many streams hold a concurrency slot now (0 without ``concurrency``)."""
        return 0 if self._slots is None else self._slots.borrowed_tokens

    @property
    def waiting(self) -> int:
        """How many requests wait for a concurrency slot now."""
        return 0 if self._slots is None else self._slots.statistics().tasks_waiting

    def __repr__(self) -> str:
        return (
            f"RateLimit(requests_per_minute={self._rpm!r}, tokens_per_minute={self._tpm!r},"
            f" concurrency={self._concurrency!r})"
        )

    def _now(self) -> float:
        """``trio.current_time()``; in a new Trio run (a model kept across ``trio.run``
        calls) the times kept from the last run are forgotten first: each run's clock
        has its own origin, so they would mean nothing (a pause of days, say)."""
        run = trio.lowlevel.current_trio_token()
        if run is not self._run:
            self._run = run
            self._paused_until = -math.inf
            for bucket in (self._requests, self._tokens):
                if bucket is not None:
                    bucket.at = None
        return trio.current_time()

    def pause(self, seconds: float) -> None:
        """Hold every request sharing this limit for ``seconds`` from now (what a 429's
        ``Retry-After`` asks; a shorter pause never shortens a longer one)."""
        until = self._now() + max(0.0, seconds)
        self._paused_until = max(self._paused_until, until)

    async def acquire_slot(self, owner: object, notice: WaitNotice | None = None) -> None:
        """Wait for a concurrency slot for ``owner`` (a stream); FIFO, cancellable.
        ``notice`` is told if it has to wait."""
        if self._slots is None:
            await trio.lowlevel.checkpoint()
            return
        # What `acquire_on_behalf_of` does, split so that a wait can be told apart:
        # a cancelled caller takes nothing, and a free slot is taken without blocking
        # (`*_nowait` still queues behind earlier waiters: FIFO holds).
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._slots.acquire_on_behalf_of_nowait(owner)
        except trio.WouldBlock:
            if notice is not None:
                notice.waiting()
            await self._slots.acquire_on_behalf_of(owner)
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()

    def release_slot(self, owner: object) -> None:
        """Give back ``owner``'s slot (a no-op if it holds none)."""
        if self._slots is not None and owner in self._slots.statistics().borrowers:
            self._slots.release_on_behalf_of(owner)

    async def before_request(self, tokens: int, notice: WaitNotice | None = None) -> None:
        """Wait until one more request of about ``tokens`` input tokens fits the rates
        and no pause is on, then take its cost. FIFO, cancellable at once. ``notice``
        is told if it has to wait."""
        if notice is not None and self._gate.locked():
            notice.waiting()  # behind another waiter
        async with self._gate:
            while True:
                now = self._now()
                ready = self._paused_until
                for bucket, cost in ((self._requests, 1), (self._tokens, tokens)):
                    if bucket is not None:
                        ready = max(ready, bucket.ready_at(now, cost))
                if ready <= now:
                    break
                if notice is not None:
                    notice.waiting()
                # Sleep and look again: a pause may have been set meanwhile.
                await trio.sleep_until(ready)
            if self._requests is not None:
                self._requests.level -= 1
            if self._tokens is not None:
                self._tokens.level -= tokens
        await trio.lowlevel.checkpoint()

    def correct(self, estimated: int, usage: Usage) -> None:
        """Replace a request's token estimate by the tokens its ``Usage`` reports."""
        if self._tokens is not None:
            self._tokens.refill(self._now())
            self._tokens.level -= usage.input_tokens + usage.output_tokens - estimated


@final
class RateLimitedStream(AbstractAsyncContextManager[AsyncIterator[ModelEvent]]):
    """A model's stream under a :class:`RateLimit`, for models that are not HTTP
    providers (those pass every attempt through the limit themselves): a slot for the
    whole stream, one pass through the rates, the tokens corrected by ``Usage``."""

    def __init__(
        self,
        limit: RateLimit,
        request: ModelRequest,
        inner: AbstractAsyncContextManager[AsyncIterator[ModelEvent]],
    ) -> None:
        self._limit = limit
        self._inner = inner
        self._notice = WaitNotice(request.on_wait)
        self._estimate = estimate_tokens(
            len(request.instructions) + sum(len(repr(item)) for item in request.items)
        )
        self._events: AsyncIterator[ModelEvent] | None = None

    async def __aenter__(self) -> AsyncIterator[ModelEvent]:
        await self._limit.acquire_slot(self, self._notice)
        try:
            await self._limit.before_request(self._estimate, self._notice)
            self._notice.resumed()
            self._events = await self._inner.__aenter__()
        except BaseException:
            self._limit.release_slot(self)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        try:
            return await self._inner.__aexit__(exc_type, exc_value, traceback)
        finally:
            self._limit.release_slot(self)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ModelEvent:
        if self._events is None:
            raise RuntimeError("the model stream was read outside its `async with` block")
        event = await self._events.__anext__()
        if isinstance(event, Usage):
            # The estimate is replaced once; a later usage event only adds.
            self._limit.correct(self._estimate, event)
            self._estimate = 0
        return event
