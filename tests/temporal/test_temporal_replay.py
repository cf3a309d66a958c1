"""The replay-determinism guard (docs/temporal.md, "Upgrading workers"): the run
workflow's code replays every history in tests/temporal/histories/, each recorded from a
real dev server by ``make temporal-histories`` (tests/temporal/record_histories.py) with
the workflow code of the release its directory names.

Workers are upgraded while runs are open: a new worker replays an open run's history
with its own workflow code, and a change that alters the commands the workflow issues
fails that replay (a non-determinism error: the run is stuck). The rule: if a history
here fails to replay, the change needs ``workflow.patched()``, and the old histories
stay as they are. No server is needed: ``temporalio``'s ``Replayer`` replays in process.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory

from tests.temporal.record_histories import HISTORIES, SCENARIOS
from trio_agents.temporal import replayer

FILES = sorted(HISTORIES.glob("*/*.json"))
# The first workflow code recorded (commit be8d73a): before a push that the attempt did
# not take waited for the next attempt; its histories replay only through the
# "push-waits-for-the-next-attempt" patch's old branch.
BEFORE_PUSH_PATCH = "be8d73a"
# The current workflow code's histories, named after its newest patch.
CURRENT = "push-waits-for-the-next-attempt"
# Scenarios added after be8d73a (their paths did not exist there).
SINCE_CURRENT = {"question_answered"}


def _events(path: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(path.read_text())["events"]
    return events


@pytest.mark.parametrize("path", FILES, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_the_workflow_replays_a_recorded_history(path: Path) -> None:
    history = WorkflowHistory.from_json(f"replay-{path.stem}", path.read_text())
    result = asyncio.run(replayer().replay_workflow(history, raise_on_replay_failure=False))
    assert result.replay_failure is None, f"{path}: {result.replay_failure!r}"


def _recorded(release: str) -> set[str]:
    return {path.stem for path in (HISTORIES / release).glob("*.json")}


def test_every_release_recorded_every_scenario() -> None:
    releases = {path.name for path in HISTORIES.iterdir() if path.is_dir()}
    assert {BEFORE_PUSH_PATCH, CURRENT} <= releases
    assert _recorded(CURRENT) == set(SCENARIOS)
    for release in releases:
        assert _recorded(release) >= set(SCENARIOS) - SINCE_CURRENT, release


def _markers(path: Path) -> list[str]:
    return [
        event["markerRecordedEventAttributes"]["markerName"]
        for event in _events(path)
        if event["eventType"] == "EVENT_TYPE_MARKER_RECORDED"
    ]


def test_the_lost_attempt_takes_both_branches_of_the_push_patch() -> None:
    """The inject pushed to the lost attempt's dead address: the old workflow answered
    "pending" at once (no patch marker), the current one records the patch and waits
    for the next attempt (a timer), then pushes again there (a second push)."""
    old = _markers(HISTORIES / BEFORE_PUSH_PATCH / "lost_attempt.json")
    new = _markers(HISTORIES / CURRENT / "lost_attempt.json")
    assert old == ["core_local_activity"]
    assert new == ["core_local_activity", "core_patch", "core_local_activity"]


def _types(path: Path) -> list[str]:
    return [event["eventType"].removeprefix("EVENT_TYPE_") for event in _events(path)]


@pytest.mark.parametrize("release", sorted(p.name for p in HISTORIES.iterdir() if p.is_dir()))
def test_the_histories_take_the_paths_they_are_named_after(release: str) -> None:
    """A re-recording that missed its path (a scenario that raced differently) would
    leave that path unguarded: each history shows the events of its path."""
    here = HISTORIES / release
    ended = {name: _types(here / f"{name}.json")[-1] for name in _recorded(release)}
    expected = {
        "completed": "WORKFLOW_EXECUTION_COMPLETED",
        "failed": "WORKFLOW_EXECUTION_FAILED",
        "cancel_from_client": "WORKFLOW_EXECUTION_CANCELED",
        "cancel_from_face": "WORKFLOW_EXECUTION_CANCELED",
        "cancel_from_cli": "WORKFLOW_EXECUTION_CANCELED",
        # the cancel update alone: the run ends cancelled, the workflow COMPLETED
        "steering": "WORKFLOW_EXECUTION_COMPLETED",
        "approved": "WORKFLOW_EXECUTION_COMPLETED",
        "rejected": "WORKFLOW_EXECUTION_COMPLETED",
        "parked_then_approved": "WORKFLOW_EXECUTION_COMPLETED",
        "parked_past_deadline": "WORKFLOW_EXECUTION_COMPLETED",
        "parked_then_cancelled": "WORKFLOW_EXECUTION_CANCELED",
        "lost_attempt": "WORKFLOW_EXECUTION_COMPLETED",
        "question_answered": "WORKFLOW_EXECUTION_COMPLETED",
    }
    assert ended == {name: expected[name] for name in _recorded(release)}
    # Updates pushed to an attempt (a local activity's marker) where the path has one.
    for name in ("cancel_from_client", "cancel_from_face", "steering", "approved", "rejected"):
        assert "MARKER_RECORDED" in _types(here / f"{name}.json"), name
    assert "WORKFLOW_EXECUTION_SIGNALED" in _types(here / "cancel_from_face.json")
    # A parked run's next attempt is a second activity; the deadline is a timer.
    for name in ("parked_then_approved", "parked_past_deadline", "parked_then_cancelled"):
        assert _types(here / f"{name}.json").count("ACTIVITY_TASK_SCHEDULED") == 2, name
    assert "TIMER_FIRED" in _types(here / "parked_past_deadline.json")
    # The lost attempt: one activity, retried (its attempt 2 started on the other worker).
    attempts = [
        event["activityTaskStartedEventAttributes"]["attempt"]
        for event in _events(here / "lost_attempt.json")
        if event["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_STARTED"
    ]
    assert attempts == [2]  # a started event is written when its attempt ends: the last
