"""Raw kernel-protocol peers for tests: Unix (NDJSON or length-prefixed msgpack) and WebSocket.

They speak the wire format by hand (not through ``supervisor.client``) so conformance tests check
the bytes a non-Python kernel would see.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import trio
from trio_websocket import open_websocket_url

from supervisor.protocols.framing import LengthPrefixSplitter, LineSplitter, length_prefixed


class UnixPeer:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.encoding = "json"
        self._lines: LineSplitter | None = LineSplitter(1 << 30)
        self._frames: LengthPrefixSplitter | None = None
        self._pending: list[bytes] = []
        self.closed = False

    async def send_bytes(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send(self, obj: Any) -> None:
        if self.encoding == "json":
            await self.send_bytes(msgspec.json.encode(obj) + b"\n")
        else:
            await self.send_bytes(length_prefixed(msgspec.msgpack.encode(obj)))

    async def recv(self) -> Any:
        while not self._pending:
            data = await self.stream.receive_some(1 << 16)
            if not data:
                self.closed = True
                raise EOFError("connection closed by the host")
            splitter = self._lines if self._lines is not None else self._frames
            assert splitter is not None
            self._pending.extend(splitter.feed(data))
        frame = self._pending.pop(0)
        if self.encoding == "json":
            return msgspec.json.decode(frame)
        return msgspec.msgpack.decode(frame)

    def switch_to_msgpack(self) -> None:
        """Call right after reading the hello response that switched the connection."""
        assert self._lines is not None
        rest = b"".join(f + b"\n" for f in self._pending) + self._lines.take_pending()
        self._pending = []
        self._lines, self._frames = None, LengthPrefixSplitter(1 << 30)
        self.encoding = "msgpack"
        if rest:
            self._pending.extend(self._frames.feed(rest))

    async def request(self, rid: Any, method: str, params: Any = None) -> Any:
        await self.send({"id": rid, "method": method, "params": params or {}})
        while True:
            msg = await self.recv()
            if msg.get("id") == rid and "event" not in msg:
                return msg

    async def hello(self, encoding: str = "json") -> Any:
        resp = await self.request(
            0, "server.hello", {"client": {"name": "test"}, "encoding": encoding}
        )
        if encoding == "msgpack":
            self.switch_to_msgpack()
        return resp


class WsPeer:
    def __init__(self, ws: Any, binary: bool) -> None:
        self.ws = ws
        self.binary = binary

    async def send(self, obj: Any) -> None:
        if self.binary:
            await self.ws.send_message(msgspec.msgpack.encode(obj))
        else:
            await self.ws.send_message(msgspec.json.encode(obj).decode())

    async def send_bytes(self, data: bytes) -> None:
        await self.ws.send_message(data if self.binary else data.decode("utf-8", "replace"))

    async def recv(self) -> Any:
        msg = await self.ws.get_message()
        if isinstance(msg, str):
            assert not self.binary, "text frame answered to a binary request"
            return msgspec.json.decode(msg)
        assert self.binary, "binary frame answered to a text request"
        return msgspec.msgpack.decode(msg)

    async def request(self, rid: Any, method: str, params: Any = None) -> Any:
        await self.send({"id": rid, "method": method, "params": params or {}})
        while True:
            msg = await self.recv()
            if msg.get("id") == rid and "event" not in msg:
                return msg

    async def hello(self, encoding: str = "json") -> Any:
        return await self.request(0, "server.hello", {"client": {"name": "test"}})


@asynccontextmanager
async def unix_peer(path: Path, encoding: str = "json") -> AsyncIterator[UnixPeer]:
    stream = await trio.open_unix_socket(os.fspath(path))
    async with stream:
        peer = UnixPeer(stream)
        await peer.hello(encoding)
        yield peer


@asynccontextmanager
async def ws_peer(port: int, token: str | None, binary: bool = False) -> AsyncIterator[WsPeer]:
    headers = [(b"Authorization", f"Bearer {token}".encode())] if token else []
    async with open_websocket_url(
        f"ws://127.0.0.1:{port}/ws", extra_headers=headers, max_message_size=1 << 26
    ) as ws:
        peer = WsPeer(ws, binary)
        await peer.hello()
        yield peer


class Served:
    def __init__(self, host: Any, sock: Path, ws_port: int, token: str) -> None:
        self.host = host
        self.sock = sock
        self.ws_port = ws_port
        self.token = token

    def peer(self, transport: str) -> Any:
        """``unix-json``, ``unix-msgpack``, ``ws-json`` or ``ws-msgpack``."""
        kind, enc = transport.split("-")
        if kind == "unix":
            return unix_peer(self.sock, enc)
        return ws_peer(self.ws_port, self.token, binary=enc == "msgpack")


@asynccontextmanager
async def served(
    host: Any,
    root: Path,
    *,
    max_frame: int = 1 << 20,
    queue: int = 1 << 22,
    max_connections: int = 1024,
    pause_bytes: int = 1 << 20,
) -> AsyncIterator[Served]:
    """Serve ``host`` on a Unix socket and a WebSocket (random loopback port) for the block."""
    from supervisor.private_files import read_token
    from supervisor.server.backend import Backend
    from supervisor.server.stream import ConnectionLimits
    from supervisor.server.unix import serve_unix
    from supervisor.server.ws import serve_ws

    limits = ConnectionLimits(
        max_frame=max_frame,
        max_queue_bytes=queue,
        max_connections=max_connections,
        pause_bytes=pause_bytes,
    )
    sock = root / ".toolhost" / "t.sock"
    token = read_token(str(root / ".toolhost" / "ws.token"))
    backend = Backend.of(host)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: serve_unix(
                backend, str(sock), limits=limits, task_status=task_status
            )
        )
        port = await nursery.start(
            lambda task_status: serve_ws(
                backend, "127.0.0.1:0", token, limits=limits, task_status=task_status
            )
        )
        try:
            yield Served(host, sock, port, token)
        finally:
            nursery.cancel_scope.cancel()
