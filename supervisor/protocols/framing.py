"""Newline framing shared by every line-based protocol (process-json, MCP, NDJSON clients)."""

from __future__ import annotations

from supervisor.protocols.errors import LineTooLong


class LineSplitter:
    """Accumulates bytes and yields complete ``\\n``-terminated lines.

    Args:
        max_line: Longest line accepted, in bytes, excluding the newline.
    """

    __slots__ = ("_buf", "_scan_from", "max_line")

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._scan_from = 0

    def feed(self, data: bytes | bytearray) -> list[bytes]:
        """Add ``data``; return the complete lines it finished (without the newline).

        Raises:
            LineTooLong: A line (complete or still growing) is over ``max_line``.
        """
        buf = self._buf
        if not buf:
            # Fast path: most chunks hold whole lines and nothing is pending.
            if data.endswith(b"\n"):
                lines = (data if type(data) is bytes else bytes(data)).split(b"\n")
                lines.pop()
                self._check(lines)
                return lines
            buf += data
        else:
            buf += data
        end = buf.rfind(b"\n", self._scan_from)
        if end < 0:
            self._scan_from = len(buf)
            if len(buf) > self.max_line:
                raise self._too_long(f"line longer than {self.max_line} bytes")
            return []
        # One copy out of the buffer (a memoryview slice, not a bytearray slice then bytes), and
        # none more when it ends a single line (a large message): no split.
        with memoryview(buf) as view, view[:end] as part:
            if buf.find(b"\n", self._scan_from, end) < 0:
                lines = [bytes(part)]
            else:
                lines = bytes(part).split(b"\n")
        del buf[: end + 1]
        self._scan_from = 0
        self._check(lines)
        if len(buf) > self.max_line:
            raise self._too_long(f"line longer than {self.max_line} bytes")
        return lines

    def _too_long(self, message: str) -> LineTooLong:
        """The error, with the buffer's memory released first: up to ``max_line`` bytes that
        nobody will read, which the connection (kept alive by reference cycles until the
        cyclic collector runs, and by the error's traceback) would otherwise hold on to."""
        self._buf.clear()
        self._buf = bytearray()
        self._scan_from = 0
        return LineTooLong(message)

    def _check(self, lines: list[bytes]) -> None:
        limit = self.max_line
        for line in lines:
            if len(line) > limit:
                raise self._too_long(f"line of {len(line)} bytes is over the {limit}-byte limit")

    @property
    def pending(self) -> int:
        """Bytes of an unfinished line."""
        return len(self._buf)

    def take_pending(self) -> bytes:
        """Remove and return the bytes of the unfinished line (for a framing switch)."""
        data = bytes(self._buf)
        self._buf.clear()
        self._scan_from = 0
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
