"""An in-memory kernel connection for a client in the host's own process (the MCP face).

# Strategy: ``toolhost mcp --embedded`` and the stdio sessions ``toolhost serve`` adopts run the
# MCP face in the host's process; their kernel connection was a socketpair, so every frame went
# through two syscalls, the kernel's copies and a line splitter on each side (a 1 MiB read in
# ~16 writes and reads). Here the two ends hand each other whole frames (``bytes``) through
# memory channels: the host side is a :class:`MemoryConnection` (a ``QueuedTransport`` like the
# socket's, with the same :class:`~supervisor.server.session.Session`, so every gate and every
# rule of a client leaving apply), the client side a :class:`FrameLink` (``server/link.py``)
# the kernel client (``supervisor/client.py``) speaks on. Frames stay JSON (the method table
# decodes them as for any client). The link closing is the client hanging up: the session
# decides what still runs (``Session.leave``), then the host's end closes and the client's
# pending requests fail with ``ConnectionLost``. JSON only: a ``server.hello`` asking for
# MessagePack keeps JSON. No scheduler pass per frame either way: the host's answers reach
# the client at once (``FrameLink.on_frame``, in the host's task that ends the call), and a
# client's frame is handled at once in the client's task (``incoming``, in the reader's
# context, corked), unless frames wait ahead of it, the client is at its cap (the reader's
# fairness), or it comes from inside the handling of another (an answer's callback sending a
# request): then it goes through the channel to the reader, in order, and the host is never
# re-entered. Both ends share the process, so two things cross without bytes: a request the
# client built as the method's params struct (``tools.invoke`` from the MCP face: no encode in
# the client, no decode here; :class:`LinkCodec`), and a response the client asked for as an
# object (the call's envelope: no encode here, no decode there; ``FrameLink.answer_now``).
# What does not cross as an object is the same frame a socket carries.
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from supervisor.contracts.rpc import RequestId
from supervisor.processes.direct_write import cork, one_message, uncork
from supervisor.server.backend import Backend
from supervisor.server.codec import Codec
from supervisor.server.link import FrameLink, Outgoing
from supervisor.server.transport import QueuedTransport

log = logging.getLogger("toolhost.server")

T = TypeVar("T")


class LinkCodec(Codec):
    """JSON, and params a client in this process handed over decoded: a request's ``params``
    that is already the method's params struct is taken as it is (the client built it, typed,
    in this process: nothing to check that a decode would)."""

    def __init__(self) -> None:
        super().__init__("json", framed=False)

    def params(self, raw: Any, tp: type[T]) -> T:
        if type(raw) is tp:
            result: T = raw
            return result
        return super().params(raw, tp)


class MemoryConnection(QueuedTransport):
    """Serve one in-process client on a :class:`FrameLink` until it leaves."""

    def __init__(self, backend: Backend, name: str, max_queue_bytes: int = 64 << 20) -> None:
        super().__init__(backend, name, max_queue_bytes)
        self.codec: Codec = LinkCodec()
        self._in_send, self._in_recv = trio.open_memory_channel[Outgoing](math.inf)
        self.link = FrameLink(self.incoming, self.client_left)
        self._context: contextvars.Context | None = None
        """The reader's context, while it reads: a frame handled at once runs in it."""
        self._waiting = 0
        """Frames sent to the reader and not handled yet (a frame behind one waits too)."""
        self._handling = False
        """A frame is being handled, or an answer delivered: a frame the client sends from
        inside (a callback) is queued, never handled re-entrantly."""

    # the client's side ---------------------------------------------------------------------

    def incoming(self, frame: Outgoing) -> None:
        """One frame from the client: handled at once, in the client's task (no pass through
        the reader task), when the reader runs, nothing waits ahead of it, the client is under
        its cap and this is not a frame sent from inside the handling of another (an answer's
        callback); else queued for the reader, in order."""
        context = self._context
        if context is not None and not self._waiting and not self._handling:
            session = self.session
            if not session.full and not self.out.closed:
                self._handling = True
                cork()
                one_message()  # one frame: its call to a worker goes out at once
                try:
                    context.run(session.handle, frame, self.codec)
                finally:
                    self._handling = False
                    uncork()
                return
        try:
            self._in_send.send_nowait(frame)
        except trio.ClosedResourceError:
            return
        self._waiting += 1

    def client_left(self) -> None:
        self._in_send.close()

    # QueuedTransport -----------------------------------------------------------------------

    def send(self, frame: bytes, binary: bool) -> None:
        self._to_client(self.link.to_client_now, frame)

    def send_result(self, request_id: RequestId, result: Any, codec: Codec) -> None:
        def frame() -> bytes:
            return codec.response(request_id, result)

        self._to_client(self.link.answer_now, request_id, result, frame)

    def _to_client(self, hand: Callable[..., None], *args: Any) -> None:
        if self.out.closed:
            return
        handling = self._handling
        self._handling = True  # what the client's callbacks send from here is queued
        try:
            hand(*args)
        except trio.ClosedResourceError:
            self.gone("the client closed its end")
        finally:
            self._handling = handling

    def switch_encoding(self, encoding: str) -> Codec:
        if encoding != "json":
            log.warning("%s: an in-memory connection stays JSON", self.session.client_name)
        return self.codec

    # running -------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self.session.attach(nursery)
                with trio.CancelScope() as self._scope:  # disconnect() stops the reading
                    self._context = contextvars.copy_context()
                    try:
                        await self._reader()
                    finally:
                        self._context = None
                await self.session.leave(self.close_reason or "the client closed its end")
                nursery.cancel_scope.cancel()
        finally:
            self.session.close()
            self.out.closed = True
            self.link.to_client.close()

    async def _reader(self) -> None:
        recv = self._in_recv
        session = self.session
        handle = session.handle
        codec = self.codec
        while not self.out.closed:
            try:
                batch = [await recv.receive()]
            except trio.EndOfChannel:
                return
            while True:
                try:
                    batch.append(recv.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            cork()  # answers and worker writes of this batch go out in one write each
            if len(batch) == 1:
                one_message()
            try:
                for frame in batch:
                    if session.full:  # fairness, as on the socket
                        uncork()
                        try:
                            await session.wait_room()
                        finally:
                            cork()
                    if self.out.closed:
                        return
                    self._handling = True
                    try:
                        handle(frame, codec)
                    finally:
                        self._handling = False
                        self._waiting -= 1
            finally:
                uncork()
