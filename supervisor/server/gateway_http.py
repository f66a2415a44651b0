"""Plain HTTP routes next to the WebSocket gateway on the same port (``/healthz``, ``/readyz``).

# Strategy: each TCP connection's request head is read first (bounded in size and time). A
# ``GET`` of a registered route without ``Upgrade`` is answered here and the connection closed, and
# so is any other request without ``Upgrade`` (404, or 426 at the WebSocket path); a handshake is
# handed to trio-websocket's server handshake on a stream that replays the bytes already read, so
# the WebSocket side sees the connection untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import trio
from trio_websocket import WebSocketRequest, wrap_server_stream

from supervisor.server.admission import close_quietly, overloaded_line

log = logging.getLogger("toolhost.server")

MAX_HEAD = 64 * 1024
HEAD_TIMEOUT_S = 10.0
LINGER_S = 1.0
"""How long a connection closed after an error answer keeps reading (and dropping) what the
client still sends, so the close does not reset the connection before the answer is read."""

Route = Callable[[str], Awaitable[tuple[int, bytes]]]
"""path -> (HTTP status, JSON body)."""

_REASONS = {
    200: b"OK",
    304: b"Not Modified",
    400: b"Bad Request",
    403: b"Forbidden",
    404: b"Not Found",
    408: b"Request Timeout",
    413: b"Content Too Large",
    415: b"Unsupported Media Type",
    426: b"Upgrade Required",
    503: b"Service Unavailable",
}


class Page(NamedTuple):
    """A plain HTTP answer with its own headers (the console's static files)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    head_only: bool = False
    """Send the headers (with the body's length) but not the body (``HEAD``, ``304``)."""


Pages = Callable[[str, str, bytes], "Page | None"]
"""(method, path, request head) -> a page, or None when the path is not one of them."""


class ReplayStream(trio.abc.Stream):
    """``stream``, with ``prefix`` handed out first by :meth:`receive_some`.

    The peer's EOF (a half-close: it shut down its sending side and still reads) is held back
    from the reader: trio-websocket would take it for a dead connection and stop sending. It
    sets :attr:`peer_eof` instead, and the reader gets the EOF only after :meth:`release_eof`
    (the WebSocket side answered what it had read and closes).
    """

    def __init__(self, stream: trio.SocketStream, prefix: bytes) -> None:
        self.stream = stream
        self._prefix = prefix
        self.peer_eof = trio.Event()
        self._released = trio.Event()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            n = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:n], self._prefix[n:]
            return data
        if self.peer_eof.is_set():
            await self._released.wait()
            return b""
        data = await self.stream.receive_some(max_bytes)
        if not data:
            self.peer_eof.set()
            await self._released.wait()
        return data

    def release_eof(self) -> None:
        """Let the reader see the peer's EOF (the connection is closing)."""
        self._released.set()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()


async def read_head(stream: trio.SocketStream) -> bytes | None:
    """Bytes up to and including the end of the request head (plus whatever followed), or None
    if the client closed, was too slow, or sent a head over :data:`MAX_HEAD`."""
    buf = bytearray()
    with trio.move_on_after(HEAD_TIMEOUT_S):
        while b"\r\n\r\n" not in buf:
            data = await stream.receive_some(16 * 1024)
            if not data:
                return None
            buf += data
            if len(buf) > MAX_HEAD:
                return None
        return bytes(buf)
    return None


def request_line(head: bytes) -> tuple[str, str, bool]:
    """``(method, path, upgrade)`` of a request head (empty strings when unparsable)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        return "", "", False
    upgrade = any(line.lower().startswith(b"upgrade:") for line in lines[1:])
    method = parts[0].decode("latin-1")
    path = parts[1].split(b"?", 1)[0].decode("latin-1")
    return method, path, upgrade


async def answer(
    stream: trio.SocketStream,
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
) -> None:
    """A complete HTTP/1.1 response that closes the connection."""
    head = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"OK"))
    head += b"content-type: %s\r\ncontent-length: %d\r\n" % (content_type, len(body))
    head += b"cache-control: no-store\r\nconnection: close\r\n\r\n"
    await stream.send_all(head + body)


async def answer_page(stream: trio.SocketStream, page: Page) -> None:
    """A complete HTTP/1.1 response with the page's headers; closes the connection."""
    head = b"HTTP/1.1 %d %s\r\n" % (page.status, _REASONS.get(page.status, b"OK"))
    for name, value in page.headers:
        head += name + b": " + value + b"\r\n"
    if page.status != 304:
        head += b"content-length: %d\r\n" % len(page.body)
    head += b"connection: close\r\n\r\n"
    await stream.send_all(head if page.head_only else head + page.body)


async def linger_close(stream: trio.SocketStream, linger_s: float = LINGER_S) -> None:
    """Close after an answer that ends the connection: shut down our side, then read and drop
    what the client still sends for at most ``linger_s`` (closing with unread bytes would reset
    the connection and could destroy the answer on its way)."""
    with trio.move_on_after(linger_s):
        try:
            await stream.send_eof()
            while await stream.receive_some(1 << 16):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    await close_quietly(stream)


async def refuse_overloaded(stream: trio.SocketStream, cap: int) -> None:
    """An HTTP connection over the cap: 503 with the ``overloaded`` JSON the socket sends, then
    closed (bounded: a client that does not read costs at most a few seconds)."""
    with trio.move_on_after(1.0):
        try:
            await answer(stream, 503, overloaded_line(cap) + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    await linger_close(stream)


def not_served(method: str, path: str, ws_path: str) -> Page:
    """The answer to a plain request for a path the gateway does not serve: 404 with a short
    text (426 at the WebSocket path, 400 for a request line that does not parse)."""
    if not method:
        status, text = 400, "bad request: not an HTTP/1.1 request line"
    elif path == ws_path:
        status, text = 426, f"upgrade required: {ws_path} takes a WebSocket handshake"
    else:
        served = f"{ws_path} (WebSocket), /healthz, /readyz, the console at /"
        status, text = 404, f"not found: the gateway serves {served}"
    plain = [(b"content-type", b"text/plain; charset=utf-8"), (b"cache-control", b"no-store")]
    return Page(status, plain, text.encode() + b"\n", head_only=method == "HEAD")


def connection_handler(
    ws_handler: Callable[[WebSocketRequest, ReplayStream], Awaitable[None]],
    routes: dict[str, Route],
    *,
    max_message_size: int,
    message_queue_size: int = 64,
    pages: Pages | None = None,
    ws_path: str = "/ws",
) -> Callable[[trio.SocketStream], Awaitable[None]]:
    """A per-connection handler for :func:`~supervisor.server.admission.serve_listeners`:
    ``routes`` (and ``pages``) answered as plain HTTP, any other plain request 404 (426 at
    ``ws_path``), every ``Upgrade`` request through the WebSocket handshake to ``ws_handler``
    (with the connection's stream, which tells a half-close)."""

    async def handle(stream: trio.SocketStream) -> None:
        try:
            async with stream:
                head = await read_head(stream)
                if head is None:
                    return
                method, path, upgrade = request_line(head)
                route = routes.get(path)
                if route is not None and method == "GET" and not upgrade:
                    status, body = await route(path)
                    await answer(stream, status, body)
                    return
                if pages is not None and method in ("GET", "HEAD") and not upgrade:
                    page = pages(method, path, head)
                    if page is not None:
                        await answer_page(stream, page)
                        return
                if not upgrade:
                    await answer_page(stream, not_served(method, path, ws_path))
                    return
                async with trio.open_nursery() as nursery:
                    replay = ReplayStream(stream, head)
                    request = await wrap_server_stream(
                        nursery,
                        replay,
                        message_queue_size=message_queue_size,
                        max_message_size=max_message_size,
                    )
                    try:
                        await ws_handler(request, replay)
                    finally:
                        nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("gateway connection ended: %s", exc)
        except Exception:  # one bad connection never takes the gateway down
            log.exception("gateway connection failed")

    return handle
