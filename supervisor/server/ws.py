"""The WebSocket gateway: ``ws://<host.ws.listen>/ws``, the same methods and events.

# Strategy: text frames carry JSON and binary frames MessagePack; each answer uses the encoding
# of the frame that asked. Clients authenticate with ``Authorization: Bearer <token>`` (compared
# in constant time) during the handshake; the token lives in ``host.ws.tokenFile`` (mode 0600),
# generated on first start when absent, read at start and at reload only
# (``private_files.py``). A browser, which cannot set that header, offers the token as the
# subprotocol ``toolhost.bearer.<token>`` instead, and its ``Origin`` must be the gateway's own
# (``server/console.py``, which also serves the web console at ``/``). ``/healthz`` and
# ``/readyz`` share the port (``server/health.py``).
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import logging
import math

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest
from wsproto.connection import ConnectionState
from wsproto.events import BytesMessage, TextMessage
from wsproto.utilities import LocalProtocolError

from supervisor.private_files import TokenFile
from supervisor.server import console
from supervisor.server.admission import overloaded_line, serve_listeners
from supervisor.server.backend import Backend
from supervisor.server.codec import Codec
from supervisor.server.gateway_http import Page, ReplayStream, Route, connection_handler
from supervisor.server.health import http_answer
from supervisor.server.listen import open_tcp
from supervisor.server.stream import ConnectionLimits
from supervisor.server.transport import QueuedTransport

log = logging.getLogger("toolhost.server")

WS_PATH = "/ws"
CLOSE_GRACE_S = 2.0
"""How long a closing connection waits for the peer's close frame."""


def parse_listen(listen: str) -> tuple[str, int]:
    """``127.0.0.1:7717`` / ``[::1]:7717`` -> (host, port).

    Raises:
        ValueError: Not ``host:port``.
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"host.ws.listen must be host:port, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def authorized(request: WebSocketRequest, token: str) -> bool:
    expected = f"Bearer {token}".encode()
    for name, value in request.headers:
        if name.lower() == b"authorization":
            return hmac.compare_digest(value.strip(), expected)
    return False


def browser_refusal(request: WebSocketRequest, loopback: bool) -> str | None:
    """Why a handshake is refused before its token is looked at, or None. On a loopback
    listener every handshake must name a loopback ``Host`` (a DNS-rebinding page has a foreign
    one, and a client that drops ``Origin`` is no excuse). A request with ``Origin`` (browsers
    send one) must also come from the gateway's own origin; clients that send no ``Origin``
    (kernels, the CLI) are not browsers and need only the token."""
    event = getattr(request, "_event", None)  # wsproto's Request: it keeps Host apart
    host = getattr(event, "host", None)
    origin = next((v for k, v in request.headers if k.lower() == b"origin"), None)
    if loopback and not console.host_is_loopback(host):
        return f"Host {host!r} is not loopback"
    if origin is None:
        return None
    shown = origin.decode("latin-1", "replace")
    if not console.same_origin(shown, host):
        return f"origin {shown} is not this gateway's (http://{host})"
    return None


class WsConnection(QueuedTransport):
    """One WebSocket client."""

    def __init__(
        self,
        backend: Backend,
        ws: WebSocketConnection,
        limits: ConnectionLimits,
        name: str,
        stream: ReplayStream | None = None,
    ):
        super().__init__(backend, name, limits.max_queue_bytes)
        self.limits = limits
        self.ws = ws
        self.stream = stream
        """The TCP stream under ``ws``: it tells a half-close (None: no half-close support)."""
        self._receiving: trio.CancelScope | None = None
        self.codecs = {
            "json": Codec("json", framed=False),
            "msgpack": Codec("msgpack", framed=False),
        }

    def switch_encoding(self, encoding: str) -> Codec:
        # Frames carry their own encoding on a WebSocket: nothing to switch.
        return self.codecs["msgpack" if encoding == "msgpack" else "json"]

    async def run(self) -> None:
        json_codec, msgpack_codec = self.codecs["json"], self.codecs["msgpack"]
        session = self.session
        handle = session.handle
        pause = self.limits.pause_bytes
        try:
            async with trio.open_nursery() as nursery:
                session.attach(nursery)
                nursery.start_soon(self._writer)
                if self.stream is not None:
                    nursery.start_soon(self._watch_eof, self.stream.peer_eof)
                with trio.CancelScope() as self._scope:  # disconnect() stops the reading
                    while not self.out.closed:
                        # Fairness and memory: read nothing more while its answers pile up or
                        # it has its quota of calls in flight.
                        while self.out.queued_bytes > pause and not self.out.closed:
                            await self.out.drain(timeout_s=60.0)
                        if session.full:
                            await session.wait_room()
                        try:
                            message = await self._receive()
                        except ConnectionClosed:
                            break
                        if message is None:  # a half-close: the client still reads
                            assert self.stream is not None
                            await self.finish(self.stream.stream.socket.fileno(), self._flushed)
                            break
                        if isinstance(message, str):
                            handle(message.encode("utf-8"), json_codec)
                        else:
                            handle(bytes(message), msgpack_codec)
                await session.leave(self.close_reason or "the client closed the connection")
                nursery.cancel_scope.cancel()
        finally:
            self.session.close()
            # Bounded: when the gateway itself is cancelled, the task that would read the peer's
            # close frame is gone, and an unbounded wait here would hang the shutdown.
            with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                if self.stream is not None:  # our close frame goes out, then the EOF is seen
                    self.stream.release_eof()
                with trio.move_on_after(CLOSE_GRACE_S):
                    await self.ws.aclose()

    async def _receive(self) -> str | bytes | None:
        """The next message; None once the client half-closed and every message it sent before
        is taken.

        Raises:
            ConnectionClosed: The connection closed (a close frame, a reset).
        """
        stream = self.stream
        if stream is not None and stream.peer_eof.is_set():
            # Nothing arrives after the EOF: take what trio-websocket queued, never wait.
            recv = getattr(self.ws, "_recv_channel", None)
            if recv is None:
                return None
            try:
                message: str | bytes = recv.receive_nowait()
            except trio.WouldBlock:
                return None
            except (trio.EndOfChannel, trio.ClosedResourceError):
                raise ConnectionClosed(self.ws.closed) from None
            return message
        with trio.CancelScope() as self._receiving:
            try:
                return await self.ws.get_message()
            finally:
                self._receiving = None
        return None  # cancelled by _watch_eof while waiting: nothing was queued

    async def _watch_eof(self, eof: trio.Event) -> None:
        """At the client's EOF, stop a read that waits (its queue is empty: it would wait for
        ever)."""
        await eof.wait()
        if self._receiving is not None:
            self._receiving.cancel()

    async def _flushed(self) -> None:
        """Every answer queued so far is written (or the connection closed)."""
        await self.out.drain(timeout_s=math.inf)

    async def _writer(self) -> None:
        out = self.out
        try:
            while True:
                frames = await out.take()
                if len(frames) == 1:
                    frame, binary = frames[0]
                    await self.ws.send_message(frame if binary else frame.decode("utf-8"))
                else:
                    await send_batch(self.ws, frames)
                out.written()
        except ConnectionClosed:
            self.disconnect("connection closed")


BATCH_BYTES = 256 * 1024


def data_frame(payload: bytes, opcode: int) -> bytes:
    """One unmasked, final WebSocket frame (RFC 6455 5.2) as a server sends it."""
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, n))
    elif n < 1 << 16:
        head = bytes((0x80 | opcode, 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 127)) + n.to_bytes(8, "big")
    return head + payload


async def send_batch(ws: WebSocketConnection, frames: list[tuple[bytes, bool]]) -> None:
    """Send several messages with one write per ~256 KiB instead of one per message (a console
    following a busy host gets two events per call). Uses trio-websocket's own wsproto state
    and stream lock, exactly as its ``send_message`` does; without them, one at a time.

    Raises:
        ConnectionClosed: The connection is closed or broke.
    """
    proto = getattr(ws, "_wsproto", None)
    lock = getattr(ws, "_stream_lock", None)
    stream = getattr(ws, "_stream", None)
    if proto is None or lock is None or stream is None:
        for frame, binary in frames:
            await ws.send_message(frame if binary else frame.decode("utf-8"))
        return
    # Without extensions (the gateway negotiates none) a server's data frame is just a header
    # and the payload: framed here at a tenth of wsproto's cost, which matters per event.
    frames_proto = getattr(getattr(proto, "connection", None), "_proto", None)
    raw = not getattr(frames_proto, "extensions", True)
    i = 0
    while i < len(frames):
        if ws.closed is not None:
            raise ConnectionClosed(ws.closed)
        chunk: list[bytes] = []
        size = 0
        while i < len(frames) and size < BATCH_BYTES:
            frame, binary = frames[i]
            i += 1
            if raw and proto.state is ConnectionState.OPEN:
                data = data_frame(frame, 0x2 if binary else 0x1)
            else:
                event = (
                    BytesMessage(data=frame) if binary else TextMessage(data=frame.decode("utf-8"))
                )
                try:
                    data = proto.send(event)
                except LocalProtocolError:  # closing: the peer's close frame came in meanwhile
                    raise ConnectionClosed(ws.closed) from None
            chunk.append(data)
            size += len(data)
        async with lock:
            try:
                await stream.send_all(b"".join(chunk))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                abort = getattr(ws, "_abort_web_socket", None)
                if abort is not None:
                    await abort()
                raise ConnectionClosed(ws.closed) from None


async def serve_ws(
    backend: Backend,
    listen: str,
    token: str | TokenFile,
    *,
    limits: ConnectionLimits | None = None,
    listeners: list[trio.SocketListener] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the kernel protocol over WebSocket until cancelled (on ``listeners`` when they were
    opened before, else opening them here); ``started`` gets the port.

    ``token`` as a :class:`TokenFile` is the one the host last read (at start or reload).

    ``GET /healthz`` and ``GET /readyz`` on the same port answer liveness and readiness
    (:mod:`supervisor.server.health`), without a token, for probes.
    """
    limits = limits or ConnectionLimits()
    count = limits.connections()
    bind, port = parse_listen(listen)
    if not is_loopback(bind):
        log.warning(
            "WebSocket gateway listening on non-loopback %s: anyone with the token can call tools",
            bind,
        )

    loopback = is_loopback(bind)

    async def handler(request: WebSocketRequest, stream: ReplayStream) -> None:
        remote = f"ws:{request.remote}"
        if request.path.split("?", 1)[0] != WS_PATH:
            await request.reject(404, body=b"not found: the gateway is at /ws\n")
            return
        refused = browser_refusal(request, loopback)
        if refused is not None:
            log.warning("refused WebSocket client %s: %s", remote, refused)
            await request.reject(403, body=f"forbidden: {refused}\n".encode())
            return
        current = token if isinstance(token, str) else token.value
        by_subprotocol = console.bearer_from_subprotocols(request.proposed_subprotocols, current)
        if not by_subprotocol and not authorized(request, current):
            log.warning("refused WebSocket client %s: missing or wrong bearer token", remote)
            await request.reject(
                401,
                extra_headers=[(b"WWW-Authenticate", b'Bearer realm="toolhost"')],
                body=b"unauthorized: send Authorization: Bearer <token from host.ws.tokenFile>\n",
            )
            return
        if not count.try_enter():
            await request.reject(
                503,
                extra_headers=[(b"Content-Type", b"application/json")],
                body=overloaded_line(count.cap) + b"\n",
            )
            return
        try:
            # A browser (the console) offered the token as a subprotocol: answer the plain one.
            ws = await request.accept(subprotocol=console.SUBPROTOCOL if by_subprotocol else None)
            await WsConnection(backend, ws, limits, remote, stream).run()
        finally:
            count.leave()

    async def health_route(path: str) -> tuple[int, bytes]:
        return http_answer(path, backend.views.health())

    # Plain HTTP routes share the port with the WebSocket handshake (docs/deploy.md).
    routes: dict[str, Route] = {"/healthz": health_route, "/readyz": health_route}

    def pages(method: str, path: str, head: bytes) -> Page | None:
        # The web console (docs/console.md), read at each request so a reload can turn it off.
        if not backend.views.host_config().console:
            return console.console_off(path)
        return console.serve_page(method, path, head, loopback=loopback)

    if listeners is None:
        listeners = await open_tcp(bind, port, "host.ws.listen")
    handle = connection_handler(
        handler, routes, max_message_size=limits.max_frame, pages=pages, ws_path=WS_PATH
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(count.trimmer)
        task_status.started(listeners[0].socket.getsockname()[1])
        await serve_listeners(handle, listeners, what="the WebSocket gateway")
