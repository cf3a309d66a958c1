"""The AG-UI mapping's own contract (``trio_agents.faces._agui_map``), on synthetic event
streams: interrupt ids round-trip and refuse forgeries; a resumed AG-UI run whose
interrupt point fell out of retention goes live at the first later root event."""

from __future__ import annotations

from typing import Any

import pytest
from ag_ui.core import Event
from pydantic import TypeAdapter

from trio_agents.faces._agui_map import EventMapper, _decode_interrupt_id, interrupt_id

EVENT = TypeAdapter(Event)


def _json(events: list[Any]) -> list[dict[str, Any]]:
    out = []
    for event in events:
        text = event.model_dump_json(by_alias=True)
        EVENT.validate_json(text)
        out.append(event.model_dump(by_alias=True, mode="json"))
    return out


@pytest.mark.parametrize(
    ("root", "seq", "run", "call"),
    [("run_1", 7, "run_1", "call_1_0"), ("r", 0, "r/x", "id:with:colons/and slashes ✓")],
)
def test_interrupt_ids_round_trip(root: str, seq: int, run: str, call: str) -> None:
    assert _decode_interrupt_id(interrupt_id(root, seq, run, call)) == (root, seq, run, call)


@pytest.mark.parametrize(
    "forged", ["", "garbage", "WyJhIl0", "eyJhIjogMX0", "WyJyIiwgIjEiLCAiciIsICJjIl0"]
)
def test_forged_interrupt_ids_are_refused(forged: str) -> None:
    with pytest.raises(ValueError, match="not an interrupt id"):
        _decode_interrupt_id(forged)


def test_a_resume_whose_interrupt_point_was_dropped_goes_live_at_the_next_root_event() -> None:
    mapper = EventMapper(thread_id="t", run_id="ag", root="R", after=5)
    assert [e["type"] for e in _json(mapper.started())] == ["RUN_STARTED"]
    call = {"type": "function_call", "call_id": "c1", "name": "launch", "arguments": "{}"}
    # Replayed (the previous AG-UI run sent these): state only, nothing out.
    assert mapper.feed("R", 3, {"type": "run.item", "turn": 1, "item": call}) == []
    child = {"type": "run.child", "child_id": "K", "agent": "helper", "call_id": "c2"}
    assert mapper.feed("R", 4, {**child, "status": "queued"}) == []
    # Seq 5 (the interrupt point) was lost to retention: seq 7 is the first one given.
    out = _json(mapper.feed("R", 7, {"type": "response.text.delta", "turn": 2, "text": "hi"}))
    assert [e["type"] for e in out] == [
        "STEP_STARTED",  # the step still open where the previous AG-UI run closed it
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
    ]
    result = {"type": "function_call_output", "call_id": "c1", "output": "ok", "status": "ok"}
    out = _json(mapper.feed("R", 8, {"type": "run.item", "turn": 2, "item": result}))
    assert out[0]["toolCallId"] == "c1"
    out = _json(mapper.feed("R", 9, {**child, "status": "completed"}))
    assert [e["type"] for e in out] == ["STEP_FINISHED"]
    final: dict[str, Any] = {
        "type": "run.updated",
        "status": "completed",
        "reason": None,
        "detail": {},
    }
    out = _json(mapper.feed("R", 10, final))
    assert [e["type"] for e in out] == ["TEXT_MESSAGE_END", "RUN_FINISHED"]
    assert mapper.finished


def test_an_approval_already_answered_by_this_request_is_not_an_interrupt() -> None:
    mapper = EventMapper(thread_id="t", run_id="ag", root="R", resolved=frozenset({("R", "c1")}))
    waiting = {"type": "run.updated", "status": "awaiting_approval", "reason": None}
    assert mapper.feed("R", 2, {**waiting, "detail": {"pending": ["c1"]}}) == []
    assert not mapper.finished
    out = _json(
        mapper.feed(
            "R",
            3,
            {
                **waiting,
                "detail": {"pending": ["c1"], "waiting": [{"run_id": "K", "call_id": "c"}]},
            },
        )
    )
    (finished,) = out
    (interrupt,) = finished["outcome"]["interrupts"]
    assert (interrupt["toolCallId"], interrupt["message"]) == ("K.c", "approve the tool call c?")
    assert _decode_interrupt_id(interrupt["id"]) == ("R", 3, "K", "c")
