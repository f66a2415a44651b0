"""``toolhost mcp`` hands its stdio session to the running host (``mcp.adopt``) and waits.

# Strategy: on the kernel socket (private to the user) send ``mcp.adopt`` with what the user
# asked (``--tools``/``--profile``, telemetry); at the go-ahead, send one byte carrying stdin and
# stdout (``SCM_RIGHTS``), then only wait: the host serves the session in its own process and
# ends it with the event ``mcp.adopt.ended {reason, error?}``. This connection is the session's
# life line: if this process dies the host sees it close and ends the session. A host that does
# not know the method (an older one) or cannot adopt answers an error that keeps the relay
# (:class:`Relay`); stdin or stdout that is not a pipe or a socket never gets here (a terminal
# must not be made non-blocking under the user's shell).
"""

from __future__ import annotations

import array
import json
import os
import socket
import stat
from typing import Any

import msgspec
import trio

RELAY_ENV = "TOOLHOST_MCP_RELAY"
"""Set (non-empty, not ``0``): ``toolhost mcp`` keeps its relay, as ``--relay`` does."""
_KEEP_RELAY = frozenset(("unknown-method", "unsupported"))
"""``mcp.adopt`` errors that mean "this host does not adopt": the relay serves instead."""


class Relay(Exception):
    """The host will not adopt the session (older, or it cannot): serve it with the relay."""


class Refused(Exception):
    """The host refused the session: ``code`` and ``message`` for the user."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Ended(msgspec.Struct, kw_only=True):
    """How the adopted session ended (``mcp.adopt.ended``)."""

    reason: str
    """``stdin-closed``, ``host-stopped``, ``failed``, ``refused``, or ``connection-lost``
    (the host's connection closed without saying: it crashed)."""
    error: str | None = None


def wants_relay(forced: bool, stdin_fd: int = 0, stdout_fd: int = 1) -> str:
    """Why the relay must serve this session ("" when it can be handed over)."""
    if forced:
        return "--relay"
    if os.environ.get(RELAY_ENV, "") not in ("", "0"):
        return f"{RELAY_ENV} is set"
    for name, fd in (("stdin", stdin_fd), ("stdout", stdout_fd)):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return f"{name} is closed"
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return f"{name} is not a pipe or a socket"
    return ""


async def hand_over(
    path: str, params: dict[str, Any], *, stdin_fd: int = 0, stdout_fd: int = 1
) -> Ended:
    """Give the session on ``stdin_fd``/``stdout_fd`` to the host at ``path``; return once it
    ended.

    Raises:
        OSError: The socket cannot be reached.
        Relay: The host does not adopt sessions (nothing was handed over).
        Refused: The host refused ``params`` (an unknown profile, the adopted-session cap).
    """
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        await sock.connect(path)
        request = {"id": 1, "method": "mcp.adopt", "params": params}
        await _send_all(sock, json.dumps(request).encode() + b"\n")
        lines = _Lines(sock)
        answer = await lines.next()
        if answer is None:
            raise Relay("the host closed the connection")
        error = answer.get("error")
        if isinstance(error, dict):
            code, message = str(error.get("code")), str(error.get("message"))
            if code in _KEEP_RELAY:
                raise Relay(message)
            raise Refused(code, message)
        fds = array.array("i", [stdin_fd, stdout_fd])
        await sock.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        while True:
            frame = await lines.next()
            if frame is None:
                return Ended(reason="connection-lost")
            if frame.get("event") == "mcp.adopt.ended":
                data = frame.get("data")
                data = data if isinstance(data, dict) else {}
                error_text = data.get("error")
                return Ended(
                    reason=str(data.get("reason", "")),
                    error=None if error_text is None else str(error_text),
                )


async def _send_all(sock: trio.socket.SocketType, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[await sock.send(view) :]


class _Lines:
    """JSON lines read from the socket (None at EOF or a reset)."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.buf = b""

    async def next(self) -> dict[str, Any] | None:
        while b"\n" not in self.buf:
            try:
                chunk = await self.sock.recv(1 << 16)
            except OSError:
                return None
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            frame = json.loads(line)
        except ValueError:
            return {}
        return frame if isinstance(frame, dict) else {}
