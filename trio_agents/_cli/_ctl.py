"""``trio-agents ctl URL VERB``: drive a control server's runs.

Output is for people by default: events as lines with streamed text inline, runs as a
table, one confirmation line per verb. ``--json`` prints one JSON object per line
instead. ``start --detach`` and ``inject`` print the bare id (or ``{"run_id": ...}`` /
``{"injection_id": ...}`` with ``--json``), so ``RID=$(trio-agents ctl URL start demo
hi --detach)`` works in a shell.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import attrs
import trio

from .._exceptions import RunClosedError
from ..control import ControlClient, RemoteRun, connect
from ..control._client import RemoteEventCursor
from ._errors import EXIT_INTERRUPTED, EXIT_USAGE, CLIError
from ._format import Printer, json_line, run_table

__all__ = ["ctl_command", "run_ctl"]


def _write(out: TextIO, line: str) -> None:
    out.write(line + "\n")
    out.flush()


async def _stream(events: RemoteEventCursor, args: argparse.Namespace, out: TextIO) -> None:
    printer = Printer(out)
    async for event in events:
        if args.json:
            _write(out, json_line(event.to_json()))
        else:
            printer.event(event)
    printer.end()


async def _list(client: ControlClient, args: argparse.Namespace, out: TextIO) -> None:
    runs = await client.list_runs()
    if args.json:
        for info in runs:
            _write(out, json_line(info.to_json()))
    elif not runs:
        _write(out, "no runs")
    else:
        for line in run_table(runs):
            _write(out, line)


async def _get(client: ControlClient, args: argparse.Namespace, out: TextIO) -> None:
    info = await client.attach(args.run_id).get()
    if args.json:
        _write(out, json_line(info.to_json()))
        return
    for line in run_table([info]):
        _write(out, line)


async def _watch(client: ControlClient, args: argparse.Namespace, out: TextIO) -> None:
    await _stream(client.attach(args.run_id).events(args.from_seq), args, out)


async def _start(client: ControlClient, args: argparse.Namespace, out: TextIO) -> None:
    run = await client.start(
        args.agent,
        args.input,
        session_id=args.session,
        on_disconnect=args.on_disconnect,
        subscribe=None if args.detach else "all",
    )
    if args.detach:
        _write(out, json_line({"run_id": run.id}) if args.json else run.id)
        return
    if not args.json:
        _write(out, f"run {run.id} started")
    await _stream(run.events(1), args, out)


async def _act(run: RemoteRun, verb: str, action: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return await action()
    except RunClosedError as exc:
        raise CLIError(f"cannot {verb} run {run.id}: it has already ended ({exc.status})") from None


async def _cancel(client: ControlClient, args: argparse.Namespace, out: TextIO) -> None:
    run = client.attach(args.run_id)
    mode = "after_turn" if args.after_turn else "immediate"
    await _act(run, "cancel", lambda: run.cancel(args.reason, mode=mode))
    if args.json:
        _write(out, json_line({"run_id": run.id, "cancel": mode}))
    else:
        when = " after the current turn" if args.after_turn else ""
        _write(out, f"run {run.id}: cancel requested{when}")


async def _inject(client: ControlClient, args: argparse.Namespace, out: TextIO) -> None:
    run = client.attach(args.run_id)
    injection = await _act(run, "inject into", lambda: run.inject(args.text, when=args.when))
    if args.json:
        _write(out, json_line({"run_id": run.id, "injection_id": injection}))
    else:
        _write(out, str(injection))


async def _withdraw(client: ControlClient, args: argparse.Namespace, out: TextIO) -> None:
    run = client.attach(args.run_id)
    withdrawn = await _act(run, "withdraw from", lambda: run.withdraw(args.injection_id))
    if args.json:
        _write(
            out,
            json_line(
                {"run_id": run.id, "injection_id": args.injection_id, "withdrawn": withdrawn}
            ),
        )
    elif withdrawn:
        _write(out, f"run {run.id}: injection {args.injection_id} withdrawn")
    else:
        _write(
            out,
            f"run {run.id}: injection {args.injection_id} not withdrawn"
            " (already delivered, or no such injection)",
        )


async def _approve(client: ControlClient, args: argparse.Namespace, out: TextIO) -> None:
    run = client.attach(args.run_id)
    content = args.content
    await _act(run, "approve a call of", lambda: run.approve(args.call_id, content=content))
    if args.json:
        line = {"run_id": run.id, "call_id": args.call_id, "approved": True}
        if content is not None:
            line["content"] = content
        _write(out, json_line(line))
    elif content is not None:
        _write(out, f"run {run.id}: call {args.call_id} approved with content {json_line(content)}")
    else:
        _write(out, f"run {run.id}: call {args.call_id} approved")


async def _reject(client: ControlClient, args: argparse.Namespace, out: TextIO) -> None:
    run = client.attach(args.run_id)
    await _act(run, "reject a call of", lambda: run.reject(args.call_id, message=args.message))
    if args.json:
        _write(out, json_line({"run_id": run.id, "call_id": args.call_id, "approved": False}))
    else:
        _write(out, f"run {run.id}: call {args.call_id} rejected")


async def _fork(client: ControlClient, args: argparse.Namespace, out: TextIO) -> None:
    at = args.at if args.at_event is None else args.at_event
    items = await client.fork_session(args.session_id, args.new_session_id, at=at)
    if args.json:
        _write(out, json_line({"session_id": args.new_session_id, "items": items}))
    else:
        _write(out, f"session {args.session_id} forked into {args.new_session_id} ({items} items)")


_VERBS: dict[str, Callable[[ControlClient, argparse.Namespace, TextIO], Awaitable[None]]] = {
    "list": _list,
    "get": _get,
    "watch": _watch,
    "start": _start,
    "cancel": _cancel,
    "inject": _inject,
    "withdraw": _withdraw,
    "approve": _approve,
    "reject": _reject,
    "fork": _fork,
}


@attrs.define(eq=False)
class _Interrupt:
    """What Ctrl-C cancels: the verb alone once connected, so the connection still
    closes normally (its reader must run to complete the close handshake); before
    that, everything."""

    verb_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    connected: bool = False
    received: bool = False


async def _verb(args: argparse.Namespace, out: TextIO, interrupt: _Interrupt) -> None:
    async with connect(args.url, token=args.token) as client:
        interrupt.connected = True
        with interrupt.verb_scope:
            await _VERBS[args.verb](client, args, out)


async def run_ctl(args: argparse.Namespace, out: TextIO) -> int:
    """Connect and run one verb (async; :func:`ctl_command` is the sync entry).

    Ctrl-C stops the verb, closes the connection normally (code 1000) and raises
    :class:`CLIError` with status 130.
    """
    if not args.token:
        raise CLIError("ctl needs a token: --token TOKEN or $TRIO_AGENTS_TOKEN", status=EXIT_USAGE)
    interrupt = _Interrupt()
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def on_signal() -> None:
                async for _ in signals:
                    interrupt.received = True
                    interrupt.verb_scope.cancel()
                    if not interrupt.connected:
                        nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(on_signal)
            await _verb(args, out, interrupt)
            nursery.cancel_scope.cancel()
    if interrupt.received and (interrupt.verb_scope.cancelled_caught or not interrupt.connected):
        note = ""
        if args.verb in ("start", "watch") and getattr(args, "on_disconnect", "") != "cancel":
            run = getattr(args, "run_id", "RUN")
            note = f" (the run goes on; follow it with: trio-agents ctl {args.url} watch {run})"
        raise CLIError(f"interrupted{note}", status=EXIT_INTERRUPTED)
    return 0


def ctl_command(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``trio-agents ctl``."""
    return trio.run(run_ctl, args, out)
