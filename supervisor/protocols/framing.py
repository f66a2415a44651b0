"""Newline framing shared by every line-based protocol (process-json, MCP, NDJSON clients)."""

from __future__ import annotations

from supervisor.protocols.errors import LineTooLong

SMALL_PART = 4096
"""An unfinished line's chunks shorter than this are gathered in one buffer (a trickle of
one-byte chunks costs no more memory than the bytes); longer ones are kept as they came."""


class LineSplitter:
    """Accumulates bytes and yields complete ``\\n``-terminated lines.

    Args:
        max_line: Longest line accepted, in bytes, excluding the newline.
    """

    # Strategy: the chunks of an unfinished line are kept as they came (the small ones gathered)
    # and joined once when its newline arrives: a 1 MiB message read in three chunks is copied
    # once, not into a buffer and then out of it.

    __slots__ = ("_parts", "_size", "max_line")

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self._parts: list[bytes | bytearray] = []
        self._size = 0

    def feed(self, data: bytes | bytearray) -> list[bytes]:
        """Add ``data``; return the complete lines it finished (without the newline).

        Raises:
            LineTooLong: A line (complete or still growing) is over ``max_line``.
        """
        parts = self._parts
        if not parts:
            # Fast path: most chunks hold whole lines and nothing is pending.
            if data.endswith(b"\n"):
                lines = (data if type(data) is bytes else bytes(data)).split(b"\n")
                lines.pop()
                self._check(lines)
                return lines
            return self._start(data)
        end = data.find(b"\n")
        if end < 0:
            self._add(data)
            return []
        if self._size + end > self.max_line:  # refused before it is joined
            raise self._too_long(
                f"line of {self._size + end} bytes is over the {self.max_line}-byte limit"
            )
        with memoryview(data) as view, view[:end] as tail:
            first = b"".join([*parts, tail])
        parts.clear()
        self._size = 0
        self._check([first])
        if end + 1 == len(data):
            return [first]
        return [first, *self._start(data[end + 1 :])]

    def _start(self, data: bytes | bytearray) -> list[bytes]:
        """Split ``data`` with nothing pending: its whole lines, and its rest kept."""
        if data.rfind(b"\n") < 0:
            self._add(data)
            return []
        lines = (data if type(data) is bytes else bytes(data)).split(b"\n")
        rest = lines.pop()
        self._check(lines)
        if rest:
            self._add(rest)
        return lines

    def _add(self, data: bytes | bytearray) -> None:
        """Keep ``data`` as part of the unfinished line."""
        parts = self._parts
        if len(data) < SMALL_PART:
            if parts and type(parts[-1]) is bytearray:
                parts[-1] += data
            else:
                parts.append(bytearray(data))
        else:
            parts.append(data if type(data) is bytes else bytes(data))
        self._size += len(data)
        if self._size > self.max_line:
            raise self._too_long(f"line longer than {self.max_line} bytes")

    def _too_long(self, message: str) -> LineTooLong:
        """The error, with the buffer's memory released first: up to ``max_line`` bytes that
        nobody will read, which the connection (kept alive by reference cycles until the
        cyclic collector runs, and by the error's traceback) would otherwise hold on to."""
        self._parts.clear()  # in place: a caller's frame may hold the list
        self._size = 0
        return LineTooLong(message)

    def _check(self, lines: list[bytes]) -> None:
        limit = self.max_line
        for line in lines:
            if len(line) > limit:
                raise self._too_long(f"line of {len(line)} bytes is over the {limit}-byte limit")

    @property
    def pending(self) -> int:
        """Bytes of an unfinished line."""
        return self._size

    def take_pending(self) -> bytes:
        """Remove and return the bytes of the unfinished line (for a framing switch)."""
        data = b"".join(self._parts)
        self._parts = []
        self._size = 0
        return data


class LengthPrefixSplitter:
    """4-byte big-endian length-prefixed frames (the kernel protocol's MessagePack mode).

    Args:
        max_frame: Largest frame body accepted, in bytes.
    """

    __slots__ = ("_buf", "max_frame")

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray) -> list[bytes]:
        """Add ``data``; return the complete frame bodies.

        Raises:
            LineTooLong: A frame header announces more than ``max_frame`` bytes.
        """
        buf = self._buf
        buf += data
        out: list[bytes] = []
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            size = int.from_bytes(buf[pos : pos + 4], "big")
            if size > self.max_frame:
                buf.clear()  # nobody will read it (see LineSplitter._too_long)
                raise LineTooLong(f"frame of {size} bytes is over the {self.max_frame}-byte limit")
            if n - pos - 4 < size:
                break
            out.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)

    def take_pending(self) -> bytes:
        """Remove and return the bytes of an unfinished frame (for a framing switch)."""
        data = bytes(self._buf)
        self._buf.clear()
        return data


def length_prefixed(body: bytes) -> bytes:
    """Frame ``body`` with its 4-byte big-endian length."""
    return len(body).to_bytes(4, "big") + body
