"""Write-through output for non-blocking descriptors (worker stdin pipes, client sockets).

# Strategy: most writes fit in the kernel buffer, so :meth:`DirectWriter.write` tries ``os.write``
# right away on the caller's task - no hop to a writer task, no extra scheduler tick. Only what does
# not fit (a full pipe, a slow client) is queued, and a drain task waits for the descriptor to be
# writable and writes the queue in one go. Order is kept: once something is queued, later writes
# queue behind it. The queue is bounded by the caller through :attr:`pending_bytes`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections import deque
from collections.abc import Awaitable, Callable

import trio

F_SETPIPE_SZ = 1031  # Linux: grow a pipe's buffer (up to /proc/sys/fs/pipe-max-size)


def grow_pipe(fd: int, size: int = 1 << 20) -> None:
    """Ask for a bigger pipe buffer (fewer wake-ups for large payloads); best effort."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, F_SETPIPE_SZ, size)


class DirectWriter:
    """Writes bytes to a non-blocking fd now when possible, later (in order) when not.

    Args:
        fd: The descriptor (already non-blocking; it stays owned by the caller).
        close: Awaited by :meth:`run` after a requested close once everything is written.
    """

    def __init__(self, fd: int, close: Callable[[], Awaitable[object]] | None = None) -> None:
        self.fd = fd
        self._close = close
        self._pending: deque[memoryview] = deque()
        self.pending_bytes = 0
        self._wake = trio.Event()
        self._drained = trio.Event()
        self._closing = False
        self.broken = False

    def write(self, data: bytes) -> None:
        """Write ``data`` now if the descriptor takes it, else queue it (never blocks)."""
        if self.broken or self._closing:
            return
        if not self._pending:
            try:
                n = os.write(self.fd, data)
            except BlockingIOError:
                n = 0
            except OSError:
                self.broken = True
                self._wake.set()
                return
            if n == len(data):
                return
            view = memoryview(data)[n:]
        else:
            view = memoryview(data)
        self._pending.append(view)
        self.pending_bytes += len(view)
        self._wake.set()

    def close_when_drained(self) -> None:
        """Stop accepting writes; :meth:`run` closes the descriptor once the queue is written."""
        self._closing = True
        self._wake.set()

    async def drain(self, timeout_s: float) -> None:
        """Wait (bounded) until nothing is queued."""
        with trio.move_on_after(timeout_s):
            while self._pending and not self.broken:
                self._drained = trio.Event()
                await self._drained.wait()

    async def run(self) -> None:
        """The drain task: writes what :meth:`write` had to queue. Returns when closed or broken."""
        pending = self._pending
        try:
            while not self.broken:
                if not pending:
                    self._drained.set()
                    if self._closing:
                        break
                    self._wake = trio.Event()
                    await self._wake.wait()
                    continue
                await trio.lowlevel.wait_writable(self.fd)
                data = pending[0] if len(pending) == 1 else memoryview(b"".join(pending))
                pending.clear()
                try:
                    n = os.write(self.fd, data)
                except BlockingIOError:
                    n = 0
                except OSError:
                    self.broken = True
                    break
                self.pending_bytes = len(data) - n
                if n < len(data):
                    pending.append(data[n:])
        finally:
            pending.clear()
            self.pending_bytes = 0
            self._drained.set()
            if self._close is not None and (self._closing or self.broken):
                with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await self._close()
