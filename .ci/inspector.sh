#!/usr/bin/env bash
# The MCP reference Inspector for the MCP face's interop tests
# (tests/faces/test_mcp_inspector.py drives its --cli mode). Idempotent and quiet, like
# chromium.sh: `npm install` into the repository's node_modules/ (git-ignored) only when
# it is missing; without npm it says so (the tests then skip, or fail under CI).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.17
if [ -x node_modules/.bin/mcp-inspector ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "inspector.sh: no npm found; install Node.js (npm) to run the MCP Inspector tests" >&2
    exit 0
fi
echo "inspector.sh: installing @modelcontextprotocol/inspector@$VERSION (npm)" >&2
npm install --no-save --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/inspector@$VERSION" >/dev/null
[ -x node_modules/.bin/mcp-inspector ] || { echo "inspector.sh: installed, still no node_modules/.bin/mcp-inspector" >&2; exit 1; }
