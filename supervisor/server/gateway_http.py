"""Plain HTTP routes next to the WebSocket gateway on the same port (``/healthz``, ``/readyz``).

# Strategy: each TCP connection's request head is read first (bounded in size and time). A
# ``GET`` of a registered route without ``Upgrade`` is answered here and the connection closed;
# anything else is handed to trio-websocket's server handshake on a stream that replays the bytes
# already read, so the WebSocket side sees the connection untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import trio
from trio_websocket import WebSocketRequest, wrap_server_stream

log = logging.getLogger("toolhost.server")

MAX_HEAD = 64 * 1024
HEAD_TIMEOUT_S = 10.0

Route = Callable[[str], Awaitable[tuple[int, bytes]]]
"""path -> (HTTP status, JSON body)."""

_REASONS = {
    200: b"OK",
    304: b"Not Modified",
    403: b"Forbidden",
    404: b"Not Found",
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


async def answer(stream: trio.SocketStream, status: int, body: bytes) -> None:
    """A complete HTTP/1.1 response that closes the connection."""
    head = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"OK"))
    head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
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


def connection_handler(
    ws_handler: Callable[[WebSocketRequest, ReplayStream], Awaitable[None]],
    routes: dict[str, Route],
    *,
    max_message_size: int,
    message_queue_size: int = 64,
    pages: Pages | None = None,
) -> Callable[[trio.SocketStream], Awaitable[None]]:
    """A per-connection handler for :func:`trio.serve_listeners`: ``routes`` (and ``pages``)
    answered as plain HTTP, every other request through the WebSocket handshake to
    ``ws_handler`` (with the connection's stream, which tells a half-close)."""

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
