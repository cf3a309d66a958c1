"""A hostile MCP "server" for the tests: raw JSON-RPC lines over stdio, misbehaving on
purpose. ``python tests/support/mcp_raw_server.py MODE PIDFILE`` writes its pid to PIDFILE,
then:

- ``silent-init``: never answers anything (not even ``initialize``);
- ``silent-list``: answers ``initialize``, never answers ``tools/list``;
- ``garbage``: before each answer writes a line that is not JSON and one that is JSON
  but no JSON-RPC message (as a server printing a banner or a log line to stdout);
- ``die-on-call``: lists one tool ``echo``; a ``tools/call`` makes it exit at once.
"""

from __future__ import annotations

import json
import os
import sys

PROTOCOL = "2025-06-18"


def send(message: object) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def raw(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    mode, pidfile = sys.argv[1], sys.argv[2]
    with open(pidfile, "w", encoding="utf-8") as file:
        file.write(str(os.getpid()))
    for line in sys.stdin:
        message = json.loads(line)
        method, ident = message.get("method"), message.get("id")
        if ident is None or mode == "silent-init":
            continue  # notifications; or answer nothing at all
        if mode == "garbage":
            raw("Server starting... {not json")
            raw(json.dumps({"hello": "world"}))
        if method == "initialize":
            version = message["params"].get("protocolVersion", PROTOCOL)
            result = {
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "0"},
            }
            send({"jsonrpc": "2.0", "id": ident, "result": result})
        elif method == "tools/list":
            if mode == "silent-list":
                continue
            echo = {
                "name": "echo",
                "description": "Echo.",
                "inputSchema": {"type": "object", "properties": {}},
            }
            send({"jsonrpc": "2.0", "id": ident, "result": {"tools": [echo]}})
        elif method == "tools/call" and mode == "die-on-call":
            os._exit(5)
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": "echoed"}], "isError": False}
            send({"jsonrpc": "2.0", "id": ident, "result": result})
        else:
            error = {"code": -32601, "message": f"no {method}"}
            send({"jsonrpc": "2.0", "id": ident, "error": error})


if __name__ == "__main__":
    main()
