"""What a tool is: its registered spec, the error it raises, the reply it may return.

# Strategy: nothing here runs a tool or talks to the host; these are the plain shapes every other
# SDK module (the session, the context, the drivers, ``app``) shares, so they sit at the bottom
# and import nothing of the SDK. A tool's outcome becomes a wire ``Result`` in
# ``sidecars.sdk.execution``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from supervisor.contracts import wire
from supervisor.contracts.envelope import FAILED_CODES, UNAVAILABLE_CODES

_DESTRUCTIVE = {None, "write", "execute", "computer"}
"""Permissions whose tools are destructive unless read-only (the MCP face's rule too)."""
CODES = wire.RESULT_CODES | UNAVAILABLE_CODES | FAILED_CODES
"""Codes a :class:`ToolError` keeps: the worker protocol's five and the envelope's (PROTOCOL 5),
so a composite tool can answer with the code of the child call that blocked it."""

HealthMap = dict[str, wire.ToolHealth]
"""A health check's answer: tool -> its health (tools absent: healthy)."""


class ToolError(Exception):
    """Raise from a tool to answer ``ok: false`` with a code.

    Args:
        message: Human text; becomes the envelope's ``content``.
        code: One of ``failed | unavailable | unsupported | invalid-input``, or an envelope
            code of PROTOCOL 5 (``approval-required``, ``quota-limited``, ``timeout``...);
            anything else becomes ``failed``. :meth:`passthrough` keeps any code.
        details: Structured facts for audit (paths, exit codes, provider status).
        data: Partial data that should survive the failure.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "failed",
        details: dict[str, Any] | None = None,
        data: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code in CODES else "failed"
        self.details = details
        self.data = data

    @classmethod
    def passthrough(
        cls,
        message: str,
        code: str | None,
        *,
        details: dict[str, Any] | None = None,
        data: Any = None,
    ) -> ToolError:
        """A composite tool's answer carrying a child call's ``error.code`` as it came (a
        sidecar's own code such as ``destination-refused`` included); the host derives the
        envelope's status from the code as it did for the child."""
        error = cls(message, details=details, data=data)
        error.code = code or "failed"
        return error


class Reply(msgspec.Struct, kw_only=True):
    """Return this to give the model a text besides the structured ``data``."""

    data: Any = None
    content: str | None = None


class ToolSpec(msgspec.Struct, kw_only=True):
    """A registered tool: its function, input type and manifest facts."""

    name: str
    func: Callable[..., Any]
    input_type: Any
    description: str
    read_only: bool = False
    concurrency_safe: bool = False
    permission: str | None = None
    sandbox: str | None = None
    timeout_ms: int | None = None
    output_type: Any = None
    is_async: bool = False
    requires: list[str] | None = None

    def input_schema(self) -> dict[str, Any]:
        return struct_schema(self.input_type)

    def hints(self) -> dict[str, bool]:
        """MCP-style hints: read-only, and destructive when not read-only and the permission
        is write, execute, computer or unknown (``toolhost mcp``'s rule)."""
        return {
            "readOnlyHint": self.read_only,
            "destructiveHint": (not self.read_only) and self.permission in _DESTRUCTIVE,
        }

    def output_schema(self) -> dict[str, Any] | None:
        if self.output_type is None:
            return None
        return struct_schema(self.output_type)


def struct_schema(tp: Any) -> dict[str, Any]:
    """A self-contained JSON Schema for ``tp`` with the top-level ``$ref`` inlined."""
    schema = msgspec.json.schema(tp)
    ref = schema.get("$ref")
    defs = dict(schema.get("$defs", {}))
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.removeprefix("#/$defs/")
        root = dict(defs.pop(name))
        if defs:
            root["$defs"] = defs
        return root
    return schema
