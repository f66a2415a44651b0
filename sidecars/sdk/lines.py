"""Reading the host's lines from stdin without a hidden buffer (no trio: sync sidecars use it)."""

from __future__ import annotations

import os
from collections.abc import Iterator

READ_CHUNK = 1 << 16


class LineReader:
    """``\\n``-terminated lines from a file descriptor, read with ``os.read`` (no hidden buffer).

    The first (init) line is read with it; what it read beyond that line is handed to the Trio
    loop with :meth:`take_pending`, so no byte is lost between the two readers.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = bytearray()

    def readline(self) -> bytes:
        """The next line with its ``\\n`` (the unterminated rest at EOF; ``b""`` after it)."""
        while True:
            end = self._buf.find(b"\n")
            if end >= 0:
                line = bytes(self._buf[: end + 1])
                del self._buf[: end + 1]
                return line
            chunk = os.read(self.fd, READ_CHUNK)
            if not chunk:
                line = bytes(self._buf)
                self._buf.clear()
                return line
            self._buf += chunk

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line

    def take_pending(self) -> bytes:
        """Bytes read from the fd but not returned yet (and forget them)."""
        data = bytes(self._buf)
        self._buf.clear()
        return data
