"""Loading the session at the start of a run: the history, repaired (and the repair
written back, atomically), then the run's input — validated against what the
conversation already holds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from ._exceptions import InvalidConversationError
from ._items import Item, ToolCall, UserMessage
from ._state import OpenCall, RunState, SessionError, stored_rows
from .sessions._dangling_calls import repair_keeping_tail

__all__ = ["load_session"]


def skip_stored(history: Sequence[Item], input: Sequence[Item]) -> tuple[Item, ...]:
    """``input`` without its first user messages when they equal (by content) the run
    of user messages that ends ``history`` — the ``input_overlap="skip"`` option:
    a client that re-sends its whole message list sends again the messages a run that
    failed before answering stored. They are in the session already (a rejected one
    marked, so never sent again), so they are not new input."""
    stored = [cast(UserMessage, item).content for item in history[_users_start(history) :]]
    head = input[: len(stored)]
    if (
        stored
        and all(type(item) is UserMessage for item in head)
        and [cast(UserMessage, item).content for item in head] == stored
    ):
        return tuple(input[len(stored) :])
    return tuple(input)


def _users_start(conversation: Sequence[Item]) -> int:
    """Where the user messages that end ``conversation`` (marked or not) start."""
    start = len(conversation)
    while start > 0 and type(conversation[start - 1]) is UserMessage:
        start -= 1
    return start


def _stored_input(conversation: Sequence[Item]) -> tuple[int, list[Item]]:
    """Where the user messages that end ``conversation`` start, and the unmarked ones."""
    start = _users_start(conversation)
    return start, [item for item in conversation[start:] if item.rejected_by is None]


def recheck_stored_input(state: RunState) -> None:
    """A resumed run (a takeover) re-checks the unmarked user messages that end the
    stored conversation, with every input guardrail as a blocking one, before its first
    model request: they are the input an earlier attempt stored (or the takeover wrote)
    and may have died checking — given as ``input=()``, they would otherwise reach the
    model unchecked. Fail closed: a trip marks them like any rejected input; input that
    had passed before the crash is merely checked again."""
    guardrails = state.agent.input_guardrails
    if not guardrails:
        return
    start, unmarked = _stored_input(state.conversation)
    if unmarked:
        if state.fresh_input is None:
            state.fresh_input = []
        state.fresh_input.extend(unmarked)
        state.fresh_hold = hold = state.hold(start, [g.name for g in guardrails])
        hold.blocking = True


async def load_session(state: RunState) -> list[ToolCall]:
    """Load (and repair) the session's history, then commit the input, once.

    The input is committed even when loading fails, so it is in ``new_items``. A
    resumed run (the ``resume`` option) keeps the calls left open at the end of the
    history open, and returns them (see ``settle_resumed_calls``); otherwise the repair
    closes them and this returns ``[]``.

    Raises:
        SessionError: the session raised (the input is then not written to it).
    """
    if state.input_committed:
        return []
    error: SessionError | None = None
    tail: list[ToolCall] = []
    if state.session is not None and not state.history_loaded:
        resuming = state.options.resume is not None
        try:
            # A resumed run reads the rows as they are (stored_rows): the shipped stored
            # sessions close the calls a dead process left open as ``cancelled`` in
            # get_items, and it must see them open. A session without
            # ``get_stored_items`` is expected to return its rows unrepaired.
            if resuming:
                stored = await stored_rows(state.session)
            else:
                stored = await state.session.get_items()
            # Raises TypeError for garbage.
            repaired, tail = repair_keeping_tail(stored, close_tail=not resuming)
        except Exception as exc:
            error = SessionError(exc)
            state.drop_session()  # never write to a session we could not read
        else:
            state.load_history(repaired)
            state.session_holds(len(stored))
            if resuming:
                recheck_stored_input(state)
            for call in tail:
                state.open_calls[call.call_id] = OpenCall(call)
            if repaired != stored:
                await _write_back(state, stored, repaired)
    state.input_committed = True
    # Committed once, here: the run's tuple of it is not kept for the run's life.
    items, state.input = state.input, ()
    if state.options.input_overlap == "skip" and error is None and items:
        items = skip_stored(state.conversation, items)
        if not items:
            # Nothing new: a retry of the stored messages — checked again, as a resumed
            # run's are (a process may have died checking them) — unless every one
            # was rejected: then there is nothing to run.
            if not _stored_input(state.conversation)[1]:
                state.drop_session()  # nothing of this run belongs in the session
                raise InvalidConversationError(
                    "nothing new to run: the input's messages are already the last ones"
                    " of the stored conversation, rejected by a guardrail"
                )
            if state.options.resume is None:
                recheck_stored_input(state)
    for item in items:
        state.take_input(item)  # user messages: for the first turn's input guardrails
    if error is not None:
        raise error
    problems = state.conversation_problems(allow_open_calls=True)
    if problems:
        state.drop_session()  # refuse to store an invalid conversation
        raise InvalidConversationError(
            f"the input does not fit the stored conversation: {problems[0]}"
        )
    await state.persist()
    return tail


async def _write_back(state: RunState, stored: list[Item], repaired: list[Item]) -> None:
    """Write a load repair back, so the stored rows are valid again — atomically only: a
    repair that just appends (results for calls left open at the end, the usual crash)
    is one ``add_items``; any other goes through the session's ``replace_items`` if it
    has one (a clear followed by an append could lose the history halfway). A session
    with neither is repaired again at every load."""
    session = state.session
    assert session is not None
    try:
        if repaired[: len(stored)] == stored:
            await session.add_items(repaired[len(stored) :])
            state.session_holds(len(repaired))
            return
        replace = getattr(session, "replace_items", None)
        if replace is not None:
            await replace(repaired)
            state.session_holds(len(repaired))
    except Exception as exc:
        state.drop_session()
        raise SessionError(exc) from exc
