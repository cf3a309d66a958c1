"""What every model-provider test shares: no provider, proxy or key setting from the
machine leaks in, and a fresh loopback wire server per test."""

from __future__ import annotations

import pytest
import trio

from tests.support.sse_server import SSEServer

# Every variable a provider or httpx reads: a test sets what it needs with monkeypatch.
LEAKY_ENV = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LEAKY_ENV:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
async def server(nursery: trio.Nursery) -> SSEServer:
    """A loopback HTTP server the test scripts (``SSEServer.add``), serving until the
    test ends."""
    server = SSEServer()
    await nursery.start(server.serve)
    return server
