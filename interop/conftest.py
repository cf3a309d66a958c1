"""Fixtures of ``make interop``: a real LiteLLM proxy, started offline from its own venv.

The proxy (``litellm`` from PyPI, in ``.venv-interop``, see ``install.sh``) runs as a
subprocess on a free loopback port with four models:

* ``mock-gpt`` — LiteLLM's own mock (``mock_response``): answers without any upstream;
* ``upstream`` — an ``openai/`` model whose ``api_base`` is a loopback port the tests
  serve with ``tests/support/sse_server.py``: the proxy is then a real third party in the middle,
  parsing what we send, re-sending it with its own OpenAI client and re-streaming the
  answer;
* ``claude-upstream`` — an ``anthropic/`` model on the same loopback port: the proxy
  speaks Anthropic's Messages API to it and answers in the Chat Completions shape;
* ``dead`` — an ``openai/`` model whose upstream port nothing listens on.

``LITELLM_LOCAL_MODEL_COST_MAP`` keeps it from fetching its model price list, so it
starts with no network at all.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.support.sse_server import unused_port

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("INTEROP_VENV", ROOT / ".venv-interop"))
START_BOUND = 180.0
"""Seconds the proxy may take to start (it imports a lot) before the session fails."""


@attrs.frozen
class Proxy:
    """A running LiteLLM proxy."""

    base_url: str
    key: str
    upstream_port: int


def _wait_until_serving(process: subprocess.Popen[str], log: list[str]) -> None:
    """Read the proxy's output until uvicorn says it serves (bounded, no polling sleep)."""
    assert process.stdout is not None
    deadline = time.monotonic() + START_BOUND
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError("the LiteLLM proxy did not start:\n" + "".join(log[-40:]))
            if not selector.select(remaining):
                continue
            line = process.stdout.readline()
            if not line:
                raise RuntimeError("the LiteLLM proxy exited:\n" + "".join(log[-40:]))
            log.append(line)
            if "Uvicorn running on" in line:
                return


@pytest.fixture(scope="session")
def litellm_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    executable = VENV / "bin" / "litellm"
    if not executable.exists():
        pytest.fail(f"{executable} is missing: run `make interop` (it runs interop/install.sh)")
    port, upstream_port, dead_port = unused_port(), unused_port(), unused_port()
    key = "sk-interop-" + secrets.token_hex(16)
    config = {
        "model_list": [
            {
                "model_name": "mock-gpt",
                "litellm_params": {
                    "model": "openai/mock-gpt",
                    "api_key": "sk-unused",
                    "mock_response": "Hello from the mock.",
                },
            },
            {
                "model_name": "upstream",
                "litellm_params": {
                    "model": "openai/upstream-model",
                    "api_key": "sk-upstream",
                    "api_base": f"http://127.0.0.1:{upstream_port}/v1",
                },
            },
            {
                # An Anthropic model on the same loopback upstream: the proxy speaks the
                # Messages API to it and answers us in the Chat Completions shape.
                "model_name": "claude-upstream",
                "litellm_params": {
                    "model": "anthropic/claude-sonnet-4-5",
                    "api_key": "sk-ant-upstream",
                    "api_base": f"http://127.0.0.1:{upstream_port}",
                },
            },
            {
                "model_name": "dead",
                "litellm_params": {
                    "model": "openai/dead",
                    "api_key": "sk-unused",
                    "api_base": f"http://127.0.0.1:{dead_port}/v1",
                },
            },
        ],
        "litellm_settings": {"num_retries": 0, "request_timeout": 60},
    }
    config_path = tmp_path_factory.mktemp("litellm") / "config.yaml"
    config_path.write_text(json.dumps(config))  # JSON is YAML
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LITELLM_"))},
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_MASTER_KEY": key,
        "NO_PROXY": "127.0.0.1,localhost",
    }
    command = [str(executable), "--config", str(config_path), "--host", "127.0.0.1"]
    process = subprocess.Popen(
        [*command, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=config_path.parent,
    )
    log: list[str] = []
    drain: threading.Thread | None = None
    try:
        _wait_until_serving(process, log)
        # Keep reading its output, or a full pipe would block the proxy.
        assert process.stdout is not None
        drain = threading.Thread(target=log.extend, args=(process.stdout,), daemon=True)
        drain.start()
        yield Proxy(f"http://127.0.0.1:{port}/v1", key, upstream_port)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if drain is not None:
            drain.join(timeout=10)  # the pipe is at its end: the proxy has exited
        if process.stdout is not None:
            process.stdout.close()
