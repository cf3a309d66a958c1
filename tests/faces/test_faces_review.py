"""Findings of the adversarial review of the hosting layer and the HTTP faces (r27r):
each test failed on the code before its fix."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from tests.support.control_support import ask, raw_client
from tests.support.http_support import AGENTS, TOKENS, Served, client, serving, start
from trio_agents import UsageLimits
from trio_agents.control import Limits, open_control_server
from trio_agents.faces import http_app, serve_http


@asynccontextmanager
async def serving_with(limits: Limits) -> AsyncIterator[Served]:
    """The HTTP faces and the websocket channel of one host with these host limits."""
    async with open_control_server(AGENTS, auth=TOKENS, limits=limits) as server:
        app = http_app(server.host, auth=TOKENS)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            yield Served(server, app, f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{server.port}/")
            nursery.cancel_scope.cancel()


async def test_limits_valid_only_with_the_servers_maximum_are_taken_by_every_face() -> None:
    # A client's wrap_up alone is valid: the server's max_run_limits supplies the
    # deadline it counts back from (control/_policies.py, effective_limits). The faces
    # used to build UsageLimits(wrap_up=5) before the host merged, which refuses it.
    limits = Limits(max_run_limits=UsageLimits(deadline=60))
    async with serving_with(limits) as served, client(served.base) as alice:
        answer = await alice.post(
            "/runs", json={"agent": "blocker", "input": "go", "limits": {"wrap_up": 5}}
        )
        assert answer.status_code == 201, answer.text
        async with raw_client(served.ws_url) as ws:
            reply = await ask(
                ws,
                {
                    "id": 1,
                    "op": "run.start",
                    "agent": "blocker",
                    "input": "go",
                    "limits": {"wrap_up": 5},
                },
            )
            assert reply["type"] == "ack", reply
        # and what does not fit the merged limits is refused alike on both faces
        bad = {"agent": "blocker", "input": "go", "limits": {"wrap_up": 90}}
        answer = await alice.post("/runs", json=bad)
        assert answer.status_code == 400
        assert answer.json()["error"]["code"] == "invalid_request"


async def test_tree_resume_point_outside_the_tree_is_refused_not_a_silent_stream() -> None:
    # A tree stream re-attached with a Last-Event-ID naming no event of the tree (a
    # run outside it, another principal's, or a seq past the run's latest) used to
    # open (200) and then hold every live event back looking for it: a blocked run's
    # stream stayed silent. Now refused before the stream starts.
    async with (
        serving() as served,
        client(served.base) as alice,
        client(served.base, "tok-bob") as bob,
    ):
        run_id = await start(alice)
        other = await start(alice)
        bobs = await start(bob)
        info = (await alice.get(f"/runs/{run_id}")).json()["run"]
        for last in (
            "nosuch:1",
            f"{other}:1",
            f"{bobs}:1",
            f"{run_id}:{info['seq'] + 1000}",
        ):
            async with alice.stream(
                "GET", f"/runs/{run_id}/events?tree=1", headers={"Last-Event-ID": last}
            ) as answer:
                assert answer.status_code == 400, last  # (before: 200, then silence)
                body = json.loads(await answer.aread())
            assert body["error"]["code"] == "invalid_request"
        # An event the stream gave is still a resume point.
        await alice.post(f"/runs/{run_id}/cancel?wait=1")
        async with alice.stream(
            "GET", f"/runs/{run_id}/events?tree=1", headers={"Last-Event-ID": f"{run_id}:1"}
        ) as stream:
            assert stream.status_code == 200
            await stream.aread()


async def test_last_event_id_that_is_not_plain_digits_is_refused() -> None:
    # int() reads "1_0" as 10 and "+3" as 3: a garbled id resumed the stream somewhere
    # the client never was. Ids the server sends are plain digits; only those are taken.
    async with serving() as served, client(served.base) as alice:
        run_id = await start(alice)
        for last in ("1_0", "+3", "0x1", "1e3", "-1", ""):
            async with alice.stream(
                "GET", f"/runs/{run_id}/events", headers={"Last-Event-ID": last}
            ) as answer:
                assert answer.status_code == 400, repr(last)
                body = json.loads(await answer.aread())
            assert body["error"]["code"] == "invalid_request"
        async with alice.stream(
            "GET", f"/runs/{run_id}/events", params={"from_seq": "1_0"}
        ) as answer:
            assert answer.status_code == 400
            await answer.aread()
