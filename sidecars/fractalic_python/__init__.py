"""Fractalic ``command: python`` tools (PROTOCOL 3.3): ``entry: "module:function"``, hosted.

# Strategy: one long-lived SDK worker per ``autodiscover`` folder. The host passes the folder and
# its tools (name, entry, description, parameters from each manifest) in the environment variable
# ``TOOLHOST_FRACTALIC_TOOLS`` (JSON). The folder goes first on ``sys.path``; a tool's module is
# imported on its first call and kept (``importlib`` caches it: one import for the worker's
# life), and the function is called with the input object as keyword arguments. Its return value
# (JSON-able) is the answer; an exception is ``failed`` with its type and message (the SDK's
# rule). The host supervises the process like any SDK sidecar: restarts, deadlines, quotas.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from sidecars.sdk import Context, Sidecar, ToolError
from sidecars.sdk.app import ToolSpec

ENV = "TOOLHOST_FRACTALIC_TOOLS"


class ManifestTool(ToolSpec, kw_only=True):
    """A tool whose input schema is the manifest's ``parameters`` (input decoded as an object)."""

    schema: dict[str, Any]

    def input_schema(self) -> dict[str, Any]:
        return self.schema


def _caller(name: str, entry: str) -> Callable[[dict[str, Any], Context], Any]:
    module_name, func_name = entry.split(":", 1)
    resolved: list[Callable[..., Any]] = []

    def call(args: dict[str, Any], ctx: Context) -> Any:
        if not resolved:
            module = importlib.import_module(module_name)
            func = getattr(module, func_name, None)
            if not callable(func):
                raise ToolError(
                    f"{name}: {module_name} has no function {func_name}", code="unavailable"
                )
            resolved.append(func)
        return resolved[0](**args)

    return call


def build(table: dict[str, Any]) -> Sidecar:
    """The sidecar for one folder's ``python`` tools."""
    folder = table.get("folder", "")
    if folder and folder not in sys.path:
        sys.path.insert(0, folder)
    app = Sidecar("fractalic-python", version="1", concurrency=4)
    for tool in table.get("tools", []):
        name = tool["name"]
        schema = tool.get("parameters") or {"type": "object", "additionalProperties": True}
        app.tools[name] = ManifestTool(
            name=name,
            func=_caller(name, tool["entry"]),
            input_type=dict[str, Any],
            description=tool.get("description") or f"python tool {tool['entry']}",
            schema=schema,
        )
    return app


def main() -> None:
    build(json.loads(os.environ.get(ENV, "{}"))).run()
