"""The REST + SSE face against a real server (Hypercorn on loopback, httpx clients):
auth on every route, principals, hostile bodies, SSE re-attach, retention, slow and
many subscribers, cancel ?wait=1, and one host shared with the websocket channel."""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any

import httpx
import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.control_support import ask, launch, raw_client, wait_until
from tests.support.http_support import Message, bearer, client, messages, serving, start, talker
from trio_agents.faces import HTTP_STATUS, HttpLimits
from trio_agents.models import ScriptedModel, Turn

# A client that leaves an SSE stream mid-way (the point of several tests) abandons
# httpx's nested body generators; they are finalized by the garbage collector and Trio
# warns (CONVENTIONS, "httpx aiter_lines()"). Exactly those warnings, nothing else.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)\._[^']*' was garbage collected:ResourceWarning"
)

ROUTES: list[tuple[str, str]] = [
    ("POST", "/runs"),
    ("GET", "/runs"),
    ("GET", "/runs/{id}"),
    ("POST", "/runs/{id}/cancel"),
    ("POST", "/runs/{id}/inject"),
    ("POST", "/runs/{id}/withdraw"),
    ("POST", "/runs/{id}/approve"),
    ("POST", "/runs/{id}/reject"),
    ("GET", "/runs/{id}/events"),
    ("GET", "/runs/{id}/timeline"),
    ("POST", "/runs/{id}/replay"),
    ("POST", "/sessions/s1/cancel"),
    ("POST", "/sessions/s1/fork"),
]
BODIES: dict[str, Any] = {
    "/runs": {"agent": "blocker", "input": "go"},
    "/runs/{id}/inject": {"items": "more"},
    "/runs/{id}/withdraw": {"injection_id": "i1"},
    "/runs/{id}/approve": {"call_id": "c1"},
    "/runs/{id}/reject": {"call_id": "c1"},
    "/sessions/s1/fork": {"new_session_id": "mine"},
    "/runs/{id}/replay": {"seq": 1, "agent": "blocker"},
}
METHODS = ["GET", "POST", "DELETE"]


async def test_no_route_answers_without_a_valid_token() -> None:
    async with serving() as served, client(served.base) as alice:
        run_id = await start(alice)
        headers_tried: list[dict[str, str]] = [
            {},
            {"Authorization": "Bearer nope"},
            {"Authorization": "Basic dG9rLWFsaWNlOg=="},
            {"Authorization": "tok-alice"},
            {"Authorization": "Bearer"},
        ]
        async with client(served.base, token=None) as anonymous:
            for _, path in [*ROUTES, ("GET", "/no/such/route"), ("GET", "/")]:
                for method in METHODS:
                    for headers in headers_tried:
                        answer = await anonymous.request(
                            method, path.replace("{id}", run_id), headers=headers, json={}
                        )
                        assert answer.status_code == 401, (method, path, headers)
                        assert answer.json()["error"]["code"] == "unauthorized"
                        assert answer.headers["www-authenticate"].startswith("Bearer")
            # A token in the URL is no token.
            answer = await anonymous.get("/runs", params={"token": "tok-alice"})
            assert answer.status_code == 401
        assert served.server.statistics().active_runs == 1


async def test_another_principals_run_is_not_found_on_every_route() -> None:
    async with (
        serving() as served,
        client(served.base) as alice,
        client(served.base, "tok-bob") as bob,
    ):
        run_id = await start(alice, session_id="s1")
        for method, path in ROUTES:
            if path in ("/runs",):
                continue
            answer = await bob.request(
                method, path.replace("{id}", run_id), json=BODIES.get(path, {})
            )
            expected = "no_active_run" if path == "/sessions/s1/cancel" else "not_found"
            assert answer.status_code in (404, 409), (method, path, answer.text)
            assert answer.json()["error"]["code"] == expected, (method, path)
        assert (await bob.get("/runs")).json() == {"runs": []}
        # and alice's run is untouched
        info = (await alice.get(f"/runs/{run_id}")).json()["run"]
        assert info["status"] in ("queued", "running")


# The bodies each route refuses, by the error code it answers.
GARBAGE: dict[tuple[str, str], list[bytes]] = {
    ("/runs", "invalid_json"): [
        b"{",
        b"",
        b"\xff\xfe",
        b'{"agent": NaN}',
        b"[" * 100_000 + b"]" * 100_000,
    ],
    ("/runs", "invalid_request"): [
        b"[]",
        b'"text"',
        b'{"agent": 1, "input": "x"}',
        b'{"agent": "blocker"}',
        b'{"agent": "blocker", "input": []}',
        b'{"agent": "blocker", "input": "x", "extra": 1}',
        b'{"agent": "blocker", "input": "x", "subscribe": "everything"}',
        b'{"agent": "blocker", "input": "x", "on_disconnect": "sometimes"}',
        # No stream answers it: no connection whose drop would cancel the run.
        b'{"agent": "blocker", "input": "x", "on_disconnect": "cancel"}',
        b'{"agent": "blocker", "input": "x", "id": 1}',
        b'{"agent": "blocker", "input": "a\\u0000b"}',
        b'{"agent": "blocker", "input": "\\ud800"}',
        b'{"agent": "blocker", "input": "x", "limits": {"requests": -1}}',
    ],
    ("/runs", "not_found"): [b'{"agent": "nobody", "input": "x"}'],
    ("/runs/{id}/cancel", "invalid_request"): [
        b'{"mode": "later"}',
        b'{"reason": 5}',
        b'{"run_id": "other"}',
    ],
    ("/runs/{id}/inject", "invalid_request"): [b"{}", b'{"items": 3}'],
    ("/runs/{id}/withdraw", "invalid_request"): [b'{"injection_id": ""}'],
    ("/runs/{id}/approve", "invalid_request"): [b'{"call_id": ["c"]}'],
}


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [(path, body, code) for (path, code), bodies in GARBAGE.items() for body in bodies],
)
async def test_garbage_bodies_are_refused_with_a_code(path: str, body: bytes, code: str) -> None:
    async with serving() as served, client(served.base) as alice:
        run_id = await start(alice)
        answer = await alice.post(
            path.replace("{id}", run_id), content=body, headers={"Content-Type": "application/json"}
        )
        assert answer.json()["error"]["code"] == code, answer.text
        assert answer.status_code == {"invalid_json": 400, "invalid_request": 400}.get(code, 404)
        assert answer.headers["content-type"] == "application/json"


async def test_oversized_bodies_answer_413_declared_or_streamed() -> None:
    async with (
        serving(limits=HttpLimits(max_body_bytes=1000)) as served,
        client(served.base) as alice,
    ):
        big = json.dumps({"agent": "blocker", "input": "x" * 5000}).encode()
        answer = await alice.post("/runs", content=big)
        assert answer.status_code == 413
        assert answer.json()["error"]["code"] == "limit_exceeded"  # §10's code

        # chunked, no length: refused once past the bound, without reading it all
        stream = await trio.open_tcp_stream("127.0.0.1", int(served.base.rsplit(":", 1)[1]))
        async with stream:
            head = (
                "POST /runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-alice\r\n"
                "Transfer-Encoding: chunked\r\n\r\n"
            )
            await stream.send_all(head.encode() + b"64\r\n" + b" " * 100 + b"\r\n" * 1)
            for _ in range(20):
                await stream.send_all(b"64\r\n" + b" " * 100 + b"\r\n")
            answer_head = b""
            while b"\r\n" not in answer_head:
                answer_head += await stream.receive_some()
            assert answer_head.startswith(b"HTTP/1.1 413")
        assert served.server.statistics().active_runs == 0


# DESIGN §10's error codes: every HTTP face answers with them, plus ``unauthorized``.
DESIGN_CODES = {
    "invalid_json",
    "invalid_request",
    "unknown_op",
    "not_found",
    "run_closed",
    "session_busy",
    "no_active_run",
    "inbox_full",
    "limit_exceeded",
    "internal",
}


async def test_errors_carry_design_codes_and_http_statuses() -> None:
    assert set(HTTP_STATUS) == DESIGN_CODES | {"unauthorized"}
    async with (
        serving(limits=HttpLimits(max_body_bytes=1000)) as served,
        client(served.base) as alice,
    ):
        run_id = await start(alice)
        seen: list[tuple[int, str]] = []
        for answer in (
            await alice.post("/runs", content=b"[" + b" " * 2000 + b"]"),
            await alice.delete(f"/runs/{run_id}"),
            await alice.put("/runs"),
        ):
            seen.append((answer.status_code, answer.json()["error"]["code"]))
        assert (await alice.delete(f"/runs/{run_id}")).headers["allow"]
        served.app.shutdown()
        answer = await alice.get(f"/runs/{run_id}/events")
        seen.append((answer.status_code, answer.json()["error"]["code"]))
        assert seen == [
            (413, "limit_exceeded"),
            (405, "unknown_op"),
            (405, "unknown_op"),
            (503, "internal"),
        ]


async def test_rest_ops_drive_a_run() -> None:
    async with serving() as served, client(served.base) as alice:
        run_id = await start(alice, session_id="s1")
        assert (await alice.get("/runs")).json()["runs"][0]["run_id"] == run_id
        injected = await alice.post(f"/runs/{run_id}/inject", json={"items": "more"})
        injection_id = injected.json()["injection_id"]
        withdrawn = await alice.post(
            f"/runs/{run_id}/withdraw", json={"injection_id": injection_id}
        )
        assert withdrawn.json() == {"withdrawn": True}
        approve = await alice.post(f"/runs/{run_id}/approve", json={"call_id": "nope"})
        assert approve.json()["error"]["code"] == "not_found"
        cancelled = await alice.post("/sessions/s1/cancel?wait=1", json={"reason": "enough"})
        run = cancelled.json()["run"]
        assert (run["run_id"], run["status"], run["reason"]) == (run_id, "cancelled", "enough")
        again = await alice.post(f"/runs/{run_id}/cancel")
        assert (again.status_code, again.json()["error"]["code"]) == (409, "run_closed")
        none = await alice.post("/sessions/s1/cancel")
        assert none.json()["error"]["code"] == "no_active_run"
        bad = await alice.post(f"/runs/{run_id}/cancel?wait=maybe")
        assert bad.json()["error"]["code"] == "invalid_request"


async def _read(stream: httpx.Response, until: Any) -> list[Message]:
    got: list[Message] = []
    async with aclosing(messages(stream)) as reading:
        async for message in reading:
            got.append(message)
            if until(message):
                break
    return got


async def test_sse_reattach_with_last_event_id_has_no_gap_and_no_duplicate() -> None:
    async with serving() as served, client(served.base) as alice:
        run_id = await start(alice)
        async with alice.stream("GET", f"/runs/{run_id}/events") as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            first = await _read(stream, lambda m: m.type == "tool.started")
        seqs = [m.data["seq"] for m in first]
        assert seqs == list(range(1, len(seqs) + 1))
        assert [m.id for m in first] == [str(s) for s in seqs]
        # more happens while nobody listens
        await alice.post(f"/runs/{run_id}/inject", json={"items": "meanwhile"})
        await alice.post(f"/runs/{run_id}/cancel", json={"reason": "done"})
        for headers, params in (
            ({"Last-Event-ID": first[-1].id or ""}, {}),
            ({}, {"from_seq": str(seqs[-1] + 1)}),
            # the header wins over the URL's from_seq, as an EventSource re-sends both
            ({"Last-Event-ID": first[-1].id or ""}, {"from_seq": "1"}),
        ):
            async with alice.stream(
                "GET", f"/runs/{run_id}/events", headers=headers, params=params
            ) as stream:
                rest = [m async for m in messages(stream)]
            assert [m.data["seq"] for m in rest] == list(
                range(seqs[-1] + 1, seqs[-1] + 1 + len(rest))
            )
            assert rest[-1].terminal  # the stream ends after the terminal update
            assert rest[-1].data["event"]["reason"] == "done"
        await wait_until(lambda: served.app.statistics().streams == 0)


async def test_last_event_id_past_retention_says_events_dropped() -> None:
    agents = {"talker": talker(60)}
    async with (
        serving(agents, run_options={"event_retention": 8}) as served,
        client(served.base) as alice,
    ):
        run_id = await start(alice, "talker")
        info = (await alice.post(f"/runs/{run_id}/cancel?wait=1")).json()
        if "run" not in info:  # it finished first
            await (await alice.get(f"/runs/{run_id}")).aread()
        async with alice.stream(
            "GET", f"/runs/{run_id}/events", headers={"Last-Event-ID": "2"}
        ) as stream:
            got = [m async for m in messages(stream)]
    assert got[0].type == "events.dropped"
    assert got[0].id is None  # the client's last id stays the last event it got
    assert got[0].data["event"]["first_missing_seq"] == 3
    seqs = [m.data["seq"] for m in got[1:]]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert got[0].data["event"]["count"] == seqs[0] - 3
    assert got[-1].terminal


async def test_tree_stream_ids_are_run_and_seq_and_reattach() -> None:
    async with serving() as served, client(served.base) as alice:
        run_id = await start(alice)
        async with alice.stream("GET", f"/runs/{run_id}/events?tree=1") as stream:
            first = await _read(stream, lambda m: m.type == "tool.started")
        assert all(m.id == f"{m.data['run_id']}:{m.data['seq']}" for m in first)
        await alice.post(f"/runs/{run_id}/cancel")
        async with alice.stream(
            "GET", f"/runs/{run_id}/events?tree=1", headers={"Last-Event-ID": first[2].id or ""}
        ) as stream:
            rest = [m async for m in messages(stream)]
        assert [m.data["seq"] for m in rest] == list(range(4, 4 + len(rest)))
        assert rest[-1].terminal
        refused = await alice.get(f"/runs/{run_id}/events?tree=1&from_seq=3")
        assert refused.json()["error"]["code"] == "invalid_request"
        refused = await alice.get(f"/runs/{run_id}/events?tree=1", headers={"Last-Event-ID": "12"})
        assert refused.json()["error"]["code"] == "invalid_request"


async def test_many_subscribers_each_get_every_event() -> None:
    count = 100  # a thousand: test_sse_thousand.py (raw sockets; httpx clients cost more)
    limits = HttpLimits(max_streams_per_principal=count)
    async with serving(limits=limits) as served, client(served.base) as alice:
        run_id = await start(alice)
        results: list[list[int]] = []

        async def subscriber(http: httpx.AsyncClient) -> None:
            async with http.stream("GET", f"/runs/{run_id}/events") as stream:
                seqs: list[int] = []
                async for message in messages(stream):
                    seqs.append(message.data["seq"])
                results.append(seqs)

        pool = httpx.Limits(max_connections=count + 10, max_keepalive_connections=0)
        async with (
            httpx.AsyncClient(
                base_url=served.base, headers=bearer("tok-alice"), timeout=None, limits=pool
            ) as http,
            trio.open_nursery() as nursery,
        ):
            for _ in range(count):
                nursery.start_soon(subscriber, http)
            await wait_until(lambda: served.app.statistics().streams == count)
            over = await http.get(f"/runs/{run_id}/events")
            assert over.json()["error"]["code"] == "limit_exceeded"
            await http.post(f"/runs/{run_id}/cancel", json={"reason": "bye"})
        assert len(results) == count
        first = results[0]
        assert first == list(range(1, len(first) + 1))
        assert all(seqs == first for seqs in results)
        await wait_until(lambda: served.app.statistics().streams == 0)


async def test_cancel_wait_racing_completion_answers_the_terminal_run() -> None:
    agents = {"talker": talker(3)}
    async with serving(agents) as served, client(served.base) as alice:
        for _ in range(20):
            run_id = await start(alice, "talker")
            answer = await alice.post(f"/runs/{run_id}/cancel?wait=1", json={"reason": "race"})
            if answer.status_code == 200:
                run = answer.json()["run"]
                assert run["status"] in ("cancelled", "completed")
                if run["status"] == "cancelled":
                    assert run["reason"] == "race"
            else:
                assert answer.json()["error"]["code"] == "run_closed"
                run = (await alice.get(f"/runs/{run_id}")).json()["run"]
                assert run["status"] == "completed"


async def test_one_host_a_run_started_over_the_websocket_is_seen_over_http() -> None:
    async with serving() as served, client(served.base) as alice:
        async with raw_client(served.ws_url) as ws:
            ack = await ask(ws, {"id": "1", "op": "run.start", "agent": "blocker", "input": "go"})
            ws_run = ack["run_id"]
            runs = (await alice.get("/runs")).json()["runs"]
            assert [r["run_id"] for r in runs] == [ws_run]
            http_run = await start(alice)
            got = await ask(ws, {"id": "2", "op": "run.get", "run_id": http_run})
            assert got["run"]["run_id"] == http_run
            cancelled = await ask(ws, {"id": "3", "op": "run.cancel", "run_id": http_run})
            assert cancelled["type"] == "ack"
        run = (await alice.post(f"/runs/{ws_run}/cancel?wait=1")).json()["run"]
        assert run["status"] == "cancelled"
        async with client(served.base, "tok-bob") as bob:
            assert (await bob.get(f"/runs/{ws_run}")).status_code == 404


async def test_a_client_that_stops_reading_is_cut_and_the_run_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limits = HttpLimits(send_timeout=5.0, keepalive_interval=1000.0)
    async with serving(limits=limits) as served, client(served.base) as alice:
        run_id = await start(alice)
        port = int(served.base.rsplit(":", 1)[1])
        sock = trio.socket.socket()
        sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
        await sock.connect(("127.0.0.1", port))
        request = (
            f"GET /runs/{run_id}/events HTTP/1.1\r\nHost: x\r\n"
            "Authorization: Bearer tok-alice\r\n\r\n"
        )
        await sock.send(request.encode())
        await wait_until(lambda: served.app.statistics().streams == 1)
        # Never read. Each injection is an event of ~256 KiB on the stream; once the
        # socket's buffers are full the stream's write blocks, and send_timeout later
        # (virtual time) the server cuts the connection.
        for _ in range(40):
            await alice.post(f"/runs/{run_id}/inject", json={"items": "x" * (256 << 10)})
            with trio.move_on_after(3 * limits.send_timeout):
                await wait_until(lambda: served.app.statistics().streams == 0)
            if served.app.statistics().streams == 0:
                break
        assert served.app.statistics().streams == 0
        sock.close()
        run = (await alice.get(f"/runs/{run_id}")).json()["run"]
        assert run["status"] == "running"  # the run was not touched
        # and the client may come back for what it missed
        async with alice.stream(
            "GET", f"/runs/{run_id}/events", headers={"Last-Event-ID": "1"}
        ) as stream:
            first = await _read(stream, lambda m: True)
        assert first[0].data["seq"] == 2


def _approval_tree() -> dict[str, ta.Agent]:
    """A root whose tool runs a child that calls a tool needing approval."""
    child = ta.Agent(
        name="child",
        model=ScriptedModel([Turn(tool_calls=[("launch", {})]), Turn(text="launched")]),
        tools=[launch],
    )
    root = ta.Agent(
        name="root",
        model=ScriptedModel([Turn(tool_calls=[("child", {"input": "go"})]), Turn(text="ok")]),
        tools=[child.as_tool(name="child")],
    )
    return {"root": root}


async def test_a_run_record_carries_its_current_status_detail() -> None:
    """GET /runs/{id} of an ancestor says what its status update says: the calls
    waiting below it (detail.waiting), and a waiting run its own (detail.pending)."""
    with trio.fail_after(30):
        async with serving(_approval_tree()) as served, client(served.base) as alice:
            run_id = await start(alice, "root")
            statuses = f"/runs/{run_id}/events?events=status"
            async with alice.stream("GET", statuses) as stream, aclosing(messages(stream)) as got:
                async for message in got:
                    if message.data["event"]["status"] == "awaiting_approval":
                        update = message.data["event"]
                        break
            record = (await alice.get(f"/runs/{run_id}")).json()["run"]
            assert record["status"] == "awaiting_approval"
            assert record["detail"] == update["detail"]
            ((child_id, call_id),) = [
                (w["run_id"], w["call_id"]) for w in record["detail"]["waiting"]
            ]
            child = (await alice.get(f"/runs/{child_id}")).json()["run"]
            assert child["detail"]["pending"] == [call_id]
            listed = (await alice.get("/runs")).json()["runs"]
            assert [r["detail"] for r in listed] == [record["detail"]]
            # The websocket channel's run.get is the same record.
            async with raw_client(served.ws_url) as ws:
                got_ws = await ask(ws, {"id": "1", "op": "run.get", "run_id": run_id})
            assert got_ws["run"]["detail"] == record["detail"]
            answer = await alice.post(f"/runs/{child_id}/approve", json={"call_id": call_id})
            assert answer.status_code == 200
            async with alice.stream("GET", statuses) as stream:
                last = [message async for message in messages(stream)][-1]
            assert last.data["event"]["status"] == "completed"
            record = (await alice.get(f"/runs/{run_id}")).json()["run"]
            assert record["detail"] == last.data["event"]["detail"]


async def _until_tool(stream: httpx.Response) -> list[Message]:
    got: list[Message] = []
    async with aclosing(messages(stream)) as reader:
        async for message in reader:
            got.append(message)
            if message.type == "tool.started":
                break
    return got


async def _terminal(http: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    async with http.stream("GET", f"/runs/{run_id}/events?events=status") as stream:
        got = [message async for message in messages(stream)]
    assert got[-1].terminal
    event: dict[str, Any] = got[-1].data["event"]
    return event


@pytest.mark.parametrize("on_disconnect", ["cancel", "continue", None])
async def test_start_with_subscribe_streams_the_run_and_its_drop_is_a_disconnect(
    on_disconnect: str | None,
) -> None:
    """POST /runs with "subscribe" answers with the run's event stream from seq 1 (as
    the websocket's run.start with subscribe); that stream owns the run, so dropping
    it applies on_disconnect ("continue", the default, lets the run go on)."""
    body: dict[str, Any] = {"agent": "blocker", "input": "go", "subscribe": "all"}
    if on_disconnect is not None:
        body["on_disconnect"] = on_disconnect
    with trio.fail_after(30):
        async with serving() as served, client(served.base) as alice:
            async with alice.stream("POST", "/runs", json=body) as stream:
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
                got = await _until_tool(stream)
            assert [int(m.id or 0) for m in got] == list(range(1, len(got) + 1))
            run_id = got[0].data["run_id"]
            assert got[0].data["event"]["status"] == "queued"
            if on_disconnect == "cancel":
                last = await _terminal(alice, run_id)
                assert (last["status"], last["reason"]) == ("cancelled", "client disconnected")
            else:
                # It went on: still running, until cancelled here.
                record = (await alice.get(f"/runs/{run_id}")).json()["run"]
                assert record["status"] == "running"
                cancelled = await alice.post(f"/runs/{run_id}/cancel?wait=1", json={})
                assert cancelled.json()["run"]["reason"] == "cancelled"
                # Re-attach after the last event the dropped stream gave, as from any.
                headers = {"Last-Event-ID": got[-1].id or ""}
                path = f"/runs/{run_id}/events"
                async with alice.stream("GET", path, headers=headers) as again:
                    rest = [message async for message in messages(again)]
                assert rest[0].id == str(len(got) + 1)
                assert rest[-1].terminal


async def test_start_with_subscribe_to_the_end_and_status_only() -> None:
    async with serving() as served, client(served.base) as alice:
        body = {"agent": "talker", "input": "go", "subscribe": "all", "on_disconnect": "cancel"}
        async with alice.stream("POST", "/runs", json=body) as stream:
            got = [message async for message in messages(stream)]
        assert got[-1].terminal
        assert got[-1].data["event"]["status"] == "completed"
        assert [int(m.id or 0) for m in got] == list(range(1, len(got) + 1))
        body["subscribe"] = "status"
        async with alice.stream("POST", "/runs", json=body) as stream:
            statuses = [message async for message in messages(stream)]
        assert {m.type for m in statuses} == {"run.updated"}
        assert statuses[-1].data["event"]["status"] == "completed"
        # A start refused before any stream: an ordinary JSON error.
        refused = await alice.post("/runs", json={**body, "agent": "nobody"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (404, "not_found")


async def test_agent_listings_show_the_description_never_the_instructions() -> None:
    """GET /agents and the A2A card show what an agent's author chose to publish
    (Agent.description), never its system prompt."""
    model = ScriptedModel([], default=Turn(text="hi"))
    agents = {
        "adder": ta.Agent(
            name="adder", instructions="SECRET: add.\nMore", model=model, description="Adds."
        ),
        "quiet": ta.Agent(name="quiet", instructions="SECRET too", model=model),
        "odd": ta.Agent(name="odd", model=model, description="r\udce9sum\udce9"),
    }
    async with serving(agents) as served, client(served.base) as alice:
        listed = await alice.get("/agents")
        async with client(served.base, token=None) as anonymous:
            card = await anonymous.get("/.well-known/agent-card.json")
    assert listed.status_code == 200
    assert listed.json()["agents"] == [
        {"name": "adder", "description": "Adds."},
        {"name": "odd", "description": "r\ufffdsum\ufffd"},
        {"name": "quiet", "description": None},
    ]
    assert card.status_code == 200
    skills = {skill["id"]: skill["description"] for skill in card.json()["skills"]}
    assert skills == {
        "adder": "Adds.",
        "odd": "r\ufffdsum\ufffd",
        "quiet": "runs the quiet agent",
    }
    assert "SECRET" not in listed.text
    assert "SECRET" not in card.text
    with pytest.raises(TypeError):
        ta.Agent(name="x", model=model, description=5)  # type: ignore[arg-type]
