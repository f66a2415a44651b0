"""A client that shuts down its sending side after its requests still reads (issue 26, item 9).

``printf '...' | nc -U -q 2 host.sock`` (netcat-openbsd) does that when its stdin ends: the host
must answer every request it read, then close, on the Unix socket and on the WebSocket gateway
(the kernel protocol's TCP listener). Only a hang-up, a reset or a failed write means the client
is gone.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Request, TextMessage

from tests.conftest import echo, write_registry
from tests.e2e.conftest import serve
from tests.e2e.test_serve import plain_call, wait_visible

REQUESTS = [
    {
        "id": 1,
        "method": "tools.invoke",
        "params": {"tool": "echo.sleep", "input": {"seconds": 0.5, "steps": 5}},
    },
    {"id": 2, "method": "tools.invoke", "params": {"tool": "echo.say", "input": {"text": "hi"}}},
    {"id": 3, "method": "system.health", "params": {}},
]


def app_with_gateway(tmp_path: Path) -> Path:
    """echo (its tools read-only, so a departed client would have them dropped) and the
    gateway on a free loopback port."""
    root = tmp_path / "app"
    (root / "manifests").mkdir(parents=True)
    (root / "manifests" / "read-only.toml").write_text(
        "".join(f'[[tool]]\nname = "{t}"\nreadOnly = true\n\n' for t in ("echo.sleep", "echo.say"))
    )
    write_registry(
        root,
        {"echo": echo(tools=["echo.say", "echo.sleep"])},
        host={"ws": {"listen": "127.0.0.1:0", "tokenFile": ".toolhost/ws.token"}},
    )
    return root


def answers_by_id(frames: list[dict[str, Any]]) -> dict[int, Any]:
    return {f["id"]: f.get("result") for f in frames if "id" in f and "event" not in f}


def check(frames: list[dict[str, Any]]) -> None:
    got = answers_by_id(frames)
    assert sorted(got) == [1, 2, 3], frames
    assert got[1]["status"] == "success", got[1]
    assert got[2]["status"] == "success" and got[2]["data"]["text"] == "hi", got[2]
    assert "status" in got[3]


def unix_half_close(sock: Path) -> list[dict[str, Any]]:
    """Write the requests, shut down the sending side, read until the host closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(sock))
        s.sendall(b"".join(json.dumps(r).encode() + b"\n" for r in REQUESTS))
        s.shutdown(socket.SHUT_WR)
        buf = b""
        while chunk := s.recv(65536):
            buf += chunk
    return [json.loads(line) for line in buf.splitlines() if line.strip()]


def ws_half_close(port: int, token: str) -> tuple[list[dict[str, Any]], bool]:
    """The same over the gateway: handshake, the requests as text frames, then shutdown(SHUT_WR)
    of the TCP connection; returns the frames and whether the host sent a close frame."""
    ws = WSConnection(ConnectionType.CLIENT)
    frames: list[dict[str, Any]] = []
    closed = False
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            ws.send(
                Request(
                    host=f"127.0.0.1:{port}",
                    target="/ws",
                    extra_headers=[(b"authorization", f"Bearer {token}".encode())],
                )
            )
        )
        accepted = False
        while not accepted:
            data = s.recv(65536)
            assert data, "the gateway closed during the handshake"
            ws.receive_data(data)
            for event in ws.events():
                assert isinstance(event, AcceptConnection), event
                accepted = True
        s.sendall(b"".join(ws.send(TextMessage(data=json.dumps(r))) for r in REQUESTS))
        s.shutdown(socket.SHUT_WR)
        text = ""
        while data := s.recv(65536):
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, TextMessage):
                    text += event.data
                    if event.message_finished:
                        frames.append(json.loads(text))
                        text = ""
                elif isinstance(event, CloseConnection):
                    closed = True
    return frames, closed


def test_a_half_closed_client_gets_every_answer_on_the_unix_socket(tmp_path):
    root = app_with_gateway(tmp_path)
    sock = root / ".toolhost" / "host.sock"
    with serve(root):
        trio.run(wait_visible, sock, ["echo.sleep", "echo.say"])
        check(unix_half_close(sock))
        check(unix_half_close(sock))  # and the host serves the next one the same way


def test_a_half_closed_client_gets_every_answer_on_the_websocket_gateway(tmp_path):
    root = app_with_gateway(tmp_path)
    sock = root / ".toolhost" / "host.sock"
    with serve(root):
        trio.run(wait_visible, sock, ["echo.sleep", "echo.say"])
        hello = plain_call(sock, {"id": 0, "method": "server.hello", "params": {}})
        url = hello["result"]["capabilities"]["endpoints"]["ws"]  # ws://127.0.0.1:PORT/ws
        port = int(url.removesuffix("/ws").rsplit(":", 1)[1])
        token = (root / ".toolhost" / "ws.token").read_text().strip()
        frames, closed = ws_half_close(port, token)
        check(frames)
        assert closed, "the gateway closed without a close frame"
