"""One HTTP/1.1 request-response exchange of ``toolhost mcp --http``: how an answer is written.

# Strategy: the server's connection loop reads a request with h11 and hands an :class:`Exchange`
# (the TCP stream and its h11 connection) to whoever answers it: the handshake-era sessions
# (``http.py``) and the stateless era (``stateless.py``) write through the same few calls. An
# answer is a whole body (:meth:`Exchange.send`, :meth:`Exchange.json`) or a server-sent event
# stream (:meth:`Exchange.sse_answer` for a request's progress then its answer, or
# :meth:`Exchange.sse_start`, :meth:`Exchange.sse_event`, :meth:`Exchange.sse_end`).
# :meth:`Exchange.until_gone` returns when the client closes its side, which is how a stateless
# request is cancelled (no later POST can name it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import h11
import trio

from supervisor.mcp_face.notices import NoticeQueue
from supervisor.protocols.mcp_server import Line
from supervisor.server.gateway_http import linger_close

Headers = list[tuple[bytes, bytes]]
Produce = Callable[[Callable[[Line], None]], Awaitable[Line | None]]
"""Runs a request, handing what it notifies (progress) to its argument; returns the answer
(None: nothing to answer, e.g. a cancelled call)."""

SSE_PING = b": ping\n\n"
"""An SSE comment: keeps a quiet stream alive through proxies' idle timeouts."""


def sse_frame(message: Line) -> bytes:
    """One JSON-RPC message as an SSE ``message`` event."""
    return b"event: message\ndata: " + message.rstrip(b"\n") + b"\n\n"


class Exchange:
    """The answer side of one request on ``stream`` (parsed by ``h``)."""

    __slots__ = ("h", "stream")

    def __init__(self, stream: trio.SocketStream, h: h11.Connection) -> None:
        self.stream = stream
        self.h = h

    async def send(
        self,
        status: int,
        body: Line,
        *,
        content_type: bytes = b"text/plain; charset=utf-8",
        headers: Headers | None = None,
        close: bool = False,
    ) -> None:
        """A whole answer."""
        h = self.h
        hdrs: Headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
        hdrs += headers or []
        if close:
            hdrs.append((b"connection", b"close"))
        out = h.send(h11.Response(status_code=status, headers=hdrs)) or b""
        if body:
            out += h.send(h11.Data(data=bytes(body))) or b""
        out += h.send(h11.EndOfMessage()) or b""
        await self.stream.send_all(out)

    async def json(self, status: int, data: Line, headers: Headers | None = None) -> None:
        """A JSON answer (a JSON-RPC message)."""
        await self.send(status, data, content_type=b"application/json", headers=headers)

    async def refuse(self, status: int, body: bytes) -> None:
        """Answer ``status`` and close the connection, after reading (and dropping) what the
        client still sends for a moment, so the answer is not lost to a reset."""
        await self.send(status, body, close=True)
        await linger_close(self.stream)

    async def sse_start(self) -> None:
        """The head of a ``text/event-stream`` answer."""
        headers: Headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
        ]
        await self.stream.send_all(
            self.h.send(h11.Response(status_code=200, headers=headers)) or b""
        )

    async def sse_event(self, message: Line) -> None:
        """One JSON-RPC message on the event stream."""
        await self.stream.send_all(self.h.send(h11.Data(data=sse_frame(message))) or b"")

    async def sse_ping(self) -> None:
        await self.stream.send_all(self.h.send(h11.Data(data=SSE_PING)) or b"")

    async def sse_end(self) -> None:
        await self.stream.send_all(self.h.send(h11.EndOfMessage()) or b"")

    async def sse_answer(self, produce: Produce) -> None:
        """Answer as an event stream: what ``produce`` notifies as it goes, then its answer."""
        # Past a bound of unread progress, a newer progress replaces the one waiting.
        queue = NoticeQueue()

        async def run() -> None:
            try:
                answer = await produce(partial(queue.put, "progress"))
                if answer is not None:
                    queue.put("answer", answer)
            finally:
                queue.close()

        await self.sse_start()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            while (data := await queue.get()) is not None:
                await self.sse_event(data)
        await self.sse_end()

    async def until_gone(self) -> None:
        """Return when the client has closed the connection (or it broke). Bytes it sends
        meanwhile (a pipelined request) are kept for the next cycle, and the watch stops."""
        try:
            data = await self.stream.receive_some(1 << 16)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
        if not data:
            return
        self.h.receive_data(data)
        await trio.sleep_forever()
