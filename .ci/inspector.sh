#!/usr/bin/env bash
# The MCP reference tools for the MCP interop tests: the Inspector
# (tests/faces/test_mcp_inspector.py drives its --cli mode) and server-everything
# (tests/tools/test_mcp_everything.py: its elicitation and sampling ask our client).
# Idempotent and quiet, like chromium.sh: `npm install` into the repository's
# node_modules/ (git-ignored) only when either is missing; without npm it says so (the
# tests then skip, or fail under CI). Both in ONE `npm install --no-save`: a second one
# would prune the package the first installed (it is in no package.json).
set -euo pipefail
cd "$(dirname "$0")/.."
INSPECTOR=0.17
EVERYTHING=2026.8.31
if [ -x node_modules/.bin/mcp-inspector ] && [ -x node_modules/.bin/mcp-server-everything ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "inspector.sh: no npm found; install Node.js (npm) to run the MCP interop tests" >&2
    exit 0
fi
echo "inspector.sh: installing @modelcontextprotocol/inspector@$INSPECTOR and" \
    "@modelcontextprotocol/server-everything@$EVERYTHING (npm)" >&2
npm install --no-save --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/inspector@$INSPECTOR" \
    "@modelcontextprotocol/server-everything@$EVERYTHING" >/dev/null
for bin in mcp-inspector mcp-server-everything; do
    [ -x "node_modules/.bin/$bin" ] || { echo "inspector.sh: installed, still no node_modules/.bin/$bin" >&2; exit 1; }
done
