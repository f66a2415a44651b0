"""``--mcp``: an SDK sidecar as an MCP stdio server (same tools, same schemas).

# Strategy: with ``--mcp`` on the command line, :meth:`Sidecar.run` hands the process to
# :func:`serve`: one Trio loop reads stdin into the sans-IO MCP server connection the host
# itself uses for ``toolhost mcp`` (``supervisor.protocols.mcp_server``; it is this driver's
# session, framing included), lists the registered tools with their schemas and hints, and runs
# each ``tools/call`` through the same :func:`~sidecars.sdk.execution.execute_async` as the Trio
# driver: ``async def`` tools on the loop, sync tools in worker threads bounded by the sidecar's
# concurrency. ``ctx.progress`` becomes ``notifications/progress`` when the caller sent a
# progress token; ``notifications/cancelled`` is a real ``trio.Cancelled`` for async tools and
# sets ``ctx.cancelled`` for sync ones, and the cancelled request gets no answer, as MCP asks.
# There is no host here: ``ctx.config`` is ``$TOOLHOST_CONFIG`` (a JSON object) when set, the
# anchors are the working directory, and host services answer ``unsupported``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from sidecars.sdk.context import Context, SidecarView
from sidecars.sdk.execution import execute_async
from sidecars.sdk.stdio import READ_CHUNK, fatal
from sidecars.sdk.tools import ToolSpec
from supervisor.contracts import wire
from supervisor.contracts.envelope import Envelope, ErrorInfo
from supervisor.contracts.mcp import INVALID_REQUEST, RequestId
from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.mcp_results import call_result, progress_fields
from supervisor.protocols.mcp_server import (
    CallTool,
    Cancelled,
    Line,
    ListTools,
    McpServerConnection,
    Reply,
)


def mcp_tool(spec: ToolSpec) -> dict[str, Any]:
    """One registered tool as an MCP ``Tool`` (the hints follow ``toolhost mcp``'s rule)."""
    tool: dict[str, Any] = {
        "name": spec.name,
        "description": spec.description,
        "inputSchema": spec.input_schema(),
        "annotations": spec.hints(),
    }
    output = spec.output_schema()
    if output is not None:
        tool["outputSchema"] = output
    return tool


def result_envelope(result: wire.Result, tool: str) -> Envelope:
    """A sidecar result as the envelope :func:`call_result` maps to MCP (``data`` kept as the
    JSON the tool gave)."""
    if result.ok:
        content = result.content
        if content is None:
            data = msgspec.json.decode(result.data)
            content = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
        return Envelope(status="success", tool=tool, content=content, data=result.data)
    error = ErrorInfo(
        code=result.code or "failed", message=result.error or "", details=result.details or None
    )
    return Envelope(
        status="failed", tool=tool, content=result.error or "failed", data=result.data, error=error
    )


class _ProgressContext(Context):
    """A call's Context whose ``progress`` is the caller's ``notifications/progress``."""

    def __init__(
        self, app: SidecarView, cancelled: threading.Event, notify: Callable[[Any, int], None]
    ) -> None:
        super().__init__(app, None, 0, cancelled)
        self._notify = notify
        self._seq = 0
        self._lock = threading.Lock()

    def progress(self, data: Any) -> None:  # called from the loop or a worker thread
        if self.cancelled.is_set():
            return
        with self._lock:
            self._seq += 1
            seq = self._seq
        self._notify(data, seq)


class _Server:
    def __init__(self, app: SidecarView, write: Callable[[Line], None]) -> None:
        self.app = app
        self.write = write
        self.conn = McpServerConnection(server_name=app.name, server_version=app.version)
        self.limiter = trio.CapacityLimiter(app.concurrency)
        self.calls: dict[RequestId, tuple[trio.CancelScope, threading.Event]] = {}

    def context(self, ev: CallTool, flag: threading.Event, nursery: trio.Nursery) -> Context:
        token = ev.progress_token
        ctx: Context
        if token is None:
            ctx = Context(self.app, None, 0, flag)
        else:

            def notify(data: Any, seq: int) -> None:
                value, total, message = progress_fields(data, seq)
                self.write(self.conn.progress(token, value, total, message))

            ctx = _ProgressContext(self.app, flag, notify)
        ctx.nursery = nursery
        return ctx

    async def call(self, ev: CallTool, nursery: trio.Nursery) -> None:
        if ev.id in self.calls:
            self.write(self.conn.error(ev.id, INVALID_REQUEST, f"request {ev.id!r} in flight"))
            return
        flag = threading.Event()
        scope = trio.CancelScope()
        self.calls[ev.id] = (scope, flag)
        result: wire.Result | None = None
        try:
            with scope:
                ctx = self.context(ev, flag, nursery)
                spec = self.app.tools.get(ev.name)
                if spec is not None and not spec.is_async:
                    async with self.limiter:
                        result = await execute_async(self.app, ev.name, ev.arguments, ctx)
                else:
                    result = await execute_async(self.app, ev.name, ev.arguments, ctx)
        finally:
            self.calls.pop(ev.id, None)
        if result is None or flag.is_set():
            return  # cancelled: MCP wants no answer
        self.write(self.conn.result(ev.id, call_result(result_envelope(result, ev.name))))

    def cancel(self, ev: Cancelled) -> None:
        entry = self.calls.get(ev.id)
        if entry is not None:
            scope, flag = entry
            flag.set()
            scope.cancel()

    async def serve(self) -> None:
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        tools = [mcp_tool(spec) for spec in self.app.tools.values()]
        async with stdin, trio.open_nursery() as nursery:
            while True:
                data = await stdin.receive_some(READ_CHUNK)
                if not data:
                    break
                try:
                    events = self.conn.feed(data)
                except LineTooLong as exc:
                    self.write(self.conn.error(None, INVALID_REQUEST, exc.message))
                    break
                for ev in events:
                    if isinstance(ev, Reply):
                        self.write(ev.data)
                    elif isinstance(ev, ListTools):
                        self.write(self.conn.result(ev.id, {"tools": tools}))
                    elif isinstance(ev, CallTool):
                        nursery.start_soon(self.call, ev, nursery)
                    elif isinstance(ev, Cancelled):
                        self.cancel(ev)
            for scope, flag in list(self.calls.values()):
                flag.set()
                scope.cancel()
            nursery.cancel_scope.cancel()


def serve(app: SidecarView, write: Callable[[Line], None]) -> None:
    """Serve ``app``'s tools as an MCP stdio server until stdin closes (stdout is claimed)."""
    raw = os.environ.get("TOOLHOST_CONFIG")
    if raw:
        try:
            config = json.loads(raw)
        except json.JSONDecodeError as exc:
            fatal(app.name, f"TOOLHOST_CONFIG is not JSON: {exc}")
        if not isinstance(config, dict):
            fatal(app.name, "TOOLHOST_CONFIG must be a JSON object")
        app.config = config
    trio.run(_Server(app, write).serve)
