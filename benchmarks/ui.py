"""Issue 28: the web UI stays responsive with 100 runs listed and a run streaming 1,000
deltas per second — measured in a real headless Chromium (Debian's, as the tests).

``python -m benchmarks.ui`` (needs ``/usr/bin/chromium``; ``--quick`` for tiny sizes).
The server (the real HTTP faces over a LocalHost, in a thread of its own, from the
browser tests' support) holds 100 finished runs of the signed-in principal; then one
run streams ``--rate`` deltas per second for ``--seconds``, paced by the clock, while
the page shows it. Probes put into the page (through the DevTools protocol, not the
page's own script) measure, during the stream and during as long an idle stretch before
it (the floor, same page, same process):

- *lag*: how late a 16 ms timer fires (p50, p99, max) — what a click or a key press
  would wait for the page's main thread;
- *frames*: animation frames per second (60 is the display's rate);
- *long tasks*: main-thread tasks over 50 ms (the browser's own "unresponsive" bar);
- *kept up*: every delta shown, none twice, none missing, and the text complete at the
  end (the page applies events as fast as they arrive, with no backlog).

Figures go to ``benchmarks/ui.md`` and into RESULTS.md's "Issue 28" section (kept by
``make bench``, which folds ui.md in).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, Final, final

import trio

from trio_agents import Agent, ModelRequest
from trio_agents.models import Finish, ModelEvent, TextDelta, Usage

HERE = Path(__file__).resolve().parent
MARK: Final = "## Issue 28: the web UI in a browser"

# What the probes collect in the page: timer lag, frames, long tasks.
_PROBE = """() => {
  const p = { lags: [], frames: 0, long: [], stop: false, first: null, last: null, events: null };
  window.__probe = p;
  const tick = (due) => {
    if (p.stop) return;
    if (due !== null) p.lags.push(performance.now() - due);
    const next = performance.now() + 16;
    setTimeout(() => tick(next), 16);
  };
  tick(null);
  // when the events counter first and last moved: the rate the page applied them at
  const frame = () => {
    if (p.stop) return;
    p.frames += 1;
    const stats = window.trioAgentsUI.stats();
    const events = stats ? stats.events : 0;
    if (p.events !== null && events !== p.events) {
      const now = performance.timeOrigin + performance.now();
      if (p.first === null) p.first = { t: now, events: p.events };
      p.last = { t: now, events };
    }
    p.events = events;
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) p.long.push(e.duration);
  }).observe({ type: "longtask", buffered: false });
  p.t0 = performance.now();
}"""

_COLLECT = """() => {
  const p = window.__probe;
  p.stop = true;
  return { lags: p.lags, frames: p.frames, long: p.long, seconds: (performance.now() - p.t0) / 1000,
           first: p.first, last: p.last };
}"""


@final
class _Paced(AbstractAsyncContextManager[AsyncIterator[ModelEvent]]):
    """``count`` deltas at ``rate`` per second, paced on the clock (not a sleep per
    delta: late ones are sent at once, so the rate holds on a loaded machine)."""

    def __init__(self, model: PacedModel) -> None:
        self.model = model
        self.sent = 0
        self.tail = 0
        self.t0 = 0.0

    async def __aenter__(self) -> AsyncIterator[ModelEvent]:
        await self.model.go.wait()
        self.t0 = trio.current_time()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def __aiter__(self) -> _Paced:
        return self

    async def __anext__(self) -> ModelEvent:
        if self.sent < self.model.count:
            await trio.sleep_until(self.t0 + self.sent / self.model.rate)
            self.sent += 1
            return TextDelta(f"d{self.sent} ")
        self.tail += 1
        if self.tail == 1:
            return Usage(input_tokens=10, output_tokens=self.model.count)
        if self.tail == 2:
            return Finish("stop")
        raise StopAsyncIteration


@final
class PacedModel:
    """Streams ``count`` deltas at ``rate`` per second once :attr:`go` is set."""

    def __init__(self, count: int, rate: float) -> None:
        self.count = count
        self.rate = rate
        self.go = trio.Event()

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        return _Paced(self)


def _summary(probe: Mapping[str, Any]) -> dict[str, float]:
    lags = sorted(probe["lags"]) or [0.0]
    return {
        "lag_p50_ms": statistics.median(lags),
        "lag_p99_ms": lags[min(len(lags) - 1, int(0.99 * len(lags)))],
        "lag_max_ms": lags[-1],
        "fps": probe["frames"] / max(probe["seconds"], 1e-9),
        "long_tasks": float(len(probe["long"])),
        "long_task_ms": float(sum(probe["long"])),
    }


def _server_alone(server: Any, model: PacedModel) -> float:
    """Events per second the server's event stream delivers to a plain HTTP client
    reading as fast as it can (no browser): what the page could be given at most."""
    import httpx

    from tests.support.ui_support import ALICE

    run_id = server.start(ALICE, "firehose_bare", "go")
    headers = {"Authorization": f"Bearer {ALICE}"}
    with (
        httpx.Client(base_url=server.url, headers=headers, timeout=120) as client,
        client.stream("GET", f"/runs/{run_id}/events?tree=1") as answer,
    ):
        server.gates.token.run_sync_soon(model.go.set)
        events, first = 0, 0.0
        for line in answer.iter_lines():
            if line.startswith("data:"):
                events += 1
                if events == 10:  # past the run's start: the stream proper
                    first = time.perf_counter()
        return (events - 10) / (time.perf_counter() - first)


def _metrics(cdp: Any) -> dict[str, float]:
    """The page's cumulative main-thread times (seconds), from the DevTools protocol."""
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def _print_profile(profile: Mapping[str, Any]) -> None:
    """The functions the page spent the most time in (``--profile``)."""
    nodes = {node["id"]: node for node in profile["nodes"]}
    spent: dict[str, float] = {}
    deltas = profile["timeDeltas"]
    for sample, delta in zip(profile["samples"], deltas, strict=False):
        frame = nodes[sample]["callFrame"]
        name = f"{frame['functionName'] or '(anonymous)'} {frame['url'].rsplit('/', 1)[-1]}:{frame['lineNumber']}"
        spent[name] = spent.get(name, 0.0) + delta / 1000
    for name, ms in sorted(spent.items(), key=lambda kv: -kv[1])[:25]:
        print(f"{ms:10.1f} ms  {name}")


def measure(*, runs: int, rate: float, seconds: float, profile: bool = False) -> dict[str, Any]:
    """Run the scenario; the figures (see the module docstring)."""
    from playwright.sync_api import expect, sync_playwright

    from tests.support.ui_support import (
        ALICE,
        CHROMIUM,
        CHROMIUM_ARGS,
        Gates,
        running_ui_server,
        ui_agents,
    )

    count = int(rate * seconds)
    model = PacedModel(count, rate)
    bare = PacedModel(count, rate)  # the same stream, read without a browser

    def agents(gates: Gates) -> dict[str, Agent]:
        return {
            **ui_agents(gates),
            "firehose": Agent(name="firehose", instructions="Streams.", model=model),
            "firehose_bare": Agent(name="firehose_bare", instructions="Streams.", model=bare),
        }

    with running_ui_server(agents) as server:
        server_rate = _server_alone(server, bare)
        for number in range(runs):
            server.start(ALICE, "quick", f"run {number}")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 820})
                page.goto(server.url + "/ui/")
                page.fill("#token", ALICE)
                page.click("#signin-form button")
                expect(page.locator("#runs tbody tr")).to_have_count(runs + 1, timeout=30_000)
                run_id = server.start(ALICE, "firehose", "go")
                page.goto(f"{server.url}/ui/#/runs/{run_id}")
                expect(page.locator("#runs tbody tr")).to_have_count(runs + 2, timeout=30_000)
                expect(page.locator("#conn")).to_have_text("live", timeout=30_000)
                # the floor: the same page, idle, as long as the stream will last
                page.evaluate(_PROBE)
                page.wait_for_timeout(seconds * 1000)
                idle = _summary(page.evaluate(_COLLECT))
                metrics = page.context.new_cdp_session(page)
                metrics.send("Performance.enable")
                before = _metrics(metrics)
                page.evaluate(_PROBE)
                cdp = page.context.new_cdp_session(page) if profile else None
                if cdp is not None:
                    cdp.send("Profiler.enable")
                    cdp.send("Profiler.start")
                assert server.gates.token is not None
                went = time.time() * 1000  # epoch ms, as the page's timeOrigin + now()
                server.gates.token.run_sync_soon(model.go.set)
                page.wait_for_function(
                    "() => window.trioAgentsUI.stats().done",
                    timeout=(seconds * 4 + 30) * 1000,
                    polling=100,
                )
                probe = page.evaluate(_COLLECT)
                after = _metrics(metrics)
                if cdp is not None:
                    _print_profile(cdp.send("Profiler.stop")["profile"])
                busy = _summary(probe)
                stats = page.evaluate("window.trioAgentsUI.stats()")
                shown = page.locator(".tree > .node .msg.assistant").inner_text()
            finally:
                browser.close()
    events = stats["events"]
    main_thread = {
        name: (after[name] - before[name]) * 1000 / events
        for name in ("TaskDuration", "ScriptDuration", "LayoutDuration", "RecalcStyleDuration")
    }
    expected = "".join(f"d{i} " for i in range(1, count + 1))
    return {
        "load": os.getloadavg()[0],
        "runs_listed": runs + 2,
        "deltas": count,
        "rate_asked": rate,
        "server_alone_rate": server_rate,
        # the rate the page applied events at, from its first to its last frame that
        # saw new ones (deltas are most of them: a few status and item events besides)
        "rate_shown": (probe["last"]["events"] - probe["first"]["events"])
        / max((probe["last"]["t"] - probe["first"]["t"]) / 1000, 1e-9),
        # how long after the paced schedule ended the page showed the last delta
        "last_delta_late_ms": probe["last"]["t"] - (went + seconds * 1000),
        "text_complete": shown.split() == expected.split(),  # sealed blocks: newlines
        "events": events,
        # the page's main-thread time per event (ms), and so the rate it could take
        # with its main thread fully busy
        "ms_per_event": main_thread,
        "sustainable_rate": 1000 / max(main_thread["TaskDuration"], 1e-9),
        "duplicates": stats["duplicates"],
        "gaps": stats["gaps"],
        "idle": idle,
        "streaming": busy,
    }


def _markdown(result: Mapping[str, Any], *, quick: bool) -> str:
    idle, busy = result["idle"], result["streaming"]
    cost = result["ms_per_event"]
    rows = [
        ("timer lag p50 (ms)", "lag_p50_ms"),
        ("timer lag p99 (ms)", "lag_p99_ms"),
        ("timer lag max (ms)", "lag_max_ms"),
        ("animation frames per second", "fps"),
        ("long tasks (> 50 ms)", "long_tasks"),
        ("time in long tasks (ms)", "long_task_ms"),
    ]
    lines = [
        MARK,
        "",
        "Written by `python -m benchmarks.ui` (headless Chromium, Debian's; the page of"
        " `/ui` over the real HTTP faces)"
        + (" — **quick mode: tiny sizes**" if quick else "")
        + f". {result['runs_listed']} runs listed; one streams {result['deltas']} deltas at"
        f" {result['rate_asked']:.0f} per second. The floor is the same page idle for as long."
        f" Load average during the run: {result['load']:.1f} on {os.cpu_count()} CPUs"
        " (main-thread times are wall time: they grow with the machine's load).",
        "",
        "| figure | idle (floor) | streaming | target |",
        "|---|---|---|---|",
    ]
    targets = {"lag_p99_ms": "≤ 50", "long_tasks": "0", "fps": "≥ 30"}
    for label, key in rows:
        lines.append(f"| {label} | {idle[key]:.1f} | {busy[key]:.1f} | {targets.get(key, '')} |")
    kept = result["text_complete"] and result["duplicates"] == 0 and result["gaps"] == 0
    lines += [
        f"| events per second the server streams to a plain HTTP client (no browser) | |"
        f" {result['server_alone_rate']:.0f} | ≥ {result['rate_asked'] * 0.95:.0f} |",
        f"| deltas shown per second | | {result['rate_shown']:.0f} | ≥ {result['rate_asked'] * 0.95:.0f} |",
        f"| last delta shown after its schedule (ms) | | {result['last_delta_late_ms']:.0f} | ≤ 100 |",
        "| page main thread per event: all tasks / script / layout (ms) | |"
        f" {cost['TaskDuration']:.3f} / {cost['ScriptDuration']:.3f} / {cost['LayoutDuration']:.3f} | |",
        f"| events per second the page could take, main thread full | | {result['sustainable_rate']:.0f} | ≥ 1000 |",
        f"| every delta shown once, text complete | | {'yes' if kept else '**no**'} | yes |",
        "",
    ]
    return "\n".join(lines)


def write(markdown: str) -> None:
    """``benchmarks/ui.md``, and the section of RESULTS.md (replaced in place)."""
    (HERE / "ui.md").write_text(markdown)
    results = HERE / "RESULTS.md"
    text = results.read_text() if results.exists() else ""
    start = text.find(MARK)
    if start >= 0:
        end = text.find("\n## ", start + len(MARK))
        text = text[:start] + markdown.rstrip() + ("\n" + text[end:] if end >= 0 else "\n")
    else:
        anchor = text.find("\n## Every figure")
        insert = "\n" + markdown.rstrip() + "\n"
        text = text[:anchor] + insert + text[anchor:] if anchor >= 0 else text + insert
    results.write_text(text)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--profile", action="store_true", help="print where the page spent its time"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.seconds = 5, 0.5
    result = measure(runs=args.runs, rate=args.rate, seconds=args.seconds, profile=args.profile)
    print(json.dumps(result, indent=2))
    markdown = _markdown(result, quick=args.quick)
    print(markdown)
    if not args.no_write:
        write(markdown)


if __name__ == "__main__":
    main()
