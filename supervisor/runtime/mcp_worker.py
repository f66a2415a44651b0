"""A worker hosting one MCP stdio server (PROTOCOL 3.4).

# Strategy: the process life (spawn, stderr drained, batched writes, reaping, every in-flight
# call failed at once when the server dies) is :class:`LineWorker`'s. This class adds the MCP
# lifecycle on top of the sans-IO :class:`McpConnection`: ``initialize`` then
# ``notifications/initialized`` and every page of ``tools/list`` within ``startTimeoutMs``; the
# tools become the worker's ``ready`` message so pools and the catalog treat an MCP server like
# any sidecar. Calls are ``tools/call`` slots keyed by request id (also the progress token);
# ``ping`` is the probe; an abandoned call (deadline, ``tools.cancel``) is announced with
# ``notifications/cancelled`` and forgotten, since MCP servers need not answer it; a
# ``tools/list_changed`` notification re-lists the tools and tells the pool.
"""

from __future__ import annotations

import msgspec
import trio

import supervisor
from supervisor.contracts import wire
from supervisor.protocols import mcp as proto
from supervisor.protocols.errors import ProtocolError
from supervisor.runtime.worker import (
    Call,
    CallOutcome,
    CallSlot,
    LaunchSpec,
    LineWorker,
    WorkerHooks,
)

MAX_TOOL_PAGES = 100
"""A server that keeps answering ``nextCursor`` past this many pages is broken."""


class McpWorker(LineWorker):
    """One MCP server process, speaking JSON-RPC 2.0 lines on stdio."""

    ANSWERS_CANCEL = False

    def __init__(self, spec: LaunchSpec, hooks: WorkerHooks, index: int = 0) -> None:
        super().__init__(spec, hooks, index)
        self.conn = proto.McpConnection(
            max_line=spec.max_line, client_name="toolhost", client_version=supervisor.__version__
        )
        self.concurrency = max(1, spec.concurrency)
        self._relisting = False
        self._relist_again = False

    # lifecycle ---------------------------------------------------------------------------

    async def _handshake(self) -> None:
        timeout = self.spec.start_timeout_s
        tools: list[wire.ToolInfo] | None = None
        failure: str | None = None
        with trio.move_on_after(timeout):
            try:
                response = await self._request(*self.conn.initialize())
                if response is None:
                    return
                self._write(self.conn.initialized(response))
                tools = await self._list_tools()
            except proto.RequestFailed as exc:
                failure = str(exc)
            except ProtocolError as exc:
                self._protocol_error = exc.message
                self.kill("protocol-error", f"protocol error: {exc.message}")
                return
        if failure is not None:
            self.kill("start-failed", failure)
            return
        if tools is None:
            if self._alive:
                ms = int(timeout * 1000)
                self.kill(
                    "start-timeout",
                    f"no answer to initialize and tools/list within startTimeoutMs={ms}",
                )
            return
        server = self.conn.server
        info = server.serverInfo if server is not None else None
        self.ready_msg = wire.Ready(
            name=info.name if info else "",
            version=info.version if info else "",
            concurrency=self.concurrency,
            tools=tools,
        )
        await self._became_ready()

    async def _request(self, rid: int, line: bytes) -> proto.Response | None:
        """Send a request and wait for its response (None if the worker ended first)."""
        response: proto.Response | None = await self._wait_for(rid, line, float("inf"))
        return response

    async def _list_tools(self) -> list[wire.ToolInfo] | None:
        """Every page of ``tools/list`` (None if the worker ended meanwhile).

        Raises:
            RequestFailed: The server answered ``tools/list`` with an error.
            ProtocolError: A page is malformed or pagination does not end.
        """
        server = self.conn.server
        if server is not None and server.capabilities.tools is None:
            return []  # the server offers no tools: ready, serving nothing
        tools: list[wire.ToolInfo] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            response = await self._request(*self.conn.list_tools(cursor))
            if response is None:
                return None
            page, cursor = proto.tools_page(response)
            tools.extend(page)
            if cursor is None:
                return tools
        raise ProtocolError(f"tools/list did not end after {MAX_TOOL_PAGES} pages")

    async def _relist(self) -> None:
        """Re-read the tool list after ``tools/list_changed`` (coalescing bursts)."""
        if self._relisting:
            self._relist_again = True
            return
        self._relisting = True
        try:
            while True:
                self._relist_again = False
                try:
                    with trio.move_on_after(self.spec.start_timeout_s):
                        tools = await self._list_tools()
                except proto.RequestFailed as exc:
                    self.stderr.write(f"[toolhost] tools/list after list_changed: {exc}\n".encode())
                    tools = None
                except ProtocolError as exc:
                    self._protocol_error = exc.message
                    self.kill("protocol-error", f"protocol error: {exc.message}")
                    return
                if tools is not None and self.ready_msg is not None and self._alive:
                    self.ready_msg = msgspec.structs.replace(self.ready_msg, tools=tools)
                    self.hooks.on_tools(self)
                if not self._relist_again:
                    return
        finally:
            self._relisting = False

    # calls -------------------------------------------------------------------------------

    def start(self, call: Call) -> None:
        if not self._alive or self.conn.state != "ready":
            call.ended(
                CallOutcome(
                    ok=False,
                    code="worker-crashed",
                    error=f"MCP server {self.sidecar} is not ready ({self.conn.state})",
                    pid=self.pid,
                )
            )
            return
        rid, line = self.conn.call_tool(
            call.tool, call.input_raw, progress=call.on_progress is not None
        )
        self._begin(rid, call, line)

    def _outcome(self, result: proto.Response) -> CallOutcome:
        answer = proto.call_answer(result)
        return CallOutcome(
            ok=answer.ok,
            data=answer.data,
            content=answer.content,
            code=answer.code,
            error=answer.error,
            details=answer.details,
            pid=self.pid,
        )

    def _cancel_line(self, slot: CallSlot) -> bytes | None:
        return self.conn.cancel(slot.id, "the host stopped waiting (deadline or tools.cancel)")

    async def ping(self, timeout_s: float) -> wire.Pong | None:
        if not self._alive or self.conn.state != "ready":
            return None
        rid, line = self.conn.ping()
        response = await self._wait_for(rid, line, timeout_s)
        if response is None:
            self.conn.cancel(rid, "ping timed out")
            return None
        # An error answer still proves the server is alive and reading.
        return wire.Pong(id=str(rid), status="healthy")

    # input -------------------------------------------------------------------------------

    def _receive(self, data: bytes) -> None:
        try:
            events = self.conn.feed(data)
        except ProtocolError as exc:
            for event in exc.accepted:
                self._dispatch(event)
            raise
        for event in events:
            self._dispatch(event)

    def _dispatch(self, event: proto.Event) -> None:
        if type(event) is proto.Response:
            if event.method == "tools/call":
                self._answer(event.id, event)
            else:
                self._resolve(event.id, event)
        elif type(event) is proto.Progress:
            self._progress(event.id, event.payload)
        elif type(event) is proto.Reply:
            self._write(event.data)
        elif type(event) is proto.ToolsChanged:
            if self.state == "ready" and self._nursery is not None:
                self._nursery.start_soon(self._relist)
        elif type(event) is proto.Log:
            self.stderr.write(event.text.encode("utf-8", "replace") + b"\n")
