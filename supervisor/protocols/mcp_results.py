"""Kernel terms as MCP terms: a result envelope as a ``CallToolResult``, progress as MCP progress.

# Strategy: pure functions, shared by toolhost's MCP face (``supervisor/mcp_face``) and the SDK's
# MCP stdio driver (``sidecars/sdk/drivers/mcp_stdio.py``), apart from the sans-IO connection
# (``mcp_server.py``) that frames what they return. An envelope's ``data`` is the JSON the tool
# gave (``msgspec.Raw``): copied into the answer as it is, never decoded and encoded again.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from supervisor.contracts.envelope import Envelope, Meta


def progress_fields(data: Any, seq: int) -> tuple[float, float | None, str | None]:
    """MCP ``(progress, total, message)`` for the ``seq``-th ``tool.progress`` event of a call.

    A payload that already has a numeric ``progress`` (an MCP sidecar's) keeps its numbers;
    anything else counts events (``progress`` = ``seq``) and travels as JSON text in ``message``.
    """
    if isinstance(data, dict):
        value = data.get("progress")
        if isinstance(value, int | float) and not isinstance(value, bool):
            total = data.get("total")
            message = data.get("message")
            return (
                float(value),
                float(total) if isinstance(total, int | float) else None,
                message if isinstance(message, str) else None,
            )
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return float(seq), None, text


def call_result(envelope: Envelope) -> dict[str, Any]:
    """A kernel result envelope (PROTOCOL 5) as an MCP ``CallToolResult``.

    Success: a text block with ``content`` and ``structuredContent`` = ``data`` when it is an
    object (``{"result": data}`` otherwise, as MCP wants an object). Failure or unavailable:
    ``isError: true``, the text ``[code] message`` and ``structuredContent`` ``{status, error}``
    so the caller keeps our code. ``_meta.toolhost`` carries the envelope's ``meta``. ``data``
    stays the JSON the tool gave (``msgspec.Raw``): copied into the answer, never decoded.
    """
    status = envelope.status
    content = envelope.content
    data = _data_of(envelope.data)
    out: dict[str, Any] = {}
    if status == "success":
        out["content"] = [{"type": "text", "text": content}]
        if data is not None:
            out["structuredContent"] = data if _is_object(data) else {"result": data}
        out["isError"] = False
    else:
        error = envelope.error
        code = (error.code if error is not None else "") or status or "failed"
        message = (error.message if error is not None else "") or content
        out["content"] = [{"type": "text", "text": f"[{code}] {message}"}]
        structured: dict[str, Any] = {"status": status, "error": error or {}}
        if data is not None:
            structured["data"] = data
        out["structuredContent"] = structured
        out["isError"] = True
    out["_meta"] = {"toolhost": {"status": status, **_meta_fields(envelope.meta)}}
    return out


def _data_of(raw: msgspec.Raw) -> msgspec.Raw | None:
    """An envelope's ``data``; None when it is JSON ``null`` (or empty)."""
    return None if _first(raw) in (b"", b"n") else raw


def _is_object(raw: msgspec.Raw) -> bool:
    return _first(raw) == b"{"


def _first(raw: msgspec.Raw) -> bytes:
    """The first character of a JSON value (b"" when there is none), without copying it."""
    view = memoryview(raw)
    i, n = 0, len(view)
    while i < n and view[i] in b" \t\r\n":
        i += 1
    return bytes(view[i : i + 1])


def _meta_fields(meta: Meta) -> dict[str, Any]:
    fields = msgspec.to_builtins(meta)  # its defaults left out, as on the wire
    assert isinstance(fields, dict)
    return fields
