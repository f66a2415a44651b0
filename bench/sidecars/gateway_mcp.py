"""An MCP stdio server written with the official ``mcp`` SDK for ``bench/mcp_gateway.py``.

``GW_NAME`` names it (default ``gw``): the tool ``<name>_echo`` returns its payload, the
resource ``blob://<name>/1mb`` is 1 MiB of text (built once at start) and
``note://<name>/readme`` a short one. The same server is driven directly by the SDK's client
and hosted behind ``toolhost mcp``, so both figures come from the same code.
"""

import os

import anyio
from mcp.server.mcpserver import MCPServer

NAME = os.environ.get("GW_NAME", "gw")
BLOB = ("0123456789abcdef" * 64)[:1023] + "\n"
BLOB *= 1024
server = MCPServer(f"bench-{NAME}", version="1.0.0")


@server.tool(name=f"{NAME}_echo", description="Return the payload unchanged.")
def echo(payload: str = "") -> dict[str, str]:
    return {"payload": payload}


@server.resource(f"blob://{NAME}/1mb", mime_type="text/plain", description="1 MiB of text")
def blob() -> str:
    return BLOB


@server.resource(f"note://{NAME}/readme", mime_type="text/plain")
def readme() -> str:
    return f"readme of {NAME}"


if __name__ == "__main__":
    anyio.run(server.run_stdio_async)
