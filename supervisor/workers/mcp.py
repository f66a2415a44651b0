"""A worker hosting one MCP stdio server (PROTOCOL 3.4): a :class:`LineWorker` carrying an
:class:`~supervisor.workers.mcp_client.McpClient`.

# Strategy: the process life (spawn, stderr drained, batched writes, reaping, every in-flight call
# failed at once when the server dies) is :class:`LineWorker`'s; the MCP session (handshake, tool
# list, calls, probe) is the :class:`McpClient` it owns. This module only carries messages: every
# JSON-RPC message is one line on stdin, everything on stdout goes to the session. An abandoned
# call (deadline, ``tools.cancel``) is announced with ``notifications/cancelled`` and forgotten at
# once, since MCP servers need not answer it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from supervisor.calls.call import Call
from supervisor.contracts import wire
from supervisor.workers.base import LaunchSpec, WorkerHooks
from supervisor.workers.line import LineWorker
from supervisor.workers.mcp_client import McpClient
from supervisor.workers.slots import CallSlot


class McpWorker(LineWorker):
    """One MCP server process, speaking JSON-RPC 2.0 lines on stdio."""

    ANSWERS_CANCEL = False
    TRANSPORT = "pipe"
    session: str | None = None

    def __init__(self, spec: LaunchSpec, hooks: WorkerHooks, index: int = 0) -> None:
        super().__init__(spec, hooks, index)
        self.concurrency = max(1, spec.concurrency)
        self.mcp = McpClient(self, spec, "on stdout")
        self.conn = self.mcp.conn

    async def _handshake(self) -> None:
        ready = await self.mcp.handshake()
        if ready is not None:
            self.ready_msg = ready
            await self._became_ready()

    def start(self, call: Call) -> None:
        got = self.mcp.call_line(call)
        if got is not None:
            rid, line = got
            self.calls.add(rid, call)
            self._write(line)

    async def ping(self, timeout_s: float) -> wire.Pong | None:
        return await self.mcp.ping(timeout_s)

    def _cancel_line(self, slot: CallSlot) -> bytes | None:
        return self.mcp.cancel_line(slot.id)

    def _receive(self, data: bytes) -> None:
        self.mcp.receive(data)

    # the session's carrier ---------------------------------------------------------------

    def send(self, line: bytes, rid: int | None) -> None:
        self._write(line)

    async def notify(self, line: bytes) -> None:
        self._write(line)

    def forget(self, rid: int) -> None:
        """Nothing to close: the answer, if it comes, is dropped by the connection."""

    def where(self) -> str:
        return ""

    def start_soon(self, fn: Callable[[], Awaitable[object]]) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(fn)
