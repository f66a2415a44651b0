"""The byte-stream transport (the Unix socket): NDJSON, or MessagePack after ``server.hello``.

# Strategy: one task per connection reads chunks, splits them into frames (NDJSON lines, or
# length-prefixed MessagePack once ``server.hello`` switched the encoding) and hands each to
# the session on the same tick; answers are written through on the answering task
# (``processes/direct_write.py``), corked per read chunk so a burst costs one write. While
# answers pile up for a client past ``pause_bytes`` its frames are not read; EOF after frames
# still gets every answer; a hang-up makes the session decide what runs on
# (``server/transport.py``).
"""

from __future__ import annotations

import logging
import socket
import struct
from typing import Any

import msgspec
import trio

from supervisor.processes.direct_write import DirectWriter, cork, one_message, read_ready, uncork
from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.framing import LengthPrefixSplitter, LineSplitter, length_prefixed
from supervisor.server.admission import ConnectionCount
from supervisor.server.adopt import ENDED, Adopter, AdoptRefused, serve_adopted
from supervisor.server.backend import Backend
from supervisor.server.codec import Codec, Encoding
from supervisor.server.transport import QueuedTransport

log = logging.getLogger("toolhost.server")

RECV_CHUNK = 1 << 16


class ConnectionLimits(msgspec.Struct, kw_only=True):
    max_frame: int = 16 * 1024 * 1024
    max_queue_bytes: int = 64 * 1024 * 1024
    """Answers waiting for a client past this: it is disconnected (a last resort)."""
    pause_bytes: int = 1024 * 1024
    """Answers waiting for a client past this: its frames are not read until they are written."""
    max_connections: int = 1024
    count: ConnectionCount | None = None
    """Shared by every transport of a host (made from ``max_connections`` when absent)."""

    def connections(self) -> ConnectionCount:
        """The shared live-connection count (created on first use)."""
        if self.count is None:
            self.count = ConnectionCount(self.max_connections)
        return self.count


def peer_credentials(stream: trio.abc.Stream) -> tuple[int, int] | None:
    """The peer's ``(pid, uid)`` from SO_PEERCRED (None: not a Unix socket, or unknown)."""
    sock = getattr(stream, "socket", None)
    if sock is not None and hasattr(socket, "SO_PEERCRED"):
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return None
        pid, uid, _gid = struct.unpack("3i", raw)
        return pid, uid
    return None


def peer_name(stream: trio.abc.Stream, transport: str) -> str:
    """``unix:pid=1234,uid=1000`` from SO_PEERCRED when available."""
    cred = peer_credentials(stream)
    if cred is None:
        return transport
    return f"{transport}:pid={cred[0]},uid={cred[1]}"


class StreamConnection(QueuedTransport):
    """Serve one client on a socket stream until it leaves."""

    def __init__(
        self,
        backend: Backend,
        stream: trio.SocketStream,
        *,
        limits: ConnectionLimits | None = None,
        name: str = "unix",
    ) -> None:
        self.stream = stream
        self.limits = limits or ConnectionLimits()
        super().__init__(backend, name, self.limits.max_queue_bytes)
        self.codec = Codec("json")
        self._lines: LineSplitter | None = LineSplitter(self.limits.max_frame)
        self._frames: LengthPrefixSplitter | None = None
        self._switch_to: Encoding | None = None
        # Write-through: answers go out on the answering task, no writer hop (the drain task
        # only writes what the socket buffer could not take).
        self._direct = DirectWriter(stream.socket.fileno())
        self.pauses = 0
        """Times reading stopped because answers were piling up (for tests and stats)."""
        self._adoption: tuple[Adopter, Any] | None = None

    def send(self, frame: bytes, binary: bool) -> None:
        direct = self._direct
        if self.out.closed:
            return
        direct.write(frame)
        if direct.broken:
            self.disconnect("write failed")
        elif direct.pending_bytes > self.limits.max_queue_bytes:
            self.disconnect(
                f"client is not reading: over {self.limits.max_queue_bytes} bytes queued"
            )

    def switch_encoding(self, encoding: str) -> Codec:
        self._switch_to = "msgpack" if encoding == "msgpack" else "json"
        return Codec(self._switch_to)

    def adopt(self, adopter: Adopter, checked: Any) -> None:
        """``mcp.adopt`` accepted: take a place among the adopted sessions; the reader stops
        after this frame and the descriptors are received next (``server/adopt.py``)."""
        if self._adoption is not None:
            raise AdoptRefused("invalid-request", "this connection already adopted a session")
        adopter.enter()
        self._adoption = (adopter, checked)

    # running -----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self.session.attach(nursery)
                nursery.start_soon(self._direct.run)
                with trio.CancelScope() as self._scope:  # disconnect() stops the reading
                    if await self._reader():  # a half-close: the client still reads
                        await self.finish(self.stream.socket.fileno(), self._flushed)
                    elif self._adoption is not None and not self.out.closed:
                        await self._serve_adopted(*self._adoption)
                await self.session.leave(self.close_reason or "the client closed its end")
                nursery.cancel_scope.cancel()  # the client left: cancel the rest
        finally:
            if self._adoption is not None:
                self._adoption[0].leave()
            self.session.close()
            with trio.CancelScope(shield=True):
                try:
                    await self.stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass

    async def _serve_adopted(self, adopter: Adopter, checked: Any) -> None:
        """The stdio MCP session handed over with ``mcp.adopt``, until it ends or the client
        goes; then ``mcp.adopt.ended`` and every answer is written."""
        codec = self.codec

        def send_end(reason: str, error: str | None) -> None:
            data = {"reason": reason} if error is None else {"reason": reason, "error": error}
            self.send(codec.event(ENDED, data), codec.binary)

        sock = self.stream.socket
        await serve_adopted(adopter, checked, sock, send_end, self.session.client_name)
        with trio.move_on_after(5):
            await self._flushed()

    async def _flushed(self) -> None:
        """Every answer queued so far is written (or the writes failed)."""
        direct = self._direct
        while direct.pending_bytes and not direct.broken and not self.out.closed:
            await direct.drain(timeout_s=60.0)

    async def _reader(self) -> bool:
        """Read and handle frames; True when the client half-closed (EOF), False when it is
        gone or was disconnected."""
        fd = self.stream.socket.fileno()
        session = self.session
        handle = session.handle
        direct = self._direct
        pause = self.limits.pause_bytes
        while not self.out.closed:
            if direct.pending_bytes > pause:
                await self._paused()
            try:
                data = await read_ready(fd, RECV_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return False
            if not data:
                return True
            too_long: LineTooLong | None = None
            cork()  # answers and worker writes of this chunk go out in one write each
            try:
                frames = self._feed(data)
                if len(frames) == 1:
                    one_message()  # its answer, or its call to a worker, goes out at once
                i = 0
                while i < len(frames):
                    frame = frames[i]
                    i += 1
                    if self._lines is not None and not frame.strip():
                        continue
                    if session.full:  # fairness: no more frames until one of its calls ends
                        uncork()
                        try:
                            await session.wait_room()
                        finally:
                            cork()
                    handle(frame, self.codec)
                    if self._adoption is not None:  # the descriptors come next, no frame
                        if i < len(frames) or self._pending():
                            self.disconnect("frames after mcp.adopt")
                        break
                    if self._switch_to is not None:
                        frames = self._apply_switch(frames[i:])
                        i = 0
            except LineTooLong as exc:
                too_long = exc
            finally:
                uncork()
            if too_long is not None:
                self.send(
                    self.codec.error(
                        None, "invalid-request", f"frame too large: {too_long.message}"
                    ),
                    self.codec.binary,
                )
                await self._direct.drain(timeout_s=1.0)
                self.disconnect("oversized frame")
                return False
            if self._adoption is not None:
                return False
        return False

    def _pending(self) -> bool:
        """Bytes of an unfinished frame wait in the splitter."""
        splitter = self._lines if self._lines is not None else self._frames
        return splitter is not None and bool(splitter.take_pending())

    async def _paused(self) -> None:
        """The client is not reading its answers: read none of its frames until they are out."""
        direct = self._direct
        self.pauses += 1
        while direct.pending_bytes and not direct.broken and not self.out.closed:
            await direct.drain(timeout_s=60.0)

    def _feed(self, data: bytes | bytearray) -> list[bytes]:
        if self._lines is not None:
            return self._lines.feed(data)
        assert self._frames is not None
        return self._frames.feed(data)

    def _apply_switch(self, rest: list[bytes]) -> list[bytes]:
        """Switch framing after ``server.hello``; re-feed the bytes that followed the hello."""
        target = self._switch_to or "json"
        self._switch_to = None
        if target == self.codec.encoding:
            return rest
        if self._lines is not None:
            leftover = b"".join(f + b"\n" for f in rest) + self._lines.take_pending()
            self._lines, self._frames = None, LengthPrefixSplitter(self.limits.max_frame)
        else:
            assert self._frames is not None
            leftover = b"".join(length_prefixed(f) for f in rest) + self._frames.take_pending()
            self._lines, self._frames = LineSplitter(self.limits.max_frame), None
        self.codec = Codec(target)
        return self._feed(leftover) if leftover else []
