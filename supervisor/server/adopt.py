"""``mcp.adopt``: the host takes over a stdio MCP session from ``toolhost mcp`` (its descriptors).

# Strategy: ``toolhost mcp`` on the Unix socket asks ``mcp.adopt {profile | tools, telemetry}``;
# the host checks it (the profile resolved from its own registry, the adopted-session cap) and
# answers the go-ahead ``{"fds": 2}``. From that frame on the connection reads no more frames:
# the client sends one byte carrying its stdin and stdout with ``SCM_RIGHTS``, received here
# with ``recvmsg`` (only a pipe or a socket is kept). The host then serves the MCP session in
# its own process through the :class:`Adopter` it was given (the MCP face, built by the CLI:
# this layer does not know it), while the kernel connection stays open as the session's life
# line: the client leaving (EOF, a hang-up: ``toolhost mcp`` was killed) ends the session and
# closes the host's copies of the descriptors; the session ending (the MCP client closed stdin,
# a face error, the host stopping) is told to the client with the event ``mcp.adopt.ended
# {reason, error?}`` before the connection closes. A face error ends that session only.
"""

from __future__ import annotations

import array
import logging
import os
import socket
import stat
from typing import Any, Protocol

import msgspec
import trio

log = logging.getLogger("toolhost.server")

GO_AHEAD = {"fds": 2}
"""The answer to an accepted ``mcp.adopt``: send stdin and stdout now."""
ENDED = "mcp.adopt.ended"
"""The event that ends an adopted session on its kernel connection."""
FDS_TIMEOUT_S = 10.0
"""The descriptors must follow the go-ahead within this (else the connection is closed)."""


class AdoptParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``mcp.adopt``'s params: at most one of ``profile`` (a name in the host's
    ``host.mcp.profiles``) and ``tools`` (shell-style patterns, as ``--tools``)."""

    profile: str | None = None
    tools: str | None = None
    telemetry: bool = True
    """MCP server spans from the host (when its ``host.telemetry`` is on)."""


class AdoptRefused(Exception):
    """``mcp.adopt`` is refused: ``code`` (``invalid-params``, ``overloaded``, ``unsupported``)
    and a message for the user."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Adopter(Protocol):
    """What serves adopted sessions (the MCP face, given by whoever starts the server)."""

    def check(self, params: AdoptParams) -> Any:
        """What :meth:`serve` needs (the resolved profile...), or :class:`AdoptRefused`."""
        ...

    def enter(self) -> None:
        """Take a place among the adopted sessions, or raise :class:`AdoptRefused`."""
        ...

    def leave(self) -> None: ...

    async def serve(self, checked: Any, stdin_fd: int, stdout_fd: int, name: str) -> None:
        """Serve one MCP session on the descriptors until stdin closes (they stay the
        caller's: it closes them)."""
        ...


def adoptable(fd: int) -> bool:
    """``fd`` is a pipe or a socket (never a terminal or a file: those stay with the relay)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


async def receive_fds(sock: trio.socket.SocketType, count: int = 2) -> list[int]:
    """The one byte after the go-ahead and the ``count`` descriptors it carries.

    Raises:
        AdoptRefused: No byte, not exactly ``count`` descriptors, or one that is not a pipe or
            a socket (every descriptor received is closed then).
    """
    fds = array.array("i")
    space = socket.CMSG_SPACE(count * fds.itemsize)
    with trio.move_on_after(FDS_TIMEOUT_S):
        msg, ancdata, flags, _addr = await sock.recvmsg(1, space)
        got: list[int] = []
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(data) - len(data) % fds.itemsize
                got += array.array("i", data[:usable]).tolist()
        try:
            if not msg:
                raise AdoptRefused("invalid-request", "the connection closed before the fds")
            if flags & socket.MSG_CTRUNC or len(got) != count:
                raise AdoptRefused("invalid-request", f"expected {count} descriptors")
            if not all(adoptable(fd) for fd in got):
                raise AdoptRefused("invalid-params", "only pipes and sockets are adopted")
        except AdoptRefused:
            for fd in got:
                os.close(fd)
            raise
        return got
    raise AdoptRefused("invalid-request", f"no descriptors within {FDS_TIMEOUT_S:g} s")


async def serve_adopted(
    adopter: Adopter,
    checked: Any,
    sock: trio.socket.SocketType,
    send_end: Any,
    name: str,
) -> None:
    """Receive the descriptors on ``sock`` and serve the session until it ends or the client
    leaves; ``send_end(reason, error)`` tells the client why it ended (``host-stopped`` when
    the host's cancellation ends it)."""
    try:
        fds = await receive_fds(sock)
    except AdoptRefused as exc:
        log.warning("mcp.adopt from %s: %s", name, exc.message)
        send_end("refused", exc.message)
        return
    except OSError as exc:
        log.warning("mcp.adopt from %s: %s", name, exc)
        return
    ended: tuple[str, str | None] = ("host-stopped", None)
    try:
        log.info("mcp.adopt: serving the stdio MCP session of %s", name)
        ended = await _run(adopter, checked, sock, fds, name)
        log.info("mcp.adopt: the session of %s ended: %s", name, ended[1] or ended[0])
    finally:
        for fd in fds:
            os.close(fd)
        send_end(*ended)


async def _run(
    adopter: Adopter, checked: Any, sock: trio.socket.SocketType, fds: list[int], name: str
) -> tuple[str, str | None]:
    """Until the session ends (``stdin-closed``, ``failed``) or the client goes
    (``client-gone``)."""
    outcome: list[tuple[str, str | None]] = []
    async with trio.open_nursery() as nursery:

        async def session() -> None:
            failed: BaseException | None = None
            try:
                await adopter.serve(checked, fds[0], fds[1], name)
            except* Exception as group:  # a face error ends this session, never the host
                failed = group.exceptions[0]  # (a cancellation beside it still propagates)
                log.error("mcp.adopt: the session of %s failed", name, exc_info=group)
            if failed is None:
                outcome.append(("stdin-closed", None))
            else:
                outcome.append(("failed", f"{type(failed).__name__}: {failed}"))
            nursery.cancel_scope.cancel()

        async def life_line() -> None:
            # Nothing more comes from the client: EOF or a reset means it is gone.
            try:
                await sock.recv(1)
            except (OSError, trio.ClosedResourceError):
                pass
            outcome.append(("client-gone", None))
            nursery.cancel_scope.cancel()

        nursery.start_soon(session)
        nursery.start_soon(life_line)
    return outcome[0] if outcome else ("host-stopped", None)
