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
# MessagePack keeps JSON. The host's frames reach the client at once (``FrameLink.on_frame``,
# in the host's task that answers: no scheduler pass per answer); the client's frames still
# go through a channel to this end's reader (its batching, cork and fairness stay, and the
# host is never re-entered from a client's callback).
"""

from __future__ import annotations

import logging
import math

import trio

from supervisor.processes.direct_write import cork, uncork
from supervisor.server.backend import Backend
from supervisor.server.codec import Codec
from supervisor.server.link import FrameLink
from supervisor.server.transport import QueuedTransport

log = logging.getLogger("toolhost.server")


class MemoryConnection(QueuedTransport):
    """Serve one in-process client on a :class:`FrameLink` until it leaves."""

    def __init__(self, backend: Backend, name: str, max_queue_bytes: int = 64 << 20) -> None:
        super().__init__(backend, name, max_queue_bytes)
        self.codec = Codec("json", framed=False)
        self._in_send, self._in_recv = trio.open_memory_channel[bytes](math.inf)
        self.link = FrameLink(self.incoming, self.client_left)

    # the client's side ---------------------------------------------------------------------

    def incoming(self, frame: bytes) -> None:
        try:
            self._in_send.send_nowait(frame)
        except trio.ClosedResourceError:
            pass

    def client_left(self) -> None:
        self._in_send.close()

    # QueuedTransport -----------------------------------------------------------------------

    def send(self, frame: bytes, binary: bool) -> None:
        if self.out.closed:
            return
        try:
            self.link.to_client_now(frame)
        except trio.ClosedResourceError:
            self.gone("the client closed its end")

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
                    await self._reader()
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
                    handle(frame, codec)
            finally:
                uncork()
