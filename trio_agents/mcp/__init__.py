"""Tools from Model Context Protocol servers, on the official ``mcp`` SDK.

Needs the ``mcp`` extra (``pip install 'trio-agents[mcp]'``). Open a server with
``async with``, list its tools, give them to an agent::

    async with MCPServerStdio("python", ["my_server.py"]) as server:
        agent = Agent(name="a", model=model, tools=await server.list_tools())
        result = await trio_agents.run(agent, "...")

See ``docs/mcp.md``.
"""

try:
    import mcp as _mcp
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("trio_agents.mcp needs the MCP SDK: pip install 'trio-agents[mcp]'") from exc

from ._servers import MCPServerHTTP as MCPServerHTTP
from ._servers import MCPServerStdio as MCPServerStdio
from ._servers import MCPToolError as MCPToolError

del _mcp

__all__ = ["MCPServerHTTP", "MCPServerStdio", "MCPToolError"]
