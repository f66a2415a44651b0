"""The MCP face: a client of the kernel protocol serving MCP over stdio and Streamable HTTP."""
