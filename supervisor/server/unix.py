"""The Unix domain socket transport: a private socket (0600 inside a 0700 folder).

# Strategy: the socket is bound with the umask that makes it 0600 from its first instant, in a
# folder tightened to 0700 when it is a dedicated one; a stale socket is removed, a live one
# (another host answers) refuses the start with one line. Every accepted connection takes a
# place in the host-wide count (``server/admission.py``) before it gets a
# :class:`~supervisor.server.stream.StreamConnection`; the socket file goes when serving ends.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket as stdsocket
import stat
from functools import partial

import trio

from supervisor.server.admission import refusal_line, refuse_stream, serve_listeners
from supervisor.server.backend import Backend
from supervisor.server.listen import ListenError, unix_error
from supervisor.server.stream import (
    ConnectionLimits,
    StreamConnection,
    peer_credentials,
    peer_name,
)

log = logging.getLogger("toolhost.server")


class SocketInUse(ListenError):
    """Another host already answers on the socket path."""


def _prepare_dir(path: str) -> None:
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
        return
    st = os.stat(folder)
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
        # A folder we own that others can enter: tighten it when it is a dedicated one.
        if os.path.basename(folder).startswith("."):
            os.chmod(folder, 0o700)
        else:
            log.warning(
                "socket folder %s is accessible to others; the socket itself is 0600", folder
            )


def check_free(path: str, setting: str = "host.socket") -> None:
    """Remove a stale socket at ``path``; raise :class:`SocketInUse` if a host answers there
    (or a :class:`ListenError` when the path cannot be probed)."""
    if not os.path.exists(path):
        return
    probe = stdsocket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        raise unix_error(path, setting, exc) from exc
    else:
        raise SocketInUse(
            f"cannot listen on {path} ({setting}): another toolhost is already serving there; "
            f"stop it first (`toolhost status` shows it), or give this one another {setting}"
        )
    finally:
        probe.close()


async def bind_unix(path: str, setting: str = "host.socket") -> trio.SocketListener:
    """Create the listening socket with mode 0600 (atomically, via the umask).

    Raises:
        ListenError: The path is taken, too long, or in a folder this user cannot write.
    """
    try:
        _prepare_dir(path)
        check_free(path, setting)
        sock = trio.socket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            await sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(256)
    except OSError as exc:
        raise unix_error(path, setting, exc) from exc
    return trio.SocketListener(sock)


async def serve_unix(
    backend: Backend,
    path: str,
    *,
    limits: ConnectionLimits | None = None,
    listener: trio.SocketListener | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the kernel protocol on ``path`` until cancelled (on ``listener`` when it was bound
    before, else binding it here); removes the socket on exit."""
    limits = limits or ConnectionLimits()
    count = limits.connections()
    if listener is None:
        listener = await bind_unix(path)
    ino = os.stat(path).st_ino

    async def handler(stream: trio.SocketStream) -> None:
        if not count.try_enter():
            await refuse_stream(stream, count.cap)
            return
        cred = peer_credentials(stream)
        why = backend.peer_refusal(cred[0]) if cred is not None else ""
        if why:
            count.leave()
            log.warning("host socket: refused %s (confinement: never the kernel socket)", why)
            message = f"the kernel socket refuses sidecar processes: {why}"
            await refuse_stream(stream, count.cap, refusal_line("unauthorized", message))
            return
        try:
            conn = StreamConnection(backend, stream, limits=limits, name=peer_name(stream, "unix"))
            await conn.run()
        finally:
            count.leave()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(count.trimmer)
            await nursery.start(
                partial(serve_listeners, what="the host's socket"), handler, [listener]
            )
            task_status.started(path)
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == ino:
                os.unlink(path)
