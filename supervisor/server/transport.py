"""The bounded outbound side every kernel transport shares, and how it notices a client gone.

# Strategy: a transport (``stream.py`` for the Unix socket, ``ws.py`` for the WebSocket) is a
# :class:`QueuedTransport`: it owns one :class:`~supervisor.server.session.Session`, hands it
# every complete frame, and writes what the session sends from one bounded :class:`OutQueue`; a
# client that stops reading is disconnected instead of making the host buffer without bound. A
# client that half-closes (EOF) still gets every answer (:meth:`QueuedTransport.finish`); only a
# client that is gone (a hang-up or reset seen on the socket: :func:`hung_up`, a failed write,
# a disconnect) makes the transport let :meth:`Session.leave` decide what still runs.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from supervisor.contracts.rpc import RequestId
from supervisor.processes.direct_write import hung_up, wait_hung_up
from supervisor.server.adopt import Adopter, AdoptRefused
from supervisor.server.backend import Backend
from supervisor.server.codec import Codec
from supervisor.server.session import Session

log = logging.getLogger("toolhost.server")


class OutQueue:
    """Frames waiting to be written, bounded in bytes.

    Args:
        limit: Bytes that may wait; past it ``on_overflow`` is called (the client is too slow).
        on_overflow: Called once with a reason when the bound is passed.
    """

    def __init__(self, limit: int, on_overflow: Callable[[str], None]) -> None:
        self.limit = limit
        self._items: deque[tuple[bytes, bool]] = deque()
        self._bytes = 0
        self._ready = trio.Event()
        self._drained = trio.Event()
        self._busy = False
        self._on_overflow = on_overflow
        self.closed = False

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def put(self, frame: bytes, binary: bool) -> None:
        if self.closed:
            return
        self._items.append((frame, binary))
        self._bytes += len(frame)
        if self._bytes > self.limit:
            self.closed = True
            self._on_overflow(f"client is not reading: over {self.limit} bytes queued")
            return
        self._ready.set()

    async def take(self) -> list[tuple[bytes, bool]]:
        """Everything queued (waits for at least one frame); marks the writer busy."""
        while not self._items:
            self._ready = trio.Event()
            await self._ready.wait()
        items = list(self._items)
        self._items.clear()
        self._bytes = 0
        self._busy = True
        return items

    def written(self) -> None:
        self._busy = False
        if not self._items:
            self._drained.set()

    async def drain(self, timeout_s: float) -> None:
        """Wait (bounded) until everything queued has been written."""
        with trio.move_on_after(timeout_s):
            while self._items or self._busy:
                self._drained = trio.Event()
                await self._drained.wait()


class QueuedTransport:
    """Shared by the transports: a session, a bounded outbound queue, and a disconnect that
    stops the reading (the transport sets ``_scope`` around its reader, then lets the session
    finish what changes state and cancels the rest)."""

    def __init__(self, backend: Backend, name: str, max_queue_bytes: int) -> None:
        self.session = Session(backend, self, name)
        self.out = OutQueue(max_queue_bytes, self.disconnect)
        self._scope: trio.CancelScope | None = None
        self.close_reason = ""

    def send(self, frame: bytes, binary: bool) -> None:
        self.out.put(frame, binary)

    def send_result(self, request_id: RequestId, result: Any, codec: Codec) -> None:
        """The response to ``request_id`` (encoded here; an in-memory connection may hand the
        object over instead)."""
        self.send(codec.response(request_id, result), codec.binary)

    def disconnect(self, reason: str) -> None:
        if not self.close_reason:
            self.close_reason = reason
            log.warning("disconnecting %s: %s", self.session.client_name, reason)
        self.out.closed = True
        if self._scope is not None:
            self._scope.cancel()

    def gone(self, reason: str) -> None:
        """The client is gone (it hung up, the connection broke): stop as :meth:`disconnect`
        does, without its warning (hanging up is what clients do)."""
        if not self.close_reason:
            self.close_reason = reason
        self.out.closed = True
        if self._scope is not None:
            self._scope.cancel()

    async def finish(self, fd: int, flushed: Callable[[], Awaitable[None]]) -> None:
        """The client half-closed (EOF) after its frames: answer every request already read,
        wait for ``flushed`` (the answers written), then return so the transport closes. A
        hang-up or reset of socket ``fd`` meanwhile makes the client :meth:`gone` (the
        transport then lets :meth:`Session.leave` decide what still runs)."""
        if hung_up(fd):
            self.gone("the client closed its end")
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_hangup, fd)
            await self.session.answered()
            await flushed()
            nursery.cancel_scope.cancel()

    async def _watch_hangup(self, fd: int) -> None:
        await wait_hung_up(fd)
        self.gone("the client hung up")

    def adopt(self, adopter: Adopter, checked: Any) -> None:
        """``mcp.adopt``: only the Unix socket can carry descriptors (``stream.py``)."""
        raise AdoptRefused("unsupported", "mcp.adopt needs the host's Unix socket")

    def switch_encoding(self, encoding: str) -> Codec:  # pragma: no cover - overridden
        raise NotImplementedError

    def backlog(self) -> int:
        """Bytes waiting to be written to the client."""
        return self.out.queued_bytes

    async def wait_backlog(self, limit: int) -> None:
        """Return once at most ``limit`` bytes wait to be written (or the client is gone)."""
        out = self.out
        while out.queued_bytes > limit and not out.closed:
            await out.drain(timeout_s=1.0)
