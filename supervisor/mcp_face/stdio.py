"""``toolhost mcp`` over stdio: newline-delimited JSON-RPC on stdin/stdout, one MCP session.

# Strategy: a reader task feeds stdin to the sans-IO :class:`McpServerConnection`; lifecycle
# answers are written at once, a ``tools/call`` goes to the host from the reader and is answered
# from the kernel connection's reader (no task per call: two scheduler passes, not four; one
# asking for progress, or with MCP server spans on, gets a task), the other requests each run in
# their own task on the session's kernel connection (:class:`McpFace`), so calls overlap and a
# cancel can overtake the call it cancels. Lines are written through (``DirectWriter``, whole lines,
# in order). The client's first request picks the era: after ``initialize`` a change of the visible
# tools (or of the hosted resources or prompts) is a plain ``notifications/*/list_changed`` and an
# update of a resource subscribed with ``resources/subscribe`` a
# ``notifications/resources/updated``; after ``server/discover`` each goes, tagged, to the open
# ``subscriptions/listen`` streams that asked for it (acknowledged when it opens, its resources
# subscribed first; ended by a cancel).
# stdin EOF ends the session once every request read is answered (a half-close, as on the kernel
# socket; a client whose stdout is closed too is gone: the kernel connection then closes, which
# cancels what still runs).
# Past ``MAX_ASKED`` requests not answered yet, or ``PAUSE_BYTES`` of answers the client has not
# read, stdin is not read until they are out,
# and the face's own notifications are coalesced by key until the client reads (``notices.py``).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import msgspec
import trio

import supervisor
from supervisor.client import client_on_stream
from supervisor.contracts.mcp import INVALID_REQUEST, RequestId, SubscriptionFilter
from supervisor.mcp_face.face import Connect, McpFace
from supervisor.mcp_face.notices import PAUSE_BYTES, Notices
from supervisor.mcp_face.profiles import Profile
from supervisor.processes.direct_write import (
    DirectWriter,
    grow_pipe,
    read_ready,
    wait_hung_up,
)
from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.mcp_server import (
    CallTool,
    Cancelled,
    Forward,
    Line,
    Listen,
    ListTools,
    McpServerConnection,
    Reply,
    honored,
    wants,
)

log = logging.getLogger("toolhost.mcp")


MAX_ASKED = 64
"""Requests of one stdio client read and not answered yet: past this, stdin is not read until
one is answered (a client that pipelines thousands waits in its pipe; twice the host's default
``maxCallsPerClient``, so the host always has the next ones)."""


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

    def write(data: Line) -> None:
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
                listeners: dict[RequestId, SubscriptionFilter] = {}
                notices = Notices(out, nursery)
                notify = notices.send

                def changed(kind: str) -> None:
                    if conn.era != "modern":
                        notify(("changed", kind), conn.list_changed(kind))
                    for subscription, shown in list(listeners.items()):
                        if wants(shown, kind):
                            key = ("changed", kind, subscription)
                            notify(key, conn.list_changed(kind, subscription))

                def updated(uri: str) -> None:
                    if conn.era != "modern":
                        notify(("updated", uri), conn.resource_updated(uri))
                    for subscription, shown in list(listeners.items()):
                        if uri in (shown.resourceSubscriptions or ()):
                            key = ("updated", uri, subscription)
                            notify(key, conn.resource_updated(uri, subscription))

                nursery.start_soon(partial(face.watch_catalog, changed, on_updated=updated))
                asked = InFlight()
                await _read(stdin, conn, face, nursery, write, listeners, out, notices, asked)
                # stdin closed: every request read is still answered (a half-close, as on the
                # kernel socket), unless the client is gone too (stdout's reader closed).
                await _answered(asked, stdout_fd)
                nursery.cancel_scope.cancel()  # the session is over
            out.close_when_drained()
    finally:
        os.close(stdout_fd)


class InFlight:
    """Requests read from the client and not answered yet (counted from the moment they are
    read: a stdin EOF right after still finds them); at ``limit`` stdin is not read until one
    is answered."""

    def __init__(self, limit: int = MAX_ASKED) -> None:
        self.limit = limit
        self.count = 0
        self._idle = trio.Event()
        self._idle.set()
        self._room = trio.Event()
        self._room.set()

    @property
    def full(self) -> bool:
        return self.count >= self.limit

    def enter(self) -> None:
        self.count += 1
        if self._idle.is_set():
            self._idle = trio.Event()
        if self.count >= self.limit and self._room.is_set():
            self._room = trio.Event()

    def leave(self) -> None:
        self.count -= 1
        if self.count < self.limit:
            self._room.set()
        if not self.count:
            self._idle.set()

    async def wait_room(self) -> None:
        await self._room.wait()

    def handed(self, fn: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        """``fn`` as a task that leaves when it ends (answered, failed or cancelled)."""

        async def run(ev: Any) -> None:
            try:
                await fn(ev)
            finally:
                self.leave()

        return run

    async def wait(self) -> None:
        await self._idle.wait()


async def _answered(asked: InFlight, stdout_fd: int) -> None:
    """Return once every request read has its answer written or dropped (the kernel answers
    each within its deadline), or at once when the client closed stdout too: it is gone, and
    closing the kernel connection then cancels what still runs."""
    if not asked.count:
        return
    async with trio.open_nursery() as nursery:

        async def gone() -> None:
            await wait_hung_up(stdout_fd)
            nursery.cancel_scope.cancel()

        nursery.start_soon(gone)
        await asked.wait()
        nursery.cancel_scope.cancel()


async def _read(
    stdin: trio.lowlevel.FdStream,
    conn: McpServerConnection,
    face: McpFace,
    nursery: trio.Nursery,
    write: Callable[[Line], None],
    listeners: dict[RequestId, SubscriptionFilter],
    out: DirectWriter,
    notices: Notices,
    asked: InFlight,
) -> None:
    async def list_tools(ev: ListTools) -> None:
        write(await face.list_tools(ev.id, ev.cursor))

    async def forward(ev: Forward) -> None:
        answer = await face.forward(ev)
        if answer is not None:  # None: the client cancelled it
            write(answer)

    async def listen(ev: Listen) -> None:
        shown = honored(ev.wanted)
        if shown.resourceSubscriptions:
            uris = await face.subscribe(shown.resourceSubscriptions)
            shown = msgspec.structs.replace(shown, resourceSubscriptions=uris or None)
        listeners[ev.id] = shown
        write(conn.listen_ack(ev.id, shown))

    async def unlisten(shown: SubscriptionFilter) -> None:
        kept = {u for other in listeners.values() for u in other.resourceSubscriptions or ()}
        await face.unsubscribe([u for u in shown.resourceSubscriptions or () if u not in kept])

    async def call_tool(ev: CallTool) -> None:
        key = ("progress", ev.id)  # the client's request id: unique among its calls in flight
        answer = await face.call_tool(ev, partial(notices.send, key))
        notices.drop(key)  # no progress after the answer
        if answer is not None:
            write(answer)

    fd = stdin.fileno()
    # A pipe or socket: wait, then read (a request comes after the last answer went out, so
    # reading first would fail once per request). A file cannot be waited for: read on.
    waits = not stat.S_ISREG(os.fstat(fd).st_mode)
    while True:
        if asked.full:  # its requests wait in the pipe, not in the host's memory
            await asked.wait_room()
        if out.pending_bytes > PAUSE_BYTES:  # the client is not reading: neither do we
            while out.pending_bytes and not out.broken:
                await out.drain(timeout_s=60.0)
        try:
            data = await (read_ready(fd, 1 << 16) if waits else stdin.receive_some(1 << 16))
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
                asked.enter()  # counted from here: EOF may come before the task runs
                nursery.start_soon(asked.handed(list_tools), ev)
            elif isinstance(ev, CallTool):
                asked.enter()
                if not face.call_now(ev, write, asked.leave):  # progress or spans: a task
                    nursery.start_soon(asked.handed(call_tool), ev)
            elif isinstance(ev, Forward):
                asked.enter()
                if not face.forward_now(ev, write, asked.leave):  # a list: a task
                    nursery.start_soon(asked.handed(forward), ev)
            elif isinstance(ev, Listen):
                nursery.start_soon(listen, ev)
            elif isinstance(ev, Cancelled):
                gone = listeners.pop(ev.id, None)  # a listen stream ends with its cancel
                if gone is not None and gone.resourceSubscriptions:
                    nursery.start_soon(unlisten, gone)
                face.cancel(ev)
