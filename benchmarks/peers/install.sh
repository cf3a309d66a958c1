#!/usr/bin/env bash
# Install each peer framework into its own venv (never the project's .venv), so their
# dependency pins cannot clash: .venv-<peer>/ for openai-agents, strands, pydantic-ai
# and adk (requirements-<peer>.txt). Used only by `make bench-peers`; not CI.
# PEERS="strands adk" installs only those.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
for peer in ${PEERS:-openai-agents strands pydantic-ai adk}; do
    venv=".venv-$peer"
    if [ ! -x "$venv/bin/python" ]; then
        "$PYTHON" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --upgrade pip
    fi
    if ! "$venv/bin/python" -m pip install --quiet -r "requirements-$peer.txt"; then
        echo "install.sh: could not install $peer (see pip's message above)" >&2
    fi
done
