"""``toolhost mcp`` over stdio: newline-delimited JSON-RPC on stdin/stdout, one MCP session.

# Strategy: a reader task feeds stdin to the sans-IO :class:`McpServerConnection`; lifecycle
# answers are written at once, ``tools/list`` and ``tools/call`` each run in their own task on the
# session's kernel connection (:class:`McpFace`), so calls overlap and a cancel can overtake the
# call it cancels. Every line goes out through one writer task (lines are never interleaved).
# stdin EOF ends the session: the kernel connection closes, which cancels what is still running.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable

import trio

import supervisor
from supervisor.client import client_on_stream
from supervisor.contracts.mcp import INVALID_REQUEST
from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.mcp_server import (
    CallTool,
    Cancelled,
    ListTools,
    McpServerConnection,
    Reply,
)
from supervisor.server.mcp_face import Connect, McpFace

log = logging.getLogger("toolhost.mcp")


async def serve_mcp_stdio(connect: Connect, *, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
    """Serve one MCP client on ``stdin_fd``/``stdout_fd`` until stdin closes.

    Raises:
        OSError: The kernel connection could not be opened (host not running).
    """
    conn = McpServerConnection(server_version=supervisor.__version__)
    stream = await connect()
    send, recv = trio.open_memory_channel[bytes](math.inf)
    stdin = trio.lowlevel.FdStream(os.dup(stdin_fd))
    stdout = trio.lowlevel.FdStream(os.dup(stdout_fd))

    async def writer() -> None:
        async with recv:
            async for data in recv:
                batch = [data]
                while True:
                    try:
                        batch.append(recv.receive_nowait())
                    except trio.WouldBlock:
                        break
                try:
                    await stdout.send_all(b"".join(batch))
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return

    def write(data: bytes) -> None:
        try:
            send.send_nowait(data)
        except trio.ClosedResourceError:
            pass

    async with (
        stdin,
        stdout,
        client_on_stream(stream, name="mcp-stdio") as kernel,
        trio.open_nursery() as outer,
    ):
        outer.start_soon(writer)  # ends once ``send`` is closed and everything is written
        async with trio.open_nursery() as nursery:
            face = McpFace(conn, kernel, nursery)
            nursery.start_soon(face.watch_catalog, write)
            await _read(stdin, conn, face, nursery, write)
            nursery.cancel_scope.cancel()  # stdin closed: the session is over
        send.close()


async def _read(
    stdin: trio.lowlevel.FdStream,
    conn: McpServerConnection,
    face: McpFace,
    nursery: trio.Nursery,
    write: Callable[[bytes], None],
) -> None:
    async def list_tools(rid: int | str) -> None:
        write(await face.list_tools(rid))

    async def call_tool(ev: CallTool) -> None:
        answer = await face.call_tool(ev, write)
        if answer is not None:
            write(answer)

    while True:
        try:
            data = await stdin.receive_some(1 << 16)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
        if not data:
            return
        try:
            events = conn.feed(data)
        except LineTooLong as exc:
            write(conn.error(None, INVALID_REQUEST, f"message too large: {exc.message}"))
            return
        for ev in events:
            if isinstance(ev, Reply):
                write(ev.data)
            elif isinstance(ev, ListTools):
                nursery.start_soon(list_tools, ev.id)
            elif isinstance(ev, CallTool):
                nursery.start_soon(call_tool, ev)
            elif isinstance(ev, Cancelled):
                face.cancel(ev)
