#!/usr/bin/env bash
# Install the peer frameworks into their own venv (never the project's .venv):
# the OpenAI Agents SDK, Strands Agents and pydantic-ai (slim: no provider extras).
# Used only by `make bench-peers`; not part of `make bench` or CI.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
VENV="${PEERS_VENV:-.venv-peers}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -r requirements.txt
"$VENV/bin/python" -m pip list --format=freeze | grep -i -E '^(openai-agents|strands-agents|pydantic-ai-slim|openai|anyio)=' || true
