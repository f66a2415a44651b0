"""Admission of client connections: a host-wide cap shared by the Unix socket and the WebSocket.

# Strategy: every accepted connection takes a place in one :class:`ConnectionCount` before it gets
# a session; over ``host.maxConnections`` it is answered with one ``overloaded`` error line (or an
# HTTP 503 carrying the same JSON, for a WebSocket handshake) and closed, so a flood of idle
# clients cannot use up the host's file descriptors (workers need them to start). The cap is
# also held to half the process's open-file limit. When descriptors run out anyway (another
# process of the same user, a low ``ulimit -n``), trio's accept loop backs off on EMFILE/ENFILE
# instead of dying; the connections wait in the listen backlog.
"""

from __future__ import annotations

import logging
import resource

import msgspec
import trio

log = logging.getLogger("toolhost.server")

MIN_CONNECTIONS = 8


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
    return msgspec.json.encode({"id": None, "error": {"code": "overloaded", "message": message}})


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
        return True

    def leave(self) -> None:
        self.live -= 1


async def refuse_stream(stream: trio.SocketStream, cap: int) -> None:
    """Send the ``overloaded`` line (best effort, bounded) and close."""
    with trio.move_on_after(1.0):
        try:
            await stream.send_all(overloaded_line(cap) + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    with trio.CancelScope(shield=True):
        try:
            await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
