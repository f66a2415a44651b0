"""``toolhost mcp`` over stdio: newline-delimited JSON-RPC on stdin/stdout, one MCP session.

# Strategy: a reader task feeds stdin to the sans-IO :class:`McpServerConnection`; lifecycle
# answers are written at once, ``tools/list`` and ``tools/call`` each run in their own task on the
# session's kernel connection (:class:`McpFace`), so calls overlap and a cancel can overtake the
# call it cancels. Lines are written through (``DirectWriter``, whole lines, in order). The
# client's first request picks the era: after ``initialize`` a change of the visible tools is a
# plain ``notifications/tools/list_changed``; after ``server/discover`` it goes, tagged, to each
# open ``subscriptions/listen`` stream (acknowledged when it opens, ended by a cancel).
# stdin EOF ends the session: the kernel connection closes, which cancels what is still running.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import trio

import supervisor
from supervisor.client import client_on_stream
from supervisor.contracts.mcp import INVALID_REQUEST, RequestId
from supervisor.mcp_face.face import Connect, McpFace
from supervisor.mcp_face.profiles import Profile
from supervisor.processes.direct_write import DirectWriter, grow_pipe
from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.mcp_server import (
    CallTool,
    Cancelled,
    Forward,
    Listen,
    ListTools,
    McpServerConnection,
    Reply,
    honored,
)

log = logging.getLogger("toolhost.mcp")


async def serve_mcp_stdio(
    connect: Connect,
    *,
    stdin_fd: int = 0,
    stdout_fd: int = 1,
    tracing: Any = None,
    profile: Profile | None = None,
) -> None:
    """Serve one MCP client on ``stdin_fd``/``stdout_fd`` until stdin closes (``tracing``:
    MCP server spans, docs/telemetry.md; ``profile``: what the client sees, None for all).

    Raises:
        OSError: The kernel connection could not be opened (host not running).
    """
    conn = McpServerConnection(server_version=supervisor.__version__)
    stream = await connect()
    stdin = trio.lowlevel.FdStream(os.dup(stdin_fd))
    stdout_fd = os.dup(stdout_fd)
    os.set_blocking(stdout_fd, False)
    grow_pipe(stdout_fd)  # a large answer (a 1 MiB resource) in one write, not sixteen
    # Write-through: answers go out on the answering task; the drain task only writes what the
    # pipe could not take (the front-end reads slowly).
    out = DirectWriter(stdout_fd)

    def write(data: bytes) -> None:
        out.write(data)

    try:
        async with (
            stdin,
            client_on_stream(stream, name="mcp-stdio") as kernel,
            trio.open_nursery() as outer,
        ):
            outer.start_soon(out.run)  # ends once closed and everything is written
            async with trio.open_nursery() as nursery:
                face = McpFace(
                    conn, kernel, nursery, tracing=tracing, transport="pipe", profile=profile
                )
                listeners: set[RequestId] = set()

                def changed() -> None:
                    if conn.era != "modern":
                        write(conn.tools_changed())
                    for subscription in listeners:
                        write(conn.tools_changed(subscription))

                nursery.start_soon(face.watch_catalog, changed)
                await _read(stdin, conn, face, nursery, write, listeners)
                nursery.cancel_scope.cancel()  # stdin closed: the session is over
            out.close_when_drained()
    finally:
        os.close(stdout_fd)


async def _read(
    stdin: trio.lowlevel.FdStream,
    conn: McpServerConnection,
    face: McpFace,
    nursery: trio.Nursery,
    write: Callable[[bytes], None],
    listeners: set[RequestId],
) -> None:
    async def list_tools(rid: int | str) -> None:
        write(await face.list_tools(rid))

    async def forward(ev: Forward) -> None:
        write(await face.forward(ev))

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
            elif isinstance(ev, Forward):
                nursery.start_soon(forward, ev)
            elif isinstance(ev, Listen):
                shown = honored(ev.wanted)
                if shown.toolsListChanged:
                    listeners.add(ev.id)
                write(conn.listen_ack(ev.id, shown))
            elif isinstance(ev, Cancelled):
                listeners.discard(ev.id)  # a listen stream ends with its cancel, unanswered
                face.cancel(ev)
