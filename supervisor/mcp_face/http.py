"""``toolhost mcp --http``: the MCP Streamable HTTP transport (one endpoint, ``/mcp``).

# Strategy: a small HTTP/1.1 server on h11 (already under trio-websocket). ``POST /mcp`` carries
# one JSON-RPC message: ``initialize`` opens a session (a fresh :class:`McpServerConnection` and
# kernel connection, named by the ``Mcp-Session-Id`` header of the answer); notifications and
# responses get ``202``; ``tools/list`` and lifecycle answers are ``application/json``; a
# ``tools/call`` with a progress token answers as an SSE stream (progress events, then the
# response), without one as JSON. ``GET /mcp`` opens the session's SSE stream for
# ``notifications/tools/list_changed``; ``DELETE /mcp`` ends the session. Every request needs
# ``Authorization: Bearer <token>`` (constant-time compare) and, when it carries ``Origin``, an
# allowed origin (loopback, or one given with ``--allow-origin``): DNS-rebinding protection.
#
# Connections are held like the WebSocket gateway's (``server/admission.py``, ``gateway_http.py``):
# at most :attr:`HttpLimits.max_connections` at once (the next ones get 503 ``overloaded`` and are
# closed), a request head must arrive whole within the header timeout however slowly it trickles
# in, a kept-alive connection waits at most the idle timeout for its next request, and the accept
# loop logs EMFILE once per interval. A request h11 cannot parse, or one carrying both
# ``Content-Length`` and ``Transfer-Encoding`` (request smuggling), is answered 400 and the
# connection closed; a POST that is not ``application/json`` is answered 415 (a browser cannot
# send that type across origins without a preflight).
"""

from __future__ import annotations

import hmac
import logging
import math
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import h11
import trio

import supervisor
from supervisor.client import client_on_stream
from supervisor.contracts import mcp
from supervisor.mcp_face.face import Connect, McpFace
from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.mcp_server import (
    CallTool,
    Cancelled,
    ListTools,
    McpServerConnection,
    Reply,
)
from supervisor.server.admission import ConnectionCount, serve_listeners
from supervisor.server.gateway_http import HEAD_TIMEOUT_S, answer, linger_close, refuse_overloaded
from supervisor.server.listen import open_tcp
from supervisor.server.ws import is_loopback, parse_listen

log = logging.getLogger("toolhost.mcp")

MCP_PATH = "/mcp"
MAX_BODY = 16 * 1024 * 1024
MAX_SESSIONS = 256
MAX_HEAD = 64 * 1024
HealthHook = Callable[[str], Awaitable[tuple[int, bytes]]]
"""``/healthz`` or ``/readyz`` -> (status, JSON body)."""

Headers = list[tuple[bytes, bytes]]


class HttpLimits(NamedTuple):
    """How ``toolhost mcp --http`` holds its connections (``--max-connections``,
    ``--header-timeout``, ``--idle-timeout``)."""

    max_connections: int = 1024
    """Open TCP connections at once (also held to half the open-file limit); past it: 503."""
    header_timeout_s: float = HEAD_TIMEOUT_S
    """A request head must be complete this long after it began (after the accept, for the
    first request of a connection), else 408 and the connection is closed."""
    idle_timeout_s: float = 60.0
    """A kept-alive connection with no request under way, or a request body that stops
    arriving, is closed after this long."""


class _Session:
    def __init__(self, sid: str, conn: McpServerConnection) -> None:
        self.id = sid
        self.conn = conn
        self.face: McpFace | None = None
        self.scope = trio.CancelScope()
        self.get_stream: trio.MemorySendChannel[bytes] | None = None

    def push(self, data: bytes) -> None:
        """A server-initiated message: onto the GET stream when one is open (else dropped, as
        the transport allows)."""
        if self.get_stream is not None:
            try:
                self.get_stream.send_nowait(data)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                self.get_stream = None


def origin_allowed(origin: str, allowed: set[str]) -> bool:
    """True for a loopback origin (``http://localhost:6274``) or one listed exactly."""
    if origin in allowed or "*" in allowed:
        return True
    host = urlsplit(origin).hostname or ""
    return is_loopback(host)


class McpHttpServer:
    """Serve MCP over Streamable HTTP; every session is a kernel connection from ``connect``.

    Args:
        connect: Opens a kernel connection.
        token: The bearer token clients must send.
        allowed_origins: ``Origin`` values accepted besides loopback ones.
        health: Answers ``/healthz`` and ``/readyz`` (404 when None).
    """

    def __init__(
        self,
        connect: Connect,
        token: str,
        *,
        allowed_origins: set[str] | None = None,
        health: HealthHook | None = None,
        tracing: Any = None,
        limits: HttpLimits | None = None,
    ) -> None:
        self.connect = connect
        self.limits = limits or HttpLimits()
        self.count = ConnectionCount(self.limits.max_connections)
        self._expected = f"Bearer {token}".encode()
        self.allowed_origins = allowed_origins or set()
        self.health = health
        self.tracing = tracing
        """MCP server spans (``supervisor.telemetry.tracing.Tracing``) or None."""
        self.sessions: dict[str, _Session] = {}
        self._nursery: trio.Nursery | None = None

    async def serve(
        self, listen: str, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on ``host:port`` until cancelled; ``started`` gets the bound port."""
        bind, port = parse_listen(listen)
        if not is_loopback(bind):
            log.warning("MCP HTTP on non-loopback %s: anyone with the token can call tools", bind)
        listeners = await open_tcp(bind, port, "--http")
        bound = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self.count.trimmer)
            task_status.started(bound)
            await serve_listeners(self._connection, listeners, what="toolhost mcp --http")

    # one TCP connection ------------------------------------------------------------------

    async def _connection(self, stream: trio.SocketStream) -> None:
        if not self.count.try_enter():
            await refuse_overloaded(stream, self.count.cap)
            return
        try:
            await self._serve_connection(stream)
        finally:
            self.count.leave()

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        try:
            async with stream:
                first = True
                while True:
                    try:
                        request = await self._read_request(stream, h, first=first)
                    except h11.RemoteProtocolError as exc:
                        log.debug("bad HTTP from client: %s", exc)
                        if h.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                            why = f"bad request: {str(exc)[:200]}\n".encode("utf-8", "replace")
                            await self._refuse(stream, h, exc.error_status_hint, why)
                        return
                    if request is None:
                        return
                    first = False
                    req, body = request
                    await self._dispatch(stream, h, req, body)
                    if h.our_state is not h11.DONE or h.their_state is not h11.DONE:
                        return
                    h.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return

    async def _read_request(
        self, stream: trio.SocketStream, h: h11.Connection, *, first: bool
    ) -> tuple[h11.Request, bytes] | None:
        """The next request and its body, or None when the connection is to be closed (the
        client left, was too slow, or was answered an error already).

        Raises:
            h11.RemoteProtocolError: Not HTTP/1.1 as h11 reads it.
        """
        limits = self.limits
        # The head's clock runs from the accept (first request) or from the first byte of a
        # later one; before that a kept-alive connection may idle for the idle timeout.
        started = first or bool(h.trailing_data[0])
        deadline = trio.current_time() + (
            limits.header_timeout_s if started else limits.idle_timeout_s
        )
        req: h11.Request | None = None
        body = bytearray()
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                if req is not None:  # the body: no pause longer than the idle timeout
                    deadline = trio.current_time() + limits.idle_timeout_s
                data = None
                with trio.move_on_at(deadline):
                    data = await stream.receive_some(1 << 16)
                if data is None:
                    if started:
                        what = "request body" if req is not None else "request head"
                        log.debug("closing a client too slow to send its %s", what)
                        with trio.move_on_after(1.0):
                            await answer(
                                stream, 408, f"request timeout: {what}\n".encode(), b"text/plain"
                            )
                    return None
                if not started and data:
                    started = True
                    deadline = trio.current_time() + limits.header_timeout_s
                h.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                req = event
                names = {name.lower() for name, _ in req.headers}
                if b"content-length" in names and b"transfer-encoding" in names:
                    await self._refuse(
                        stream,
                        h,
                        400,
                        b"bad request: both Content-Length and Transfer-Encoding\n",
                    )
                    return None
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    await self._refuse(stream, h, 413, b"request body too large\n")
                    return None
            elif isinstance(event, h11.EndOfMessage):
                assert req is not None
                return req, bytes(body)
            else:  # ConnectionClosed, PAUSED
                return None

    async def _refuse(
        self, stream: trio.SocketStream, h: h11.Connection, status: int, body: bytes
    ) -> None:
        """Answer ``status`` and close the connection, after reading (and dropping) what the
        client still sends for a moment, so the answer is not lost to a reset."""
        await self._send(stream, h, status, body, close=True)
        await linger_close(stream)

    async def _send(
        self,
        stream: trio.SocketStream,
        h: h11.Connection,
        status: int,
        body: bytes,
        *,
        content_type: bytes = b"text/plain; charset=utf-8",
        headers: Headers | None = None,
        close: bool = False,
    ) -> None:
        hdrs: Headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
        hdrs += headers or []
        if close:
            hdrs.append((b"connection", b"close"))
        out = h.send(h11.Response(status_code=status, headers=hdrs)) or b""
        if body:
            out += h.send(h11.Data(data=body)) or b""
        out += h.send(h11.EndOfMessage()) or b""
        await stream.send_all(out)

    async def _dispatch(
        self, stream: trio.SocketStream, h: h11.Connection, req: h11.Request, body: bytes
    ) -> None:
        headers = {k.lower(): v for k, v in req.headers}
        path = req.target.split(b"?", 1)[0].decode("latin-1")
        method = req.method.decode("latin-1")
        if path in ("/healthz", "/readyz") and method == "GET":
            if self.health is None:
                await self._send(stream, h, 404, b"not found\n")
            else:
                status, answer = await self.health(path)
                await self._send(stream, h, status, answer, content_type=b"application/json")
            return
        if path != MCP_PATH:
            await self._send(stream, h, 404, b"not found: the MCP endpoint is /mcp\n")
            return
        origin = headers.get(b"origin")
        allowed = self.allowed_origins
        if origin is not None and not origin_allowed(origin.decode("latin-1"), allowed):
            await self._send(stream, h, 403, b"forbidden: Origin not allowed\n")
            return
        if not hmac.compare_digest(headers.get(b"authorization", b"").strip(), self._expected):
            await self._send(
                stream,
                h,
                401,
                b"unauthorized: send Authorization: Bearer <token>\n",
                headers=[(b"www-authenticate", b'Bearer realm="toolhost"')],
            )
            return
        version = headers.get(b"mcp-protocol-version")
        if version is not None and version.decode("latin-1") not in mcp.SERVER_VERSIONS:
            await self._send(stream, h, 400, b"unsupported MCP-Protocol-Version\n")
            return
        sid = headers.get(b"mcp-session-id", b"").decode("latin-1")
        if method == "POST":
            media = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
            if media != b"application/json":
                await self._send(
                    stream,
                    h,
                    415,
                    b"unsupported media type: POST /mcp takes Content-Type: application/json\n",
                )
                return
            await self._post(stream, h, sid, body)
        elif method == "GET":
            await self._get(stream, h, sid)
        elif method == "DELETE":
            session = self.sessions.pop(sid, None)
            if session is None:
                await self._send(stream, h, 404, b"unknown session\n")
                return
            session.scope.cancel()
            await self._send(stream, h, 204, b"")
        else:
            await self._send(
                stream, h, 405, b"method not allowed\n", headers=[(b"allow", b"GET, POST, DELETE")]
            )

    # POST --------------------------------------------------------------------------------

    async def _post(
        self, stream: trio.SocketStream, h: h11.Connection, sid: str, body: bytes
    ) -> None:
        session = self.sessions.get(sid) if sid else None
        if sid and session is None:
            await self._send(stream, h, 404, b"unknown or expired session: initialize again\n")
            return
        conn = (
            session.conn
            if session is not None
            else McpServerConnection(server_version=supervisor.__version__)
        )
        try:
            events = conn.receive(body)
        except LineTooLong:
            await self._send(stream, h, 413, b"message too large\n")
            return
        if len(events) != 1:
            answer = conn.error(None, mcp.INVALID_REQUEST, "send one JSON-RPC message per POST")
            await self._json(stream, h, 400, answer)
            return
        ev = events[0]
        if session is None:
            if not (isinstance(ev, Reply) and ev.initialized):
                if isinstance(ev, Reply):  # a parse or lifecycle error: answer it as it is
                    await self._json(stream, h, 400, ev.data)
                else:
                    await self._send(stream, h, 400, b"missing Mcp-Session-Id: initialize first\n")
                return
            session = await self._open_session(conn)
            if session is None:
                await self._send(stream, h, 503, b"toolhost: no host to connect to\n")
                return
            await self._json(stream, h, 200, ev.data, [(b"mcp-session-id", session.id.encode())])
            return
        face = session.face
        assert face is not None
        if isinstance(ev, Reply):
            await self._json(stream, h, 200, ev.data)
        elif isinstance(ev, ListTools):
            await self._json(stream, h, 200, await face.list_tools(ev.id))
        elif isinstance(ev, CallTool):
            if ev.progress_token is None:
                result = await face.call_tool(ev, session.push)
                if result is None:
                    await self._send(stream, h, 202, b"")  # cancelled: no JSON-RPC answer
                else:
                    await self._json(stream, h, 200, result)
            else:
                await self._call_sse(stream, h, face, ev)
        else:
            if isinstance(ev, Cancelled):
                face.cancel(ev)
            await self._send(stream, h, 202, b"")

    async def _json(
        self,
        stream: trio.SocketStream,
        h: h11.Connection,
        status: int,
        data: bytes,
        headers: Headers | None = None,
    ) -> None:
        await self._send(stream, h, status, data, content_type=b"application/json", headers=headers)

    async def _call_sse(
        self, stream: trio.SocketStream, h: h11.Connection, face: McpFace, ev: CallTool
    ) -> None:
        send, recv = trio.open_memory_channel[bytes](math.inf)

        async def run() -> None:
            async with send:
                answer = await face.call_tool(ev, send.send_nowait)
                if answer is not None:
                    send.send_nowait(answer)

        await self._sse_headers(stream, h)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            async with recv:
                async for data in recv:
                    await stream.send_all(h.send(h11.Data(data=_sse(data))) or b"")
        await stream.send_all(h.send(h11.EndOfMessage()) or b"")

    async def _sse_headers(self, stream: trio.SocketStream, h: h11.Connection) -> None:
        headers: Headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
        ]
        await stream.send_all(h.send(h11.Response(status_code=200, headers=headers)) or b"")

    # sessions ----------------------------------------------------------------------------

    async def _open_session(self, conn: McpServerConnection) -> _Session | None:
        if len(self.sessions) >= MAX_SESSIONS:
            oldest = next(iter(self.sessions))
            log.warning("MCP HTTP: %d sessions open; closing the oldest", MAX_SESSIONS)
            self.sessions.pop(oldest).scope.cancel()
        session = _Session(secrets.token_urlsafe(24), conn)
        assert self._nursery is not None
        try:
            await self._nursery.start(self._run_session, session)
        except (OSError, RuntimeError) as exc:  # RuntimeError: it ended before it started
            log.error("MCP HTTP: cannot reach the host: %s", exc)
            return None
        self.sessions[session.id] = session
        return session

    async def _run_session(
        self, session: _Session, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        name = (session.conn.client.name if session.conn.client else "") or "client"
        with session.scope:
            stream = await self.connect()
            try:
                async with (
                    client_on_stream(stream, name=f"mcp-http:{name}") as kernel,
                    trio.open_nursery() as nursery,
                ):
                    session.face = McpFace(
                        session.conn,
                        kernel,
                        nursery,
                        tracing=self.tracing,
                        transport="tcp",
                        session_id=session.id,
                    )
                    task_status.started()
                    # The watch ends when the kernel connection does; the session ends with it.
                    await session.face.watch_catalog(session.push)
                    nursery.cancel_scope.cancel()
            except Exception as exc:  # the host went away: the session ends, the server stays
                log.warning("MCP HTTP session %s ended: %s", session.id[:8], exc)
        self.sessions.pop(session.id, None)
        if session.get_stream is not None:
            session.get_stream.close()

    # GET ---------------------------------------------------------------------------------

    async def _get(self, stream: trio.SocketStream, h: h11.Connection, sid: str) -> None:
        session = self.sessions.get(sid)
        if session is None:
            await self._send(stream, h, 404 if sid else 400, b"unknown or missing session\n")
            return
        if session.get_stream is not None:
            await self._send(stream, h, 409, b"this session already has a GET stream\n")
            return
        send, recv = trio.open_memory_channel[bytes](math.inf)
        session.get_stream = send
        await self._sse_headers(stream, h)
        try:
            async with recv:
                async for data in recv:
                    await stream.send_all(h.send(h11.Data(data=_sse(data))) or b"")
            await stream.send_all(h.send(h11.EndOfMessage()) or b"")
        finally:
            if session.get_stream is send:
                session.get_stream = None


def _sse(message: bytes) -> bytes:
    return b"event: message\ndata: " + message.rstrip(b"\n") + b"\n\n"
