"""``toolhost mcp --http``: the MCP Streamable HTTP transport (one endpoint, ``/mcp``).

# Strategy: a small HTTP/1.1 server on h11 (already under trio-websocket). ``POST /mcp`` carries
# one JSON-RPC message, and the client's era decides what it means. A stateless client (one that
# names the 2026-07-28 revision in ``MCP-Protocol-Version``, or sends ``server/discover``) gets
# every request answered on its own by :mod:`supervisor.mcp_face.stateless`: no session, so any
# replica can answer. A handshake client's ``initialize`` opens a session (a fresh
# :class:`McpServerConnection` and kernel connection, named by the ``Mcp-Session-Id`` header of
# the answer); notifications and responses get ``202``; ``tools/list`` and lifecycle answers are
# ``application/json``; a ``tools/call`` with a progress token answers as an SSE stream
# (progress events, then the response), without one as JSON. ``GET /mcp`` opens the session's
# SSE stream for ``notifications/tools/list_changed``; ``DELETE /mcp`` ends the session. Every
# request needs ``Authorization: Bearer <token>`` (:mod:`supervisor.mcp_face.auth`: each token
# gives its profile, and a session stays with the token that opened it) and, when it carries
# ``Origin``, an allowed origin (loopback, or one given with ``--allow-origin``):
# DNS-rebinding protection.
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

import logging
import secrets
from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import h11
import trio

import supervisor
from supervisor.client import client_on_stream
from supervisor.contracts import mcp
from supervisor.mcp_face.auth import Identity, TokenTable
from supervisor.mcp_face.exchange import Exchange
from supervisor.mcp_face.face import Connect, McpFace
from supervisor.mcp_face.notices import NoticeQueue
from supervisor.mcp_face.stateless import KernelConnections, StatelessFace
from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.mcp_server import (
    CallTool,
    Cancelled,
    Forward,
    ListTools,
    McpServerConnection,
    Reply,
)
from supervisor.server.admission import ConnectionCount, serve_listeners
from supervisor.server.gateway_http import HEAD_TIMEOUT_S, answer, refuse_overloaded
from supervisor.server.listen import open_tcp
from supervisor.server.ws import is_loopback, parse_listen

log = logging.getLogger("toolhost.mcp")

MCP_PATH = "/mcp"
MAX_BODY = 16 * 1024 * 1024
MAX_SESSIONS = 256
MAX_HEAD = 64 * 1024
HealthHook = Callable[[str], Awaitable[tuple[int, bytes]]]
"""``/healthz`` or ``/readyz`` -> (status, JSON body)."""


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
    def __init__(self, sid: str, conn: McpServerConnection, identity: Identity) -> None:
        self.id = sid
        self.conn = conn
        self.identity = identity
        self.face: McpFace | None = None
        self.scope = trio.CancelScope()
        self.get_stream: NoticeQueue | None = None

    def push(self, key: Hashable, data: bytes) -> None:
        """A server-initiated message: onto the GET stream when one is open (else dropped, as
        the transport allows), replacing a waiting one with the same ``key``."""
        if self.get_stream is not None:
            try:
                self.get_stream.put(key, data)
            except trio.ClosedResourceError:
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
        token: The bearer token clients must send, or the table of accepted tokens and the
            profile each gives (:meth:`set_tokens` swaps it on a reload).
        allowed_origins: ``Origin`` values accepted besides loopback ones.
        health: Answers ``/healthz`` and ``/readyz`` (404 when None).
    """

    def __init__(
        self,
        connect: Connect,
        token: str | TokenTable,
        *,
        allowed_origins: set[str] | None = None,
        health: HealthHook | None = None,
        tracing: Any = None,
        limits: HttpLimits | None = None,
    ) -> None:
        self.connect = connect
        self.limits = limits or HttpLimits()
        self.count = ConnectionCount(self.limits.max_connections)
        self.tokens = TokenTable.single(token) if isinstance(token, str) else token
        self.allowed_origins = allowed_origins or set()
        self.health = health
        self.tracing = tracing
        """MCP server spans (``supervisor.telemetry.tracing.Tracing``) or None."""
        self.sessions: dict[str, _Session] = {}
        self._nursery: trio.Nursery | None = None
        self._stateless: StatelessFace | None = None

    def set_tokens(self, tokens: TokenTable) -> None:
        """Accept ``tokens`` from now on (a reload). Open sessions follow their token's new
        profile; a session whose token is gone ends."""
        self.tokens = tokens
        for session in list(self.sessions.values()):
            entry = tokens.tokens.get(session.identity.name)
            if entry is None:
                self.sessions.pop(session.id, None)
                session.scope.cancel()
                continue
            session.identity = entry[1]
            if session.face is not None:
                session.face.profile = entry[1].profile

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
            kernels = KernelConnections(self.connect, nursery)
            self._stateless = StatelessFace(kernels, self.connect, nursery, self.tracing)
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
                            await Exchange(stream, h).refuse(exc.error_status_hint, why)
                        return
                    if request is None:
                        return
                    first = False
                    req, body = request
                    await self._dispatch(Exchange(stream, h), req, body)
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
                    await Exchange(stream, h).refuse(
                        400, b"bad request: both Content-Length and Transfer-Encoding\n"
                    )
                    return None
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    await Exchange(stream, h).refuse(413, b"request body too large\n")
                    return None
            elif isinstance(event, h11.EndOfMessage):
                assert req is not None
                return req, bytes(body)
            else:  # ConnectionClosed, PAUSED
                return None

    async def _dispatch(self, ex: Exchange, req: h11.Request, body: bytes) -> None:
        headers = {k.lower(): v for k, v in req.headers}
        path = req.target.split(b"?", 1)[0].decode("latin-1")
        method = req.method.decode("latin-1")
        if path in ("/healthz", "/readyz") and method == "GET":
            if self.health is None:
                await ex.send(404, b"not found\n")
            else:
                status, answer = await self.health(path)
                await ex.json(status, answer)
            return
        if path != MCP_PATH:
            await ex.send(404, b"not found: the MCP endpoint is /mcp\n")
            return
        origin = headers.get(b"origin")
        allowed = self.allowed_origins
        if origin is not None and not origin_allowed(origin.decode("latin-1"), allowed):
            await ex.send(403, b"forbidden: Origin not allowed\n")
            return
        identity = self.tokens.identify(headers.get(b"authorization", b""))
        if identity is None:
            await ex.send(
                401,
                b"unauthorized: send Authorization: Bearer <token>\n",
                headers=[(b"www-authenticate", b'Bearer realm="toolhost"')],
            )
            return
        raw_version = headers.get(b"mcp-protocol-version")
        version = raw_version.decode("latin-1") if raw_version is not None else None
        stateless = version in mcp.MODERN_VERSIONS
        if version is not None and not stateless and version not in mcp.SERVER_VERSIONS:
            await ex.send(400, b"unsupported MCP-Protocol-Version\n")
            return
        sid = headers.get(b"mcp-session-id", b"").decode("latin-1")
        if method == "POST":
            media = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
            if media != b"application/json":
                await ex.send(
                    415,
                    b"unsupported media type: POST /mcp takes Content-Type: application/json\n",
                )
                return
            if stateless:
                assert self._stateless is not None
                text = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers.items()}
                await self._stateless.post(ex, body, text, list(req.headers), identity)
            else:
                await self._post(ex, sid, body, identity)
        elif stateless:  # the stateless era has no GET stream and no session to delete
            await ex.send(405, b"method not allowed\n", headers=[(b"allow", b"POST")])
        elif method == "GET":
            await self._get(ex, sid, identity)
        elif method == "DELETE":
            session = self.sessions.get(sid)
            if session is None or session.identity.name != identity.name:
                await ex.send(404, b"unknown session\n")
                return
            del self.sessions[sid]
            session.scope.cancel()
            await ex.send(204, b"")
        else:
            await ex.send(405, b"method not allowed\n", headers=[(b"allow", b"GET, POST, DELETE")])

    # POST --------------------------------------------------------------------------------

    async def _post(self, ex: Exchange, sid: str, body: bytes, identity: Identity) -> None:
        session = self.sessions.get(sid) if sid else None
        if session is not None and session.identity.name != identity.name:
            session = None  # another token's session: as unknown as any other
        if sid and session is None:
            await ex.send(404, b"unknown or expired session: initialize again\n")
            return
        conn = (
            session.conn
            if session is not None
            else McpServerConnection(server_version=supervisor.__version__)
        )
        try:
            events = conn.receive(body)
        except LineTooLong:
            await ex.send(413, b"message too large\n")
            return
        if len(events) != 1:
            answer = conn.error(None, mcp.INVALID_REQUEST, "send one JSON-RPC message per POST")
            await ex.json(400, answer)
            return
        ev = events[0]
        if session is None:
            if conn.era == "modern":  # server/discover (or an enveloped request) without headers
                assert self._stateless is not None
                await self._stateless.answer(ex, conn, ev, identity)
                return
            if not (isinstance(ev, Reply) and ev.initialized):
                if isinstance(ev, Reply):  # a parse or lifecycle error: answer it as it is
                    await ex.json(400, ev.data)
                else:
                    await ex.send(400, b"missing Mcp-Session-Id: initialize first\n")
                return
            session = await self._open_session(conn, identity)
            if session is None:
                await ex.send(503, b"toolhost: no host to connect to\n")
                return
            await ex.json(200, ev.data, [(b"mcp-session-id", session.id.encode())])
            return
        face = session.face
        assert face is not None
        if isinstance(ev, Reply):
            await ex.json(200, ev.data)
        elif isinstance(ev, ListTools):
            await ex.json(200, await face.list_tools(ev.id, ev.cursor))
        elif isinstance(ev, Forward):
            forwarded = await face.forward(ev)
            if forwarded is None:
                await ex.send(202, b"")  # cancelled: no JSON-RPC answer
            else:
                await ex.json(200, forwarded)
        elif isinstance(ev, CallTool):
            if ev.progress_token is None:
                result = await face.call_tool(ev, partial(session.push, ("progress", ev.id)))
                if result is None:
                    await ex.send(202, b"")  # cancelled: no JSON-RPC answer
                else:
                    await ex.json(200, result)
            else:
                await ex.sse_answer(lambda notify: face.call_tool(ev, notify))
        else:
            if isinstance(ev, Cancelled):
                face.cancel(ev)
            await ex.send(202, b"")

    # sessions ----------------------------------------------------------------------------

    async def _open_session(self, conn: McpServerConnection, identity: Identity) -> _Session | None:
        if len(self.sessions) >= MAX_SESSIONS:
            oldest = next(iter(self.sessions))
            log.warning("MCP HTTP: %d sessions open; closing the oldest", MAX_SESSIONS)
            self.sessions.pop(oldest).scope.cancel()
        session = _Session(secrets.token_urlsafe(24), conn, identity)
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
                        profile=session.identity.profile,
                    )
                    task_status.started()
                    # The watch ends when the kernel connection does; the session ends with it.
                    conn = session.conn
                    await session.face.watch_catalog(
                        lambda kind: session.push(("changed", kind), conn.list_changed(kind)),
                        on_updated=lambda uri: session.push(
                            ("updated", uri), conn.resource_updated(uri)
                        ),
                    )
                    nursery.cancel_scope.cancel()
            except Exception as exc:  # the host went away: the session ends, the server stays
                log.warning("MCP HTTP session %s ended: %s", session.id[:8], exc)
        self.sessions.pop(session.id, None)
        if session.get_stream is not None:
            session.get_stream.close()

    # GET ---------------------------------------------------------------------------------

    async def _get(self, ex: Exchange, sid: str, identity: Identity) -> None:
        session = self.sessions.get(sid)
        if session is None or session.identity.name != identity.name:
            await ex.send(404 if sid else 400, b"unknown or missing session\n")
            return
        if session.get_stream is not None:
            await ex.send(409, b"this session already has a GET stream\n")
            return
        queue = session.get_stream = NoticeQueue()
        await ex.sse_start()
        try:
            while (data := await queue.get()) is not None:
                await ex.sse_event(data)
            await ex.sse_end()
        finally:
            queue.close()
            if session.get_stream is queue:
                session.get_stream = None
