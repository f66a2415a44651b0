"""The sidecar's protocol streams: host lines from stdin, protocol lines to the claimed stdout.

# Strategy: stdin is read with ``os.read`` into one :class:`LineBuffer` (no hidden buffer of
# Python's), by the sync :class:`LineReader` (the first, init line; then the thread driver) or by
# :func:`receive_lines` over any stream with ``receive_some`` (the Trio driver's ``FdStream``: no
# thread hop between a line and its task). Both split lines the same way because they share the
# buffer; what the sync reader read beyond the init line is handed on with
# :meth:`LineReader.take_pending`, so no byte is lost between the two. At start the real stdout is
# moved to a private descriptor and fd 1 pointed at stderr (:meth:`ProtocolOutput.claim`), so a
# stray print (or a child process) can never corrupt the protocol; every write to it goes through
# one lock. No trio here: sync-only sidecars use this module too.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import IO, NoReturn, Protocol

READ_CHUNK = 1 << 16


class LineBuffer:
    """Bytes read but not yet handed out, split into ``\\n``-terminated lines."""

    def __init__(self, data: bytes = b"") -> None:
        self._buf = bytearray(data)

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk

    def next_line(self) -> bytes | None:
        """The next complete line with its ``\\n``, or None until more is fed."""
        end = self._buf.find(b"\n")
        if end < 0:
            return None
        line = bytes(self._buf[: end + 1])
        del self._buf[: end + 1]
        return line

    def take(self) -> bytes:
        """Everything not handed out yet (an unterminated rest at EOF), and forget it."""
        data = bytes(self._buf)
        self._buf.clear()
        return data


class LineReader:
    """``\\n``-terminated lines from a file descriptor, read with ``os.read`` (no hidden buffer).

    The first (init) line is read with it; what it read beyond that line is handed to the Trio
    loop with :meth:`take_pending`, so no byte is lost between the two readers.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lines = LineBuffer()

    def readline(self) -> bytes:
        """The next line with its ``\\n`` (the unterminated rest at EOF; ``b""`` after it)."""
        line = self._lines.next_line()
        while line is None:
            chunk = os.read(self.fd, READ_CHUNK)
            if not chunk:
                return self._lines.take()
            self._lines.feed(chunk)
            line = self._lines.next_line()
        return line

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line

    def take_pending(self) -> bytes:
        """Bytes read from the fd but not returned yet (and forget them)."""
        return self._lines.take()


class ChunkStream(Protocol):
    """A stream read in chunks (a Trio ``FdStream``); ``b""`` means EOF."""

    async def receive_some(self, max_bytes: int) -> bytes: ...


async def receive_lines(stream: ChunkStream, pending: bytes) -> AsyncIterator[bytes]:
    """The lines of ``pending`` and then of ``stream`` (the unterminated rest at EOF)."""
    lines = LineBuffer(pending)
    while True:
        line = lines.next_line()
        if line is not None:
            yield line
            continue
        chunk = await stream.receive_some(READ_CHUNK)
        if not chunk:
            if rest := lines.take():
                yield rest
            return
        lines.feed(chunk)


class ProtocolOutput:
    """The protocol stream to the host: the real stdout once claimed, written under one lock."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None
        self._lock = threading.Lock()

    def claim(self) -> None:
        """Move the protocol stream to a private fd; point fd 1 (and ``sys.stdout``) at stderr."""
        sys.stdout.flush()
        proto_fd = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self._file = os.fdopen(proto_fd, "wb", buffering=1 << 16)

    def write(self, data: bytes | bytearray) -> None:
        """Write and flush ``data`` (whole lines); exit at once when the host is gone."""
        out = self._file
        if out is None:
            raise RuntimeError("Sidecar.run() has not claimed stdout")
        with self._lock:
            try:
                out.write(data)
                out.flush()
            except BrokenPipeError:
                os._exit(0)  # the host is gone; nobody is left to answer


def log(sidecar: str, level: str, message: str) -> None:
    """One line on stderr (the host keeps its tail: ``toolhost logs``)."""
    print(f"[{sidecar}] {level}: {message}", file=sys.stderr, flush=True)


def fatal(sidecar: str, message: str) -> NoReturn:
    """Log ``message`` and exit with status 2 (the sidecar cannot serve)."""
    log(sidecar, "error", message)
    sys.exit(2)
