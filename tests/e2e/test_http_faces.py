"""The two HTTP faces hold against hostile clients (issue 30, items 5 and 6; issue 26, item 18):
``toolhost mcp --http`` caps its connections, closes slow and idle clients on settable timeouts,
answers request smuggling and non-JSON POSTs; the gateway refuses a foreign ``Host`` without
``Origin`` and answers unknown paths 404. Real processes, real sockets, raw HTTP."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from tests.conftest import echo, free_port, write_registry
from tests.e2e.conftest import TOOLHOST, serve, stop

INIT = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}},
    }
).encode()


class McpHttp:
    """A running ``toolhost mcp --http``: its port, token and stderr so far."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, token: str) -> None:
        self.proc = proc
        self.port = port
        self.token = token
        self.stderr: list[str] = []

    def post(self, path: str = "/mcp", body: bytes = INIT, **headers: str) -> bytes:
        """A raw POST with the token (``headers`` use ``_`` for ``-``; None drops one)."""
        fields = {
            "Host": f"127.0.0.1:{self.port}",
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
        }
        fields.update({k.replace("_", "-"): v for k, v in headers.items()})
        lines = [f"POST {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in fields.items() if v]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@contextmanager
def mcp_http(root: Path, *extra: str) -> Iterator[McpHttp]:
    """``toolhost mcp --embedded --http 127.0.0.1:0 *extra`` on an app with the echo sidecar."""
    write_registry(root, {"echo": echo(tools=["echo.say"])})
    command = [*TOOLHOST, "mcp", "--app-root", str(root), "--no-global", "--embedded"]
    proc = subprocess.Popen(
        [*command, "--http", "127.0.0.1:0", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "XDG_CONFIG_HOME": str(root / ".xdg")},
    )
    assert proc.stderr is not None
    lines: list[str] = []
    port = None
    for raw in proc.stderr:
        lines.append(raw.decode(errors="replace"))
        match = re.search(rb"http://127\.0\.0\.1:(\d+)/mcp", raw)
        if match:
            port = int(match.group(1))
            break
    if port is None:
        stop(proc)
        pytest.fail("toolhost mcp --http did not start:\n" + "".join(lines))
    # The start line says where a first client finds the token.
    assert str(root / ".toolhost" / "mcp.token") in lines[-1], lines[-1]
    server = McpHttp(proc, port, (root / ".toolhost" / "mcp.token").read_text().strip())
    server.stderr = lines
    pipe = proc.stderr
    reader = threading.Thread(
        target=lambda: lines.extend(r.decode(errors="replace") for r in pipe), daemon=True
    )
    reader.start()
    try:
        yield server
    finally:
        stop(proc)
        reader.join(timeout=5)
    assert "Traceback" not in "".join(lines), "".join(lines)


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


# toolhost mcp --http ---------------------------------------------------------------------

SLOW = 200
HEADER_TIMEOUT = 8.0
IDLE_TIMEOUT = 2.0


async def test_slowloris_neither_delays_a_client_nor_stays(app):
    """200 clients trickle a head one byte at a time and never finish it: a normal client is
    answered while every one of them is still open, and each is closed (408) once the header
    timeout has passed since it connected; the normal client, idle after its answer, is closed
    after the idle timeout."""
    with mcp_http(
        app, "--header-timeout", str(HEADER_TIMEOUT), "--idle-timeout", str(IDLE_TIMEOUT)
    ) as server:
        closed: dict[int, tuple[float, bytes]] = {}
        all_closed = trio.Event()

        async def slow(i: int, task_status: trio.TaskStatus[None]) -> None:
            opened = trio.current_time()  # the server's clock for it starts later
            stream = await trio.open_tcp_stream("127.0.0.1", server.port)
            head = b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
            async with stream, trio.open_nursery() as nursery:

                async def trickle() -> None:
                    n = 0
                    while True:
                        byte = head[n : n + 1] or b"a"
                        n += 1
                        try:
                            await stream.send_all(byte)
                        except (trio.BrokenResourceError, trio.ClosedResourceError):
                            return
                        await trio.sleep(0.2)

                nursery.start_soon(trickle)
                task_status.started()
                data = b""
                try:
                    while chunk := await stream.receive_some(65536):
                        data += chunk
                except trio.BrokenResourceError:  # a reset is a close too
                    pass
                closed[i] = (trio.current_time() - opened, data)
                if len(closed) == SLOW:
                    all_closed.set()
                nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            for i in range(SLOW):
                await nursery.start(slow, i)
            # Every slow client is connected and trickling: a normal one is served now.
            normal = await trio.open_tcp_stream("127.0.0.1", server.port)
            async with normal:
                sent = trio.current_time()  # the server's idle clock starts after its answer
                await normal.send_all(server.post())
                status, fields, body = await read_response(normal)
                still_open = SLOW - len(closed)
                assert status == 200, body
                assert "mcp-session-id" in fields
                assert json.loads(body)["result"]["serverInfo"]
                assert still_open == SLOW, f"{SLOW - still_open} slow clients closed first"
                # Kept alive, then idle: closed after the idle timeout, without a 408.
                rest = await read_all(normal, timeout=IDLE_TIMEOUT + 30)
                assert rest == b""
                assert trio.current_time() - sent >= IDLE_TIMEOUT
            with trio.fail_after(HEADER_TIMEOUT + 60):
                await all_closed.wait()
        for i, (after, data) in closed.items():
            assert after >= HEADER_TIMEOUT, f"slow client {i} closed after {after:.2f}s"
            assert data == b"" or data.startswith(b"HTTP/1.1 408"), data[:100]
        assert sum(1 for _, data in closed.values() if data.startswith(b"HTTP/1.1 408")) > 0


async def test_connections_past_the_cap_get_503(app):
    cap = 8  # the floor of the cap (admission.MIN_CONNECTIONS)
    with mcp_http(app, "--max-connections", str(cap), "--header-timeout", "60") as server:
        held: list[trio.SocketStream] = []
        try:
            # Each one answered (so it holds a place), then kept alive and idle.
            for _ in range(cap):
                stream = await trio.open_tcp_stream("127.0.0.1", server.port)
                held.append(stream)
                await stream.send_all(get("/healthz", server.port))
                status, _, _ = await read_response(stream)
                assert status == 200
            for _ in range(2):
                data = await exchange(server.port, get("/healthz", server.port))
                assert statuses(data) == [503], data
                error = json.loads(data.partition(b"\r\n\r\n")[2])["error"]
                assert error["code"] == "overloaded" and f"at most {cap}" in error["message"]
        finally:
            for stream in held:
                await stream.aclose()
        # Places come back when clients leave (the server notices the close a moment later).
        with trio.fail_after(15):
            again = get("/healthz", server.port, "Connection: close")
            while statuses(await exchange(server.port, again)) != [200]:
                await trio.sleep(0.05)


async def test_smuggling_non_json_and_unknown_paths(app):
    with mcp_http(app) as server:
        # Content-Length and Transfer-Encoding together: 400, and nothing after it is read as a
        # request (the pipelined GET would be the smuggled one).
        smuggled = server.post(body=b"0\r\n\r\n", Transfer_Encoding="chunked")
        smuggled += get("/healthz", server.port, "Connection: close")
        data = await exchange(server.port, smuggled)
        assert statuses(data) == [400], data
        assert b"Content-Length and Transfer-Encoding" in data

        # A POST that is not application/json: 415 (with or without a type), and the connection
        # stays usable; JSON with a charset is JSON.
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        async with stream:
            for ctype in ("text/plain", "", "application/x-www-form-urlencoded"):
                await stream.send_all(server.post(Content_Type=ctype))
                status, _, body = await read_response(stream)
                assert status == 415 and b"application/json" in body, (ctype, body)
            await stream.send_all(server.post(Content_Type="application/json; charset=utf-8"))
            status, fields, _ = await read_response(stream)
            assert status == 200 and "mcp-session-id" in fields

        # Unknown paths: 404 with a short text, for GET and POST.
        for raw in (
            get("/nope", server.port, "Connection: close"),
            server.post("/other", Connection="close"),
        ):
            data = await exchange(server.port, raw)
            head, _, body = data.partition(b"\r\n\r\n")
            assert statuses(head) == [404] and b"not found" in body and len(body) < 200

        # Not HTTP at all: answered 400 and closed, not dropped silently.
        data = await exchange(server.port, b"HELLO\r\n\r\n")
        assert statuses(data) == [400], data


# the WebSocket gateway -------------------------------------------------------------------


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
