"""A question a running tool asks (``ToolContext.request_approval(schema=...)``),
answered with content through ``approve_call(..., content=)`` — the ``approve``
update's optional second argument — on a real worker process of a real dev server."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import pytest
from temporalio.client import Client

from tests.support.temporal_support import Workers
from trio_agents.temporal import OpAnswer, approve_call, run_result, start_run

BOUND = 90.0  # hang guard per wait: a loaded 2-core box is slow, never this slow
QUESTION = "call_question:ask-1"  # what the rules agent's "question" tool asks


def test_a_question_is_answered_with_content(workers: Callable[[int], Workers]) -> None:
    group = workers(1)

    async def main() -> tuple[list[OpAnswer], str]:
        client = await Client.connect(group.target)
        handle = await start_run(client, "rules", "question", task_queue=group.task_queue)
        # Content is checked before anything is recorded: not a JSON object.
        with pytest.raises(TypeError, match="mapping"):
            await approve_call(client, handle.id, QUESTION, content=["red"])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="JSON"):
            await approve_call(client, handle.id, QUESTION, content={"color": math.nan})
        deadline = time.monotonic() + BOUND
        while True:  # not_found until the tool has asked
            wrong = await approve_call(client, handle.id, QUESTION, content={"color": 5})
            if wrong.code != "not_found" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        right = await approve_call(client, handle.id, QUESTION, content={"color": "red"})
        outcome = await asyncio.wait_for(run_result(client, handle.id), BOUND)
        return [wrong, right], outcome.final_output

    (wrong, right), output = asyncio.run(main())
    assert (wrong.ok, wrong.code) == (False, "invalid_request"), wrong
    assert wrong.message is not None
    assert "schema" in wrong.message
    assert right.ok, right
    assert output == "done: color: red"
