"""Admission of client connections: a host-wide cap shared by the Unix socket and the WebSocket.

# Strategy: every accepted connection takes a place in one :class:`ConnectionCount` before it gets
# a session; over ``host.maxConnections`` it is answered with one ``overloaded`` error line (or an
# HTTP 503 carrying the same JSON, for a WebSocket handshake) and closed, so a flood of idle
# clients cannot use up the host's file descriptors (workers need them to start). The cap is
# also held to half the process's open-file limit. When descriptors run out anyway (another
# process of the same user, a low ``ulimit -n``), the accept loop (:func:`serve_listeners`, used
# by every listener: the socket, the gateway, ``toolhost mcp --http``) backs off on EMFILE/ENFILE
# instead of dying, and says so once per :data:`ACCEPT_LOG_INTERVAL_S`, not once per retry; the
# connections wait in the listen backlog.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import logging
import os
import resource
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio

log = logging.getLogger("toolhost.server")

MIN_CONNECTIONS = 8
TRIM_AFTER = 256
"""Connections that must have left (and half of the most there were) before memory is trimmed."""
TRIM_DELAY_S = 0.5
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
"""accept(2) failures that mean "no room now": wait and retry, the client waits in the backlog."""
ACCEPT_RETRY_S = 0.1
ACCEPT_LOG_INTERVAL_S = 10.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


_TRIM = _malloc_trim()


def rss_mb() -> float:
    """This process's resident set size in MB (0 where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / (1024 * 1024)
    except (OSError, ValueError, IndexError):
        return 0.0


def release_memory() -> None:
    """Collect the cycles closed connections left (trio tasks, nurseries, tracebacks) and
    return the freed heap to the system (glibc ``malloc_trim``), so RSS goes back down after a
    flood of clients or an oversized frame instead of staying at its peak."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)


def effective_cap(configured: int) -> int:
    """``configured``, held to half the soft ``RLIMIT_NOFILE`` (the rest is for workers)."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return configured
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(MIN_CONNECTIONS, min(configured, soft // 2))


def overloaded_line(cap: int) -> bytes:
    """The one frame a refused client gets (NDJSON, as the socket's default encoding)."""
    message = f"too many client connections (the host serves at most {cap}); try again later"
    return refusal_line("overloaded", message)


class ConnectionCount:
    """Live connections against a cap (one instance shared by every transport of a host).

    Args:
        cap: The configured ``host.maxConnections`` (see :func:`effective_cap`).
    """

    def __init__(self, cap: int = 1024) -> None:
        self.cap = effective_cap(cap)
        if self.cap < cap:
            log.info("client connections capped at %d (half the open-file limit)", self.cap)
        self.live = 0
        self.peak = 0
        self.refused = 0
        self._high = 0
        """Most connections since memory was last handed back."""
        self.trims = 0
        self.departures = 0
        self._trim_wanted = trio.Event()
        self._trimmer = False

    def try_enter(self) -> bool:
        """Take a place; False (and counted as refused) when the cap is reached."""
        if self.live >= self.cap:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning(
                    "refused a client connection: %d connections is the cap (%d refused so far)",
                    self.cap,
                    self.refused,
                )
            return False
        self.live += 1
        self.peak = max(self.peak, self.live)
        self._high = max(self._high, self.live)
        return True

    def leave(self) -> None:
        """Give the place back; after many clients left, have their memory handed back too."""
        self.live -= 1
        self.departures += 1
        if self._high - self.live >= TRIM_AFTER and self.live * 2 <= self._high:
            self._trim_wanted.set()

    async def trimmer(self) -> None:
        """Hand memory back once a crowd of clients has left (a moment later, so the last
        connections' tasks are gone too); run by the first transport that starts."""
        if self._trimmer:
            return
        self._trimmer = True
        try:
            while True:
                await self._trim_wanted.wait()
                # Wait until the crowd has finished leaving: a connection still open when the
                # heap is trimmed pins pages it shares with those that left.
                seen = -1
                while seen != self.departures:
                    seen = self.departures
                    await trio.sleep(TRIM_DELAY_S)
                self._trim_wanted = trio.Event()
                left = self._high - self.live
                self._high = self.live
                self.trims += 1
                before = rss_mb()
                release_memory()
                log.info(
                    "%d clients left: memory handed back, RSS %.1f -> %.1f MB",
                    left,
                    before,
                    rss_mb(),
                )
        finally:
            self._trimmer = False


def refusal_line(code: str, message: str) -> bytes:
    """The one frame a client refused at the door gets (NDJSON)."""
    return msgspec.json.encode({"id": None, "error": {"code": code, "message": message}})


async def refuse_stream(stream: trio.SocketStream, cap: int, line: bytes | None = None) -> None:
    """Send the ``overloaded`` line, or ``line`` (best effort, bounded), and close."""
    with trio.move_on_after(1.0):
        try:
            await stream.send_all((line or overloaded_line(cap)) + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    await close_quietly(stream)


async def close_quietly(stream: trio.abc.AsyncResource) -> None:
    """Close ``stream`` even inside a cancelled scope; a peer already gone is no error."""
    with trio.CancelScope(shield=True):
        try:
            await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass


class AcceptFailures:
    """Counts accept(2) capacity failures of one listener and logs them at most once per
    ``interval_s`` (the loop retries every :data:`ACCEPT_RETRY_S`: one line per retry would be ten
    a second, each with a traceback, as trio's own loop does)."""

    def __init__(self, what: str, interval_s: float = ACCEPT_LOG_INTERVAL_S) -> None:
        self.what = what
        self.interval_s = interval_s
        self.total = 0
        self.logged = 0
        """Lines written (for tests)."""
        self._unlogged = 0
        self._last: float | None = None

    def failed(self, exc: OSError, now: float) -> None:
        self.total += 1
        self._unlogged += 1
        if self._last is not None and now - self._last < self.interval_s:
            return
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        log.warning(
            "%s cannot accept connections: %s (%s); they wait in the listen backlog, retrying "
            "every %.1f s (%d failed accepts since the last such line; logged once per %.0f s)",
            self.what,
            name,
            os.strerror(exc.errno or 0),
            ACCEPT_RETRY_S,
            self._unlogged,
            self.interval_s,
        )
        self.logged += 1
        self._unlogged = 0
        self._last = now


async def _accept_loop(
    listener: trio.SocketListener,
    handler: Callable[[trio.SocketStream], Awaitable[Any]],
    nursery: trio.Nursery,
    failures: AcceptFailures,
) -> None:
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                failures.failed(exc, trio.current_time())
                await trio.sleep(ACCEPT_RETRY_S)
            else:
                nursery.start_soon(_run_handler, stream, handler)


async def _run_handler(
    stream: trio.SocketStream, handler: Callable[[trio.SocketStream], Awaitable[Any]]
) -> None:
    try:
        await handler(stream)
    finally:
        await trio.aclose_forcefully(stream)


async def serve_listeners(
    handler: Callable[[trio.SocketStream], Awaitable[Any]],
    listeners: list[trio.SocketListener],
    *,
    what: str = "the host",
    failures: AcceptFailures | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """:func:`trio.serve_listeners` with the EMFILE/ENFILE back-off logged once per interval
    (``failures``, shared by the listeners, made from ``what`` when absent); runs until
    cancelled, one task per connection."""
    failures = failures or AcceptFailures(what)
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_accept_loop, listener, handler, nursery, failures)
        task_status.started()
