"""Opening listeners with errors an operator can act on: address, setting, cause and fix.

# Strategy: every failure to listen becomes one :class:`ListenError` whose message names the
# address, the setting it came from, the cause and the fix; callers find it inside trio's
# exception groups (:func:`first_listen_error`) and print that one line, never a group or a
# traceback.
"""

from __future__ import annotations

import errno
import socket

import trio


class ListenError(Exception):
    """A listener could not be opened; ``str()`` is the whole message for the operator."""


def _cause(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host name ({exc.strerror or exc})"
    return exc.strerror or str(exc)


def tcp_error(address: str, setting: str, exc: OSError) -> ListenError:
    """The :class:`ListenError` for a TCP ``address`` (``host:port``) from ``setting``."""
    port = address.rpartition(":")[2]
    fixes = {
        errno.EADDRINUSE: f"another process listens on port {port} (find it with "
        f"`ss -ltnp 'sport = :{port}'`): stop it or set another port in {setting}",
        errno.EADDRNOTAVAIL: f"that address is not on this machine: use 127.0.0.1 or one of "
        f"its addresses in {setting}",
        errno.EACCES: f"ports below 1024 need privileges: use a port of 1024 or above in {setting}",
    }
    fix = fixes.get(exc.errno or 0)
    if fix is None and isinstance(exc, socket.gaierror):
        fix = f"use an IP address or a name this machine resolves in {setting}"
    fix = fix or f"check {setting}"
    return ListenError(f"cannot listen on {address} ({setting}): {_cause(exc)}; {fix}")


async def open_tcp(bind: str, port: int, setting: str) -> list[trio.SocketListener]:
    """``trio.open_tcp_listeners`` with a :class:`ListenError` naming ``setting`` on failure."""
    try:
        return await trio.open_tcp_listeners(port, host=bind)
    except OSError as exc:
        shown = f"[{bind}]:{port}" if ":" in bind else f"{bind}:{port}"
        raise tcp_error(shown, setting, exc) from exc


def unix_error(path: str, setting: str, exc: OSError) -> ListenError:
    """The :class:`ListenError` for a Unix socket ``path`` from ``setting``."""
    cause = _cause(exc)
    if "too long" in str(exc):
        cause = f"the path is {len(path.encode())} bytes, over the 107 a Unix socket may have"
        fix = f"use a shorter {setting} (relative to a shorter app root)"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = f"make its folder writable for this user or set {setting} to a writable place"
    elif exc.errno == errno.EADDRINUSE:
        fix = f"remove the file if nothing serves there, or set another {setting}"
    else:
        fix = f"check {setting}"
    return ListenError(f"cannot listen on {path} ({setting}): {cause}; {fix}")


def first_listen_error(exc: BaseException) -> ListenError | None:
    """The :class:`ListenError` in ``exc`` (itself, or inside an exception group), if any."""
    if isinstance(exc, ListenError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = first_listen_error(inner)
            if found is not None:
                return found
    return None
