"""Fractalic ``command: python`` tools (PROTOCOL 3.3): ``entry: "module:function"``, hosted.

# Strategy: one long-lived SDK worker per ``autodiscover`` folder. The host passes the folder and
# its tools (name, entry, description, parameters from each manifest) in the environment variable
# ``TOOLHOST_FRACTALIC_TOOLS`` (JSON). The folder goes first on ``sys.path``; a tool's module is
# imported on its first call and kept (``importlib`` caches it: one import for the worker's
# life), and the function is called with the input object as keyword arguments. Its return value
# (JSON-able) is the answer; an exception is ``failed`` with its type and message (the SDK's
# rule). The host supervises the process like any SDK sidecar: restarts, deadlines, quotas.
# Confined (PROTOCOL 7), the worker may read the folder's files but not always list the folder:
# when it holds a host secret (the default ``tools/`` holds the registry file) its entries are
# granted one by one, and Python's path finder, which lists a folder before finding anything in
# it, would find nothing. :class:`FolderFinder` finds the folder's top-level modules by their
# file names instead (a ``stat``, no listing), ahead of the path finder.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
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


class FolderFinder(importlib.abc.MetaPathFinder):
    """Finds ``name.py`` and ``name/__init__.py`` of ``folder`` without listing it."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if path is not None or "." in fullname:
            return None
        package = os.path.join(self.folder, fullname, "__init__.py")
        if os.path.isfile(package):
            return importlib.util.spec_from_file_location(
                fullname, package, submodule_search_locations=[os.path.dirname(package)]
            )
        module = os.path.join(self.folder, fullname + ".py")
        if os.path.isfile(module):
            return importlib.util.spec_from_file_location(fullname, module)
        return None


def _install_finder(folder: str) -> None:
    """Put a :class:`FolderFinder` for ``folder`` just before the path finder."""
    if any(isinstance(f, FolderFinder) and f.folder == folder for f in sys.meta_path):
        return
    at = next(
        (i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder),
        len(sys.meta_path),
    )
    sys.meta_path.insert(at, FolderFinder(folder))


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
    if folder:
        _install_finder(os.path.abspath(folder))
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
