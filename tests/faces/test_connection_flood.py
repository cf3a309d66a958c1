"""A flood of connections that never finish a request, against a real server process
whose file descriptors are fewer than the flood's sockets (``RLIMIT_NOFILE`` 256): an
authenticated client's requests keep being answered, on new connections and on a
keep-alive one. Once with the default caps (the flood comes from one address: the
per-address cap sheds it) and once with caps out of reach (the server runs out of
descriptors; a failing ``accept`` sheds a pending connection and tries again).

Before the caps and the header timeout, the server held every such connection for its
30 s keep-alive timeout: the accept queue filled behind them and every new connection,
an authenticated client's too, waited for them. The flood here keeps itself up (a
connection the server closes is reopened), so a server that only times connections out
answers nothing within the bound. The bound is generous: the server answers within
milliseconds to a few seconds on a loaded machine (``python -m benchmarks.flood``).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("resource")  # RLIMIT_NOFILE is POSIX's

from benchmarks.flood import authenticated_requests, flood_server, flooding

NOFILE = 256
# Per request: generous against what the server takes, short of the 30 s a flood
# connection used to be held.
BOUND = 20.0


@pytest.mark.parametrize(
    "limits",
    [
        {},
        {"max_unauthenticated_connections": 100_000, "max_unauthenticated_per_ip": 100_000},
    ],
    ids=["default_caps", "emfile"],
)
async def test_authenticated_requests_are_answered_during_a_flood(limits: dict[str, Any]) -> None:
    async with (
        flood_server(NOFILE, limits) as server,
        flooding(server.port, idle=200, half_sent=100, pause=1.0) as stats,
    ):
        await stats.all_open.wait()
        fresh = await authenticated_requests(server.port, 10, bound=BOUND, fresh=True)
        kept = await authenticated_requests(server.port, 10, bound=BOUND, fresh=False)
        assert len(fresh) == len(kept) == 10
        # The flood met the server's limits, it was not merely under them.
        assert stats.closed_by_server > 0
    # Nothing crashed in the server meanwhile (a crashed handler is logged, not raised).
    assert "Traceback" not in server.log
