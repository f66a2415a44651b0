"""The HTTP faces hold against hostile clients (issue 30, item 6; issue 26, item 18): the gateway
refuses a foreign ``Host`` without ``Origin`` and answers unknown paths 404. Real processes,
real sockets, raw HTTP."""

from __future__ import annotations

import re
import socket

import trio

from tests.conftest import echo, write_registry
from tests.e2e.conftest import serve


async def read_all(stream: trio.SocketStream, timeout: float = 15) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    with trio.fail_after(timeout):
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def exchange(port: int, raw: bytes) -> bytes:
    """Send ``raw`` on a new connection and read until the server closes it."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(raw)
        return await read_all(stream)


async def read_response(
    stream: trio.SocketStream,
    status: int = 0,
    fields: dict[str, str] | None = None,
    body: bytes = b"",
    *,
    body_too: bool = True,
) -> tuple[int, dict[str, str], bytes]:
    """One response with a ``content-length`` from a kept-alive connection (``body_too=False``:
    its head, and what came with it; pass those back in to read the rest)."""
    with trio.fail_after(15):
        if fields is None:
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = await stream.receive_some(65536)
                assert chunk, f"closed before a response: {buf!r}"
                buf += chunk
            head, _, body = buf.partition(b"\r\n\r\n")
            status, fields = parse_head(head)
        while body_too and len(body) < int(fields["content-length"]):
            chunk = await stream.receive_some(65536)
            assert chunk, "closed in the middle of a body"
            body += chunk
    return status, fields, body


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, *rest = head.decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in rest)}
    return int(status_line.split()[1]), fields


def statuses(data: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3})", data)]


def get(path: str, port: int, *extra: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# the WebSocket gateway -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def handshake(port: int, host: str, token: str) -> bytes:
    return (
        "GET /ws HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        f"Authorization: Bearer {token}\r\n\r\n"
    ).encode()


async def first_status(port: int, raw: bytes) -> tuple[int, bytes]:
    """Send ``raw`` and read the first response (a 101 keeps the connection open)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(raw)
        status, fields, body = await read_response(stream, body_too=False)
        if status != 101:
            status, fields, body = await read_response(stream, status, fields, body)
        return status, body


def test_gateway_host_check_and_unknown_paths(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    port = free_port()
    write_registry(
        root,
        {"echo": echo(tools=["echo.say"])},
        host={"ws": {"listen": f"127.0.0.1:{port}", "tokenFile": ".toolhost/ws.token"}},
    )
    with serve(root):
        token = (root / ".toolhost" / "ws.token").read_text().strip()

        async def main() -> None:
            # A foreign Host on the loopback listener, no Origin, the right token: refused.
            status, data = await first_status(port, handshake(port, "evil.example", token))
            assert status == 403 and b"not loopback" in data, data
            status, _ = await first_status(port, handshake(port, f"evil.example:{port}", token))
            assert status == 403
            # The same handshake naming loopback is accepted (the check is the Host).
            status, _ = await first_status(port, handshake(port, f"127.0.0.1:{port}", token))
            assert status == 101

            # Unknown paths: 404 with a short text body (it was 400 with none).
            data = await exchange(port, get("/nope", port))
            head, _, body = data.partition(b"\r\n\r\n")
            assert statuses(head) == [404], data
            assert b"not found" in body and len(body) < 200
            assert int(parse_head(head)[1]["content-length"]) == len(body)
            data = await exchange(port, get("/nope", port).replace(b"GET", b"HEAD", 1))
            assert statuses(data) == [404] and data.endswith(b"\r\n\r\n")
            data = await exchange(port, get("/ws", port))
            assert statuses(data) == [426] and b"WebSocket" in data

        trio.run(main)
