"""A worker hosting one MCP stdio server (PROTOCOL 3.4).

# Strategy: the process life (spawn, stderr drained, batched writes, reaping, every in-flight call
# failed at once when the server dies) is :class:`LineWorker`'s. :class:`McpSession` (shared with
# the Streamable HTTP worker) adds the MCP lifecycle on top of the sans-IO :class:`McpConnection`:
# ``initialize`` then ``notifications/initialized`` and every page of ``tools/list`` within
# ``startTimeoutMs``; the tools become the worker's ``ready`` message so pools and the catalog
# treat an MCP server like any sidecar. Calls are ``tools/call`` slots keyed by request id (also
# the progress token); ``ping`` is the probe; an abandoned call (deadline, ``tools.cancel``) is
# announced with ``notifications/cancelled`` and forgotten, since MCP servers need not answer it;
# a ``tools/list_changed`` notification re-lists the tools and tells the pool.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
import trio

import supervisor
from supervisor.contracts import wire
from supervisor.protocols import mcp as proto
from supervisor.protocols.errors import ProtocolError
from supervisor.workers.base import (
    Call,
    CallOutcome,
    CallSlot,
    LaunchSpec,
    LineWorker,
    Worker,
    WorkerHooks,
)

MAX_TOOL_PAGES = 100
"""A server that keeps answering ``nextCursor`` past this many pages is broken."""


Request = Callable[[int, bytes], Awaitable["proto.Response | None"]]


async def list_tools(conn: proto.McpConnection, request: Request) -> list[wire.ToolInfo] | None:
    """Every page of ``tools/list`` through ``request`` (None if the worker ended meanwhile).

    Raises:
        RequestFailed: The server answered ``tools/list`` with an error.
        ProtocolError: A page is malformed or pagination does not end.
    """
    server = conn.server
    if server is not None and server.capabilities.tools is None:
        return []  # the server offers no tools: ready, serving nothing
    tools: list[wire.ToolInfo] = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        response = await request(*conn.list_tools(cursor))
        if response is None:
            return None
        page, cursor = proto.tools_page(response)
        tools.extend(page)
        if cursor is None:
            return tools
    raise ProtocolError(f"tools/list did not end after {MAX_TOOL_PAGES} pages")


class Relister:
    """Re-reads an MCP server's tool list after ``tools/list_changed``, coalescing bursts (one
    run at a time; a change during a run makes it read once more). Shared by the stdio and the
    Streamable HTTP workers.
    """

    def __init__(
        self,
        list_all: Callable[[], Awaitable[list[wire.ToolInfo] | None]],
        timeout_s: float,
        *,
        on_tools: Callable[[list[wire.ToolInfo]], None],
        on_broken: Callable[[str], None],
        log: Callable[[bytes], object],
    ) -> None:
        self._list_all = list_all
        self._timeout_s = timeout_s
        self._on_tools = on_tools
        self._on_broken = on_broken
        self._log = log
        self._running = False
        self._again = False

    async def run(self) -> None:
        if self._running:
            self._again = True
            return
        self._running = True
        try:
            while True:
                self._again = False
                tools: list[wire.ToolInfo] | None = None
                try:
                    with trio.move_on_after(self._timeout_s):
                        tools = await self._list_all()
                except proto.RequestFailed as exc:
                    self._log(f"[toolhost] tools/list after list_changed: {exc}\n".encode())
                except ProtocolError as exc:
                    self._on_broken(exc.message)
                    return
                if tools is not None:
                    self._on_tools(tools)
                if not self._again:
                    return
        finally:
            self._running = False


class McpSession(Worker):
    """The MCP client session both MCP workers run on one sans-IO :class:`McpConnection`:
    ``initialize`` + ``notifications/initialized`` + every page of ``tools/list`` within
    ``startTimeoutMs``, the tool list kept current after ``list_changed``, calls as
    ``tools/call``, ``ping`` as the probe. The transport (stdio lines, HTTP POSTs) is the
    subclass's: how a request is waited for, how a notification is sent.
    """

    TRANSPORT = "pipe"
    """``network.transport`` of the MCP client spans."""
    conn: proto.McpConnection
    session: str | None = None
    """The transport's session id (Streamable HTTP), for the MCP client spans."""

    if TYPE_CHECKING:

        async def _wait_for(self, key: Any, line: bytes, timeout_s: float) -> Any: ...

    def _open_session(self, spec: LaunchSpec, channel: str) -> None:
        self.conn = proto.McpConnection(
            max_line=spec.max_line,
            client_name="toolhost",
            client_version=supervisor.__version__,
            channel=channel,
        )
        self.concurrency = max(1, spec.concurrency)
        self._relist = Relister(
            self._list_tools,
            spec.start_timeout_s,
            on_tools=self._tools_changed,
            on_broken=self._broke,
            log=self.stderr.write,
        )

    @abstractmethod
    async def _notify(self, line: bytes) -> None:
        """Send a notification (no answer expected)."""

    def _where(self) -> str:
        """What start failures are prefixed with (the server's URL for a remote one)."""
        return ""

    def _forget(self, rid: int) -> None:
        """Request ``rid`` will not be waited for any more (a ping that timed out)."""

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
                await self._notify(self.conn.initialized(response))
                tools = await self._list_tools()
            except proto.RequestFailed as exc:
                failure = str(exc)
            except ProtocolError as exc:
                self._broke(exc.message)
                return
        if failure is not None:
            self.kill("start-failed", f"{self._where()}{failure}")
            return
        if tools is None:
            if self._alive:
                ms = int(timeout * 1000)
                self.kill(
                    "start-timeout",
                    f"{self._where()}no answer to initialize and tools/list within "
                    f"startTimeoutMs={ms}",
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
        return await list_tools(self.conn, self._request)

    def _tools_changed(self, tools: list[wire.ToolInfo]) -> None:
        if self.ready_msg is not None and self._alive:
            self.ready_msg = msgspec.structs.replace(self.ready_msg, tools=tools)
            self.hooks.on_tools(self)

    def _broke(self, message: str) -> None:
        self.kill("protocol-error", f"protocol error: {message}")

    # calls -------------------------------------------------------------------------------

    def _call_line(self, call: Call) -> tuple[int, bytes] | None:
        """The ``tools/call`` request of ``call``; None (and the call failed) when the session
        is not ready."""
        if not self._alive or self.conn.state != "ready":
            call.ended(
                CallOutcome(
                    ok=False,
                    code="worker-crashed",
                    error=f"MCP server {self.sidecar} is not ready ({self.conn.state})",
                    pid=self.pid,
                )
            )
            return None
        traceparent = None
        if call.trace is not None:  # an MCP CLIENT span; its traceparent goes in _meta
            traceparent = call.trace.mcp_client(call, self.TRANSPORT, self.session)
        return self.conn.call_tool(
            call.tool,
            call.input_raw,
            progress=call.on_progress is not None,
            traceparent=traceparent,
        )

    def _outcome(self, result: proto.Response) -> CallOutcome:
        outcome = proto.call_answer(result)
        outcome.pid = self.pid
        return outcome

    async def ping(self, timeout_s: float) -> wire.Pong | None:
        if not self._alive or self.conn.state != "ready":
            return None
        rid, line = self.conn.ping()
        response = await self._wait_for(rid, line, timeout_s)
        if response is None:
            self.conn.cancel(rid, "ping timed out")
            self._forget(rid)
            return None
        # An error answer still proves the server is alive and reading.
        return wire.Pong(id=str(rid), status="healthy")


class McpWorker(McpSession, LineWorker):
    """One MCP server process, speaking JSON-RPC 2.0 lines on stdio."""

    ANSWERS_CANCEL = False

    def __init__(self, spec: LaunchSpec, hooks: WorkerHooks, index: int = 0) -> None:
        super().__init__(spec, hooks, index)
        self._open_session(spec, "on stdout")

    async def _notify(self, line: bytes) -> None:
        self._write(line)

    def start(self, call: Call) -> None:
        got = self._call_line(call)
        if got is not None:
            rid, line = got
            self._begin(rid, call, line)

    def _cancel_line(self, slot: CallSlot) -> bytes | None:
        return self.conn.cancel(slot.id, "the host stopped waiting (deadline or tools.cancel)")

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
                self._nursery.start_soon(self._relist.run)
        elif type(event) is proto.Log:
            self.stderr.write(event.text.encode("utf-8", "replace") + b"\n")
