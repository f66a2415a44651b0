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

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return the complete lines it finished (without the newline).

        Raises:
            LineTooLong: A line (complete or still growing) is over ``max_line``.
        """
        buf = self._buf
        if not buf:
            # Fast path: most chunks hold whole lines and nothing is pending.
            if data.endswith(b"\n"):
                lines = data.split(b"\n")
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
                raise LineTooLong(f"line longer than {self.max_line} bytes")
            return []
        lines = bytes(buf[:end]).split(b"\n")
        del buf[: end + 1]
        self._scan_from = 0
        self._check(lines)
        if len(buf) > self.max_line:
            raise LineTooLong(f"line longer than {self.max_line} bytes")
        return lines

    def _check(self, lines: list[bytes]) -> None:
        limit = self.max_line
        for line in lines:
            if len(line) > limit:
                raise LineTooLong(f"line of {len(line)} bytes is over the {limit}-byte limit")

    @property
    def pending(self) -> int:
        """Bytes of an unfinished line."""
        return len(self._buf)
