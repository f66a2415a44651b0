"""``tools.list`` formats: native descriptors, OpenAI, Anthropic and MCP tool shapes.

# Strategy: a pure function of the model-visible descriptors and the format asked for; names
# are made provider-safe by :func:`supervisor.policy.naming.provider_name` (the catalog feed
# maps them back when a kernel calls a tool by that name).
"""

from __future__ import annotations

from typing import Any

from supervisor.contracts.snapshot import Descriptor
from supervisor.policy.naming import provider_name


def render(descriptors: list[Descriptor], fmt: str) -> list[Any]:
    """Render model-visible descriptors in the requested format."""
    if fmt == "native":
        return list(descriptors)
    out: list[Any] = []
    for d in descriptors:
        if fmt == "openai":
            out.append(
                {
                    "type": "function",
                    "function": {
                        "name": provider_name(d.name),
                        "description": d.description,
                        "parameters": d.inputSchema,
                    },
                }
            )
        elif fmt == "anthropic":
            out.append(
                {
                    "name": provider_name(d.name),
                    "description": d.description,
                    "input_schema": d.inputSchema,
                }
            )
        else:  # mcp
            out.append(mcp_tool(d))
    return out


_DESTRUCTIVE = {None, "write", "execute", "computer"}


def mcp_tool(d: Descriptor) -> dict[str, Any]:
    """One descriptor as an MCP ``Tool``: schemas, and ``readOnlyHint``/``destructiveHint`` from
    the manifest (a tool not marked read-only is destructive when its permission is write,
    execute, computer or unknown)."""
    a = d.annotations
    tool: dict[str, Any] = {
        "name": d.name,
        "description": d.description,
        "inputSchema": d.inputSchema,
        "annotations": {
            "readOnlyHint": a.readOnly,
            "destructiveHint": (not a.readOnly) and a.permission in _DESTRUCTIVE,
        },
    }
    if a.outputSchema is not None:
        tool["outputSchema"] = a.outputSchema
    return tool
