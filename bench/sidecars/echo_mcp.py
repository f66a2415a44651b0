"""The bench's echo tool as an MCP stdio server, written with the official ``mcp`` SDK.

It is hosted by toolhost (``protocol: mcp``) and driven directly by the SDK's own client
(``bench.mcp_direct``), so both numbers come from the same server.
"""

import anyio
from mcp.server.mcpserver import MCPServer

server = MCPServer("bench-echo-mcp", version="1.0.0")


@server.tool(name="bench_echo_mcp", description="Return the payload unchanged.")
def echo(payload: str = "") -> dict[str, str]:
    return {"payload": payload}


if __name__ == "__main__":
    anyio.run(server.run_stdio_async)
