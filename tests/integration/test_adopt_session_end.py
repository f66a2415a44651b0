"""``mcp.adopt``'s end of a session (``server/adopt.py``) on real descriptors: the client's stdin
and stdout pipes travel with ``SCM_RIGHTS`` over a real socket pair, as ``toolhost mcp`` sends
them. A face that fails ends its own session only: the client is told ``failed`` with the error,
the host's copies of the descriptors are closed, and the next adopted session is served as usual.
The other two ends are covered too: the MCP client closing stdin (``stdin-closed``) and the
``toolhost mcp`` process going away (``client-gone``, which stops the face)."""

from __future__ import annotations

import array
import os
import socket
from typing import Any

import pytest
import trio

from supervisor.server.adopt import AdoptParams, serve_adopted


class Face:
    """An adopter that reads one line from the adopted stdin, answers it on the adopted stdout,
    then fails (``fail``) or waits for stdin to close."""

    def __init__(self) -> None:
        self.fail = False
        self.served: list[bytes] = []
        self.cancelled = 0

    def check(self, params: AdoptParams) -> Any:
        return None

    def enter(self) -> None:
        pass

    def leave(self) -> None:
        pass

    async def serve(self, checked: Any, stdin_fd: int, stdout_fd: int, name: str) -> None:
        try:
            line = await _read_line(stdin_fd)
            self.served.append(line)
            os.write(stdout_fd, b"answer to " + line)
            if self.fail:
                raise RuntimeError("the face broke on " + line.decode().strip())
            while await _read_line(stdin_fd):
                pass
        except trio.Cancelled:
            self.cancelled += 1
            raise


async def _read_line(fd: int) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        await trio.lowlevel.wait_readable(fd)
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            continue
        if not chunk:
            return data
        data += chunk
    return data


class Client:
    """What ``toolhost mcp`` keeps after handing over: the write end of the session's stdin,
    the read end of its stdout, and the life line."""

    def __init__(self, life: socket.socket) -> None:
        stdin_r, self.stdin_w = os.pipe()
        self.stdout_r, stdout_w = os.pipe()
        os.set_blocking(stdin_r, False)
        os.set_blocking(self.stdout_r, False)
        fds = array.array("i", [stdin_r, stdout_w])
        life.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        os.close(stdin_r)  # the host holds the only copies of these two now
        os.close(stdout_w)
        self.life = life

    def close(self) -> None:
        for fd in (self.stdin_w, self.stdout_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.life.close()


async def _adopt(face: Face, script: Any) -> tuple[list[tuple[str, str | None]], Client]:
    """Run ``serve_adopted`` for one session while ``script(client)`` plays the client."""
    host_end, client_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ended: list[tuple[str, str | None]] = []
    client = Client(client_end)
    sock = trio.socket.from_stdlib_socket(host_end)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                serve_adopted, face, None, sock, lambda r, e=None: ended.append((r, e)), "t"
            )
            await script(client)
    sock.close()
    return ended, client


async def _say(client: Client, line: bytes) -> bytes:
    os.write(client.stdin_w, line)
    return await _read_line(client.stdout_r)


@pytest.mark.trio
async def test_a_face_error_ends_that_session_only_and_the_client_is_told_why():
    face = Face()
    face.fail = True

    async def failing(client: Client) -> None:
        assert await _say(client, b"hello\n") == b"answer to hello\n"

    ended, client = await _adopt(face, failing)
    try:
        assert ended == [("failed", "RuntimeError: the face broke on hello")]
        # The host closed its copies: the session's stdout ends, its stdin has no reader.
        assert await _read_line(client.stdout_r) == b""
        with pytest.raises(BrokenPipeError):
            os.write(client.stdin_w, b"more\n")
    finally:
        client.close()

    face.fail = False  # the next session on the same host is served as usual

    async def working(client: Client) -> None:
        assert await _say(client, b"again\n") == b"answer to again\n"
        os.close(client.stdin_w)  # the MCP client closes stdin: the session ends cleanly

    ended, client = await _adopt(face, working)
    client.close()
    assert ended == [("stdin-closed", None)]
    assert face.served == [b"hello\n", b"again\n"]


@pytest.mark.trio
async def test_the_client_going_away_stops_the_face():
    face = Face()

    async def leaving(client: Client) -> None:
        assert await _say(client, b"hi\n") == b"answer to hi\n"
        client.life.close()  # toolhost mcp was killed: its end of the life line is gone

    ended, client = await _adopt(face, leaving)
    client.close()
    assert ended == [("client-gone", None)]
    assert face.cancelled == 1  # the face was stopped, not left serving the descriptors
