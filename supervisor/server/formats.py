"""``tools.list`` formats: native descriptors, OpenAI, Anthropic and MCP tool shapes.

Names are made provider-safe by :func:`supervisor.policy.naming.provider_name`.
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
            out.append({"name": d.name, "description": d.description, "inputSchema": d.inputSchema})
    return out
