"""The stateless 2026-07-28 era of ``toolhost mcp --http``: every POST answered on its own.

# Strategy: a request that names a stateless revision (``MCP-Protocol-Version``, or a
# ``server/discover``/enveloped body without a session) gets a fresh
# :class:`McpServerConnection` in the stateless era, is checked on its own (the envelope, the
# routing headers against the body, the revision) and answered on the same POST: JSON, or an
# SSE stream when it asked for progress or is a ``subscriptions/listen``. Nothing is kept
# between requests but kernel connections, shared by all requests of one client name
# (:class:`KernelConnections`; the host's audit names them ``mcp-http:<clientInfo.name>``), so
# any replica behind a load balancer can answer any request. The client cancels a request by
# closing its connection: the call is then cancelled in the host. A listen stream has a kernel
# connection of its own (its ``catalog.changed`` subscription, and the ``resources.subscribe``
# of each URI it names in ``resourceSubscriptions``, which end with it), sends the
# acknowledgement, then tagged ``notifications/{tools,resources,prompts}/list_changed`` (the
# kinds it asked for; tools when the list the client's profile shows changes) and
# ``notifications/resources/updated``, with a keepalive comment every :data:`PING_S` seconds,
# until the client leaves or the host does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import msgspec
import trio

import supervisor
from supervisor.client import Client, client_on_stream
from supervisor.contracts import mcp
from supervisor.mcp_face.auth import Identity
from supervisor.mcp_face.exchange import Exchange, Headers
from supervisor.mcp_face.face import Connect, McpFace
from supervisor.mcp_face.notices import NoticeQueue
from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.mcp_server import (
    HTTP_STATUS,
    CallTool,
    Cancelled,
    Forward,
    Line,
    Listen,
    ListTools,
    McpServerConnection,
    Reply,
    duplicated_routing_header,
    honored,
    wants,
)

log = logging.getLogger("toolhost.mcp")

PING_S = 15.0
"""Seconds between keepalive comments on a quiet listen stream."""
MAX_CLIENT_NAMES = 64
"""Client names with a kernel connection of their own; the others share one."""
MAX_LISTENERS = 256
"""Listen streams open at once (each holds a kernel connection)."""
CONNECT_S = 10.0
"""How long a request waits for its kernel connection to open (then 503)."""


class NoHost(Exception):
    """No kernel connection could be opened (the host is not listening)."""


class _Kernel:
    def __init__(self) -> None:
        self.client: Client | None = None
        self.ready = trio.Event()
        self.error: BaseException | None = None


class KernelConnections:
    """Kernel connections shared by the stateless requests of each client name.

    Args:
        connect: Opens a kernel connection.
        nursery: Where the connections run (they live until the host closes them).
    """

    def __init__(self, connect: Connect, nursery: trio.Nursery) -> None:
        self.connect = connect
        self.nursery = nursery
        self._by_name: dict[str, _Kernel] = {}

    async def get(self, client_name: str) -> Client:
        """The kernel connection for ``client_name`` (opened on first use).

        Raises:
            NoHost: The host cannot be reached.
        """
        name = f"mcp-http:{client_name or 'client'}"
        if name not in self._by_name and len(self._by_name) >= MAX_CLIENT_NAMES:
            name = "mcp-http:client"
        entry = self._by_name.get(name)
        if entry is None:
            entry = self._by_name[name] = _Kernel()
            self.nursery.start_soon(self._run, name, entry)
        with trio.move_on_after(CONNECT_S):
            await entry.ready.wait()
        if entry.client is None:
            why = entry.error if entry.ready.is_set() else f"no answer within {CONNECT_S:g} s"
            raise NoHost(f"cannot reach the host: {why}")
        return entry.client

    async def _run(self, name: str, entry: _Kernel) -> None:
        try:
            stream = await self.connect()
            async with client_on_stream(stream, name=name) as kernel:
                entry.client = kernel
                entry.ready.set()
                await closed(kernel)
        except Exception as exc:  # the host went away (or never came): the next request retries
            entry.error = exc
            log.debug("stateless kernel connection %s ended: %s", name, exc)
        finally:
            if self._by_name.get(name) is entry:
                del self._by_name[name]
            entry.client = None
            entry.ready.set()


class StatelessFace:
    """Answers the stateless era's requests.

    Args:
        kernels: The shared kernel connections.
        connect: Opens a kernel connection (a listen stream's own).
        nursery: Where cancels run.
        tracing: MCP server spans, or None.
    """

    def __init__(
        self, kernels: KernelConnections, connect: Connect, nursery: trio.Nursery, tracing: Any
    ) -> None:
        self.kernels = kernels
        self.connect = connect
        self.nursery = nursery
        self.tracing = tracing
        self.listeners = 0

    def connection(self) -> McpServerConnection:
        return McpServerConnection(server_version=supervisor.__version__, era="modern")

    async def post(
        self,
        ex: Exchange,
        body: bytes,
        headers: Mapping[str, str],
        raw_headers: Headers,
        identity: Identity,
    ) -> None:
        """A POST that names a stateless revision in ``MCP-Protocol-Version``."""
        conn = self.connection()
        duplicated = duplicated_routing_header(raw_headers)
        if duplicated is not None:
            message = f"the {duplicated} header appears more than once"
            await ex.json(400, conn.error(None, mcp.HEADER_MISMATCH, message))
            return
        try:
            events = conn.receive(body, headers)
        except LineTooLong:
            await ex.send(413, b"message too large\n")
            return
        if len(events) != 1:
            message = "send one JSON-RPC message per POST"
            await ex.json(400, conn.error(None, mcp.INVALID_REQUEST, message))
            return
        await self.answer(ex, conn, events[0], identity)

    async def answer(
        self, ex: Exchange, conn: McpServerConnection, ev: Any, identity: Identity
    ) -> None:
        """Answer one decoded stateless request (or notification) on ``ex``."""
        if isinstance(ev, Reply):
            await ex.json(HTTP_STATUS.get(ev.code, 200) if ev.code is not None else 200, ev.data)
            return
        if isinstance(ev, Listen):
            await self._listen(ex, conn, ev, identity)
            return
        if not isinstance(ev, ListTools | CallTool | Forward):
            # Cancelled, Accepted: this era has no client notifications over HTTP (a client
            # cancels by closing its request); acknowledged and dropped.
            await ex.send(202, b"")
            return
        client = conn.client.name if conn.client is not None else ""
        try:
            kernel = await self.kernels.get(client)
        except NoHost as exc:
            log.warning("MCP HTTP: %s", exc)
            await ex.send(503, b"toolhost: no host to connect to\n")
            return
        face = McpFace(
            conn,
            kernel,
            self.nursery,
            tracing=self.tracing,
            transport="tcp",
            profile=identity.profile,
        )
        if isinstance(ev, ListTools):
            await ex.json(200, await face.list_tools(ev.id, ev.cursor))
        elif isinstance(ev, Forward):
            forwarded = await _until_answer_or_gone(ex, face, ev, None)
            if forwarded is not None:
                code = conn.error_code
                await ex.json(HTTP_STATUS.get(code, 200) if code is not None else 200, forwarded)
        elif ev.progress_token is None:
            answer = await _until_answer_or_gone(ex, face, ev, None)
            if answer is not None:
                code = conn.error_code
                await ex.json(HTTP_STATUS.get(code, 200) if code is not None else 200, answer)
        else:  # progress events, then the answer, on one event stream
            await ex.sse_answer(lambda notify: _until_answer_or_gone(ex, face, ev, notify))

    async def _listen(
        self, ex: Exchange, conn: McpServerConnection, ev: Listen, identity: Identity
    ) -> None:
        if self.listeners >= MAX_LISTENERS:
            message = f"{MAX_LISTENERS} listen streams are open; try again later"
            await ex.json(200, conn.error(ev.id, mcp.INTERNAL_ERROR, message))
            return
        try:
            stream = await self.connect()
        except OSError as exc:
            log.warning("MCP HTTP: cannot reach the host: %s", exc)
            await ex.send(503, b"toolhost: no host to connect to\n")
            return
        shown = honored(ev.wanted)
        client = conn.client.name if conn.client is not None else "client"
        started = False
        self.listeners += 1
        try:
            async with (
                client_on_stream(stream, name=f"mcp-http-listen:{client}") as kernel,
                trio.open_nursery() as nursery,
            ):
                face = McpFace(conn, kernel, nursery, transport="tcp", profile=identity.profile)
                queue = NoticeQueue()  # what the client has not read: one per key at most
                if shown.resourceSubscriptions:  # on this stream's own kernel connection
                    uris = await face.subscribe(shown.resourceSubscriptions)
                    shown = msgspec.structs.replace(shown, resourceSubscriptions=uris or None)
                followed = set(shown.resourceSubscriptions or ())

                def changed(kind: str) -> None:
                    if wants(shown, kind):
                        queue.put(("changed", kind), conn.list_changed(kind, ev.id))

                def updated(uri: str) -> None:
                    if uri in followed:
                        queue.put(("updated", uri), conn.resource_updated(uri, ev.id))

                await ex.sse_start()
                started = True
                await ex.sse_event(conn.listen_ack(ev.id, shown))

                async def watch() -> None:
                    await face.watch_catalog(changed, on_updated=updated)
                    nursery.cancel_scope.cancel()  # the host left: the stream ends (abruptly)

                async def gone() -> None:
                    await ex.until_gone()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                nursery.start_soon(gone)
                while True:
                    data = None
                    with trio.move_on_after(PING_S):
                        data = await queue.get()
                    if data is None:
                        await ex.sse_ping()
                    else:
                        await ex.sse_event(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("listen stream %r ended: %s", ev.id, exc)
            return  # the client left
        except Exception as exc:  # the host refused or dropped the kernel connection
            log.warning("listen stream %r ended: %s", ev.id, exc)
        finally:
            self.listeners -= 1
        if not started:
            await ex.send(503, b"toolhost: no host to connect to\n")
            return
        # The host left (the kernel connection and its catalog watch are gone): the stream
        # ends without a result, which tells the client to listen again.
        try:
            await ex.sse_end()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return


async def _until_answer_or_gone(
    ex: Exchange, face: McpFace, ev: CallTool | Forward, notify: Any
) -> Line | None:
    """Run the call (or read, get, completion) until it answers, or cancel it when the client
    closes its connection (the stateless era's cancel); None when there is nothing to send."""
    answer: Line | None = None
    async with trio.open_nursery() as nursery:

        async def gone() -> None:
            await ex.until_gone()
            face.cancel(Cancelled(id=ev.id, reason="the client closed its connection"))

        nursery.start_soon(gone)
        if isinstance(ev, Forward):
            answer = await face.forward(ev)
        else:
            answer = await face.call_tool(ev, notify or _drop)
        nursery.cancel_scope.cancel()
    return answer


async def closed(kernel: Client) -> None:
    """Until the kernel connection closes (its broadcast events end with it)."""
    async for _ in kernel.events:
        pass


def _drop(_data: Line) -> None:
    """Progress nobody asked for."""
