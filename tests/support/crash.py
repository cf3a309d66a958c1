"""A real crash: a child process killed with SIGKILL at a point it announces."""

from __future__ import annotations

import signal
import subprocess
import sys

import trio


async def sigkill_once_printed(script: str, argument: str, *markers: bytes) -> None:
    """Run ``python -c script argument`` and SIGKILL it once it has printed every one of
    ``markers`` on stdout (the caller bounds the wait with its own deadline)."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", script, argument], stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    try:
        seen = b""
        while not all(marker in seen for marker in markers):
            chunk = await process.stdout.receive_some()
            assert chunk, f"the child exited before printing {markers}"
            seen += chunk
        process.send_signal(signal.SIGKILL)
        assert await process.wait() == -signal.SIGKILL
    finally:
        process.kill()  # a no-op once it is dead
        await process.wait()
        await process.stdout.aclose()
