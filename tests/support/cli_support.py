"""Helpers for the command-line tests: run ``trio-agents`` as a real process.

The command runs as ``python -m trio_agents`` (the console script is the same
``main``). Waits are on the process's readable output (its "serving ... on ws://"
line, an event line), never on sleeps; ``trio.fail_after`` bounds in the tests are
only hang guards.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

ROOT = Path(__file__).resolve().parents[2]
SERVING = re.compile(r"^serving .* on (ws://\S+/) ")


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a CLI process: no provider or token settings leak in."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "ANTHROPIC_", "TRIO_AGENTS_"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def cli_argv(*args: str | os.PathLike[str]) -> list[str]:
    """The argv of ``trio-agents ARGS``."""
    return [sys.executable, "-m", "trio_agents", *(os.fspath(arg) for arg in args)]


def cli(
    *args: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``trio-agents ARGS`` to the end (sync)."""
    return subprocess.run(
        cli_argv(*args),
        env=dict(env) if env is not None else cli_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard only
        check=False,
    )


async def acli(
    *args: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``trio-agents ARGS`` to the end from a Trio test (the test's own servers
    keep running meanwhile)."""
    done = await trio.run_process(
        cli_argv(*args),
        env=dict(env) if env is not None else cli_env(),
        cwd=ROOT,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def assert_one_error_line(done: subprocess.CompletedProcess[str], status: int) -> str:
    """The process failed with ``status`` and one line on stderr, no traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == status, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("trio-agents"), lines[0]
    return lines[0]


@attrs.define(eq=False)
class LineReader:
    """Lines of a process's output stream, read as they come."""

    stream: trio.abc.ReceiveStream
    lines: list[str] = attrs.field(factory=list)
    _buffer: bytes = b""
    _eof: bool = False

    async def readline(self) -> str | None:
        """The next line, or None at the end of the stream."""
        while b"\n" not in self._buffer and not self._eof:
            chunk = await self.stream.receive_some()
            if not chunk:
                self._eof = True
            self._buffer += chunk
        if not self._buffer:
            return None
        raw, _, self._buffer = self._buffer.partition(b"\n")
        line = raw.decode()
        self.lines.append(line)
        return line

    async def until(self, predicate: Callable[[str], bool]) -> str:
        """Read until a line matches; fail if the stream ends first."""
        while (line := await self.readline()) is not None:
            if predicate(line):
                return line
        raise AssertionError(f"the output ended without the expected line: {self.lines}")

    async def rest(self) -> list[str]:
        """Every line to the end of the stream."""
        start = len(self.lines)
        while await self.readline() is not None:
            pass
        return self.lines[start:]


@attrs.define(eq=False)
class CLIProcess:
    """A running ``trio-agents`` process: its stdout by lines, its stderr collected."""

    process: trio.Process
    stdout: LineReader
    stderr_chunks: list[bytes]

    @property
    def stderr(self) -> str:
        return b"".join(self.stderr_chunks).decode()


async def _collect(stream: trio.abc.ReceiveStream, chunks: list[bytes]) -> None:
    while chunk := await stream.receive_some():
        chunks.append(bytes(chunk))


@asynccontextmanager
async def cli_process(
    *args: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> AsyncIterator[CLIProcess]:
    """Start ``trio-agents ARGS``; killed (if still running) when the block ends."""
    process = await trio.lowlevel.open_process(
        cli_argv(*args),
        env=dict(env) if env is not None else cli_env(),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    running = CLIProcess(process, LineReader(process.stdout), [])
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_collect, process.stderr, running.stderr_chunks)
            try:
                yield running
            finally:
                if process.returncode is None:
                    process.kill()
                with trio.CancelScope(shield=True):
                    await process.wait()
    finally:
        with trio.CancelScope(shield=True):
            await process.stdout.aclose()
            await process.stderr.aclose()


async def serving_url(running: CLIProcess) -> str:
    """Wait for ``serve``'s "serving ... on ws://..." line; return the URL."""
    line = await running.stdout.until(lambda text: SERVING.match(text) is not None)
    match = SERVING.match(line)
    assert match is not None
    return match.group(1)
