"""A single Flyflor request (PROTOCOL 3.2): one tool call, one answer line, an exit status.

# Strategy: when the first line on stdin names a ``tool`` instead of being an ``init`` message,
# ``Sidecar.run`` hands it to :func:`answer`: the request's config and anchors replace the
# sidecar's, the tool runs through :func:`~sidecars.sdk.execution.execute` (an async tool in a
# fresh ``trio.run``) in a span under ``$TRACEPARENT``, and the result is written as Flyflor's
# flat object: ``{"ok": true, ...data}`` or ``{"ok": false, "code", "error", ...details}``, exit
# status 1 on failure. There is no host to ask: progress is dropped and host services answer
# ``unsupported``.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import msgspec

from sidecars.sdk import tracing
from sidecars.sdk.context import Context, SidecarView
from sidecars.sdk.execution import execute
from sidecars.sdk.private import set_host_private
from supervisor.contracts import wire

_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.decode


def answer(app: SidecarView, request: dict[str, Any], write: Callable[[bytes], None]) -> None:
    """Answer ``request`` with one line through ``write``; exit status 1 when it failed."""
    app.config = request.get("config") or {}
    app.project_dir = request.get("projectDir") or app.project_dir
    private = request.get("hostPrivate")
    set_host_private(private if isinstance(private, list) else [])
    app.config_dir = request.get("configDir") or app.config_dir
    app.cwd = request.get("cwd") or app.cwd
    raw_input = _json_encode(request.get("input", {}))
    tool = str(request["tool"])
    ctx = Context(app, None, 0, threading.Event())
    result = tracing.run(
        app.name,
        tool,
        None,
        os.environ.get("TRACEPARENT"),
        os.environ.get("TRACESTATE"),
        ctx,
        lambda: execute(app, tool, raw_input, ctx),
    )
    flat: dict[str, Any]
    if result.ok:
        data = _json_decode(result.data)
        flat = {**data, "ok": True} if isinstance(data, dict) else {"ok": True, "data": data}
        if result.content is not None:
            flat.setdefault("content", result.content)
    else:
        flat = {
            **(result.details or {}),
            "ok": False,
            "code": result.code,
            "error": result.error,
        }
        if result.data != wire.NULL:
            flat["data"] = _json_decode(result.data)
    write(_json_encode(flat) + b"\n")
    if not result.ok:
        sys.exit(1)
