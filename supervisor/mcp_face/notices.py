"""Server-initiated MCP messages for a client that does not read: coalesced, never piled up.

# Strategy: every notification the face sends on its own (``notifications/*/list_changed``,
# ``notifications/resources/updated``, ``notifications/progress``) is a hint that a later one of
# the same kind supersedes: the list changed again, the resource changed again, the call got
# further. While the client leaves more than ``limit`` bytes unread, a new notification is held
# under its key (the kind, the listen stream, the URI, the progress token) instead of queued: a
# second one with the same key replaces the first, so what is held is bounded by the distinct
# keys (the lists, the URIs the client subscribed, its calls in flight), however fast a hosted
# server sends. Once the client has read the backlog down to ``limit``, the held ones go out, in
# the order they were first held. Without this, a hosted server sending updates to a client that
# stopped reading its stdout grew the face's queue (in the host's process, for an adopted or
# embedded session) without bound: the answers were bounded (stdin is not read past
# ``PAUSE_BYTES``), the notifications were not.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable

import trio

from supervisor.processes.direct_write import DirectWriter
from supervisor.protocols.mcp_server import Line

PAUSE_BYTES = 4 << 20
"""Answers waiting for an MCP client that does not read its stdout past this: stdin is not read
until they are written, and notifications are coalesced (:class:`Notices`)."""

_DRAIN_WAIT_S = 60.0


class _Held:
    """What is held by key once a client is behind, and how many a later one replaced."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[Hashable, Line] = {}
        self.coalesced = 0
        """Notifications replaced by a later one with the same key before the client read it."""

    @property
    def held(self) -> int:
        return len(self._held)

    def _hold(self, key: Hashable, data: Line) -> None:
        if key in self._held:
            self.coalesced += 1
        self._held[key] = data  # a replaced key keeps its place


class Notices(_Held):
    """Notifications to one stdio client, written through ``out`` or held by key.

    Args:
        out: The client's stdout writer.
        nursery: Where the task that writes the held ones runs (started when one is held).
        limit: Unread bytes past which notifications are held.
    """

    def __init__(self, out: DirectWriter, nursery: trio.Nursery, limit: int = PAUSE_BYTES) -> None:
        super().__init__(limit)
        self.out = out
        self._nursery = nursery
        self._flushing = False

    def send(self, key: Hashable, data: Line) -> None:
        """Write notification ``data`` now, or hold it under ``key`` while the client is behind
        (behind a held one too: they stay in order)."""
        out = self.out
        if not self._held and out.pending_bytes <= self.limit:
            out.write(data)
            return
        self._hold(key, data)
        if not self._flushing:
            self._flushing = True
            self._nursery.start_soon(self._flush)

    def drop(self, key: Hashable) -> None:
        """Forget what is held under ``key`` (a call's progress, once its answer goes out)."""
        self._held.pop(key, None)

    async def _flush(self) -> None:
        out = self.out
        try:
            while self._held and not out.broken:
                while out.pending_bytes > self.limit and not out.broken:
                    await out.drain(timeout_s=_DRAIN_WAIT_S)
                held, self._held = self._held, {}
                for data in held.values():
                    out.write(data)
        finally:
            self._flushing = False


class NoticeQueue(_Held):
    """Notifications waiting for one event stream (an HTTP client's ``GET`` stream, a
    ``subscriptions/listen`` stream, a call's progress): in order while less than ``limit``
    bytes wait; past that, held by key as :class:`Notices` does (a new one replaces a held one
    with the same key, keeping its place), so a stream that is not read holds at most
    ``limit`` bytes and one notification per key."""

    def __init__(self, limit: int = PAUSE_BYTES) -> None:
        super().__init__(limit)
        self._fifo: collections.deque[Line] = collections.deque()
        self._bytes = 0
        self._ready = trio.Event()
        self.closed = False

    def put(self, key: Hashable, data: Line) -> None:
        """Queue ``data`` (``key``: what a later one replaces while the stream is behind).

        Raises:
            trio.ClosedResourceError: The stream ended.
        """
        if self.closed:
            raise trio.ClosedResourceError("the stream ended")
        if not self._held and self._bytes <= self.limit:
            self._fifo.append(data)
            self._bytes += len(data)
        else:
            self._hold(key, data)
        self._ready.set()

    def close(self) -> None:
        """No more notifications: :meth:`get` returns None once the waiting ones are taken."""
        self.closed = True
        self._ready.set()

    async def get(self) -> Line | None:
        """The oldest waiting notification; None once closed and empty."""
        while not self._fifo and not self._held:
            if self.closed:
                return None
            self._ready = trio.Event()
            await self._ready.wait()
        if self._fifo:
            data = self._fifo.popleft()
            self._bytes -= len(data)
            return data
        return self._held.pop(next(iter(self._held)))
