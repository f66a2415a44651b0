"""Write-through output for non-blocking descriptors (worker stdin pipes, client sockets).

# Strategy: most writes fit in the kernel buffer, so :meth:`DirectWriter.write` tries ``os.write``
# right away on the caller's task - no hop to a writer task, no extra scheduler tick. Only what does
# not fit (a full pipe, a slow client) is queued, and a drain task waits for the descriptor to be
# writable and writes the queue in one go. Order is kept: once something is queued, later writes
# queue behind it. The queue is bounded by the caller through :attr:`pending_bytes`.
#
# Under load one read often carries many messages (a client pipelining requests, a worker
# answering a batch). While such a chunk is handled the writers are *corked*
# (:func:`cork`/:func:`uncork` around the handling): writes gather in memory and each touched
# writer makes one ``write`` when the chunk is done - one syscall per batch instead of one per
# message, and no task hop either way. A chunk that holds one message has nothing to gather its
# writes with: :func:`one_message` lets them go out at once, before the call stack unwinds to
# the uncork. Bookkeeping that no answer waits for (a finished call's audit record and
# accounting) is handed to :func:`after_flush` and runs at the outermost uncork, in the same
# tick, after those writes: off the path between the worker's answer and the client's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
from collections import deque
from collections.abc import Awaitable, Callable

import trio


def hung_up(fd: int) -> bool:
    """The peer of socket ``fd`` is gone: it hung up entirely (closed, not just shut down its
    sending side) or the connection broke (a reset). A half-close is not a hang-up. For the
    write end of a pipe: its reader closed it."""
    poller = select.poll()
    poller.register(fd, 0)  # POLLHUP and POLLERR are reported whatever the mask
    return bool(poller.poll(0))


async def wait_hung_up(fd: int) -> None:
    """Return once :func:`hung_up` is true for ``fd``, woken by the kernel (an epoll set that
    watches only for that); never returns where there is no epoll."""
    if not hasattr(select, "epoll"):  # pragma: no cover - Linux has it
        await trio.sleep_forever()
    ep = select.epoll()
    try:
        ep.register(fd, 0)  # EPOLLHUP and EPOLLERR only
        while not ep.poll(0):
            await trio.lowlevel.wait_readable(ep.fileno())
    finally:
        ep.close()


F_SETPIPE_SZ = 1031  # Linux: grow a pipe's buffer (up to /proc/sys/fs/pipe-max-size)


async def read_ready(fd: int, nbytes: int) -> bytes:
    """Wait until ``fd`` is readable, then read it once (``b""`` at EOF).

    A trio stream's ``receive_some`` reads first and waits when that fails. On the call path the
    peer almost always answers later (a worker answers after it got the call, a client sends its
    next request after it got the answer), so that first read is a wasted syscall per message:
    waiting first saves it.

    Raises:
        trio.ClosedResourceError: The descriptor was closed while waiting.
        OSError: The read failed (a reset connection, a closed pipe).
    """
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            return os.read(fd, nbytes)
        except BlockingIOError:
            continue


def grow_pipe(fd: int, size: int = 1 << 20) -> None:
    """Ask for a bigger pipe buffer (fewer wake-ups for large payloads); best effort."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, F_SETPIPE_SZ, size)


_corked = 0
_one = False
"""The outermost cork's chunk holds one message: writes go out at once (:func:`one_message`)."""
_touched: list[DirectWriter] = []
_after: list[Callable[[], object]] = []


def cork() -> None:
    """Gather writes until the matching :func:`uncork` (calls nest; a nested cork gathers even
    under :func:`one_message`)."""
    global _corked, _one
    _corked += 1
    if _corked > 1:
        _one = False


def one_message() -> None:
    """The outermost cork's chunk holds one message (one answer, one request): there is nothing
    to gather its writes with, so they go out at once instead of after the call stack has
    unwound to :func:`uncork`; what :func:`after_flush` was handed still waits for the uncork.
    Ignored once something was gathered, or inside a nested cork."""
    global _one
    if _corked == 1 and not _touched:
        _one = True


def uncork() -> None:
    """End a :func:`cork`; the outermost one writes what gathered, one write per writer."""
    global _corked, _one
    _corked -= 1
    if _corked == 0:
        _one = False
        if _touched:
            touched = list(_touched)
            _touched.clear()
            for writer in touched:
                writer._flush_gathered()
        while _after:
            _after.pop(0)()


def after_flush(fn: Callable[[], object]) -> None:
    """Run ``fn`` once the writes gathered so far are out (at the outermost :func:`uncork`, in
    the same tick), or now when not corked: work that must not delay an answer."""
    if _corked:
        _after.append(fn)
    else:
        fn()


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
        self._gathered: list[bytes | bytearray] = []

    def _flush_gathered(self) -> None:
        gathered = self._gathered
        if gathered:
            data = gathered[0] if len(gathered) == 1 else b"".join(gathered)
            gathered.clear()
            self._write_now(data)

    def write(self, data: bytes | bytearray) -> None:
        """Write ``data`` now if the descriptor takes it, else queue it (never blocks); while
        corked, gather it for one write at :func:`uncork`."""
        if self.broken or self._closing:
            return
        if _corked and not _one:
            if not self._gathered:
                _touched.append(self)
            self._gathered.append(data)
            return
        self._write_now(data)

    def _write_now(self, data: bytes | bytearray) -> None:
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
        self._flush_gathered()
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
