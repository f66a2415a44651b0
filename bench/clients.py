"""Plain blocking kernel clients for the bench: NDJSON, MessagePack and WebSocket.

# Strategy: each client does the least a real client must do (send pre-encoded bytes, read one
# framed answer, decode nothing on the timed path), so the figures are the host's cost and not
# the client's. They use the standard library and msgspec only: no trio, no event loop, the
# same kind of client the floors use. :class:`PipelinedClient` keeps a window of calls in flight
# on one NDJSON connection for the throughput scenarios.
"""

from __future__ import annotations

import base64
import os
import socket
import time
from pathlib import Path
from typing import Any

import msgspec

_json = msgspec.json.Encoder()
_mp = msgspec.msgpack.Encoder()


def invoke_request(tool: str, payload: str, rid: int | str = 1) -> dict[str, Any]:
    """A ``tools.invoke`` request for the echo tools (``{"payload": ...}`` input)."""
    return {
        "id": rid,
        "method": "tools.invoke",
        "params": {"tool": tool, "input": {"payload": payload}},
    }


def ndjson(obj: Any) -> bytes:
    return _json.encode(obj) + b"\n"


def msgpack_frame(obj: Any) -> bytes:
    body = _mp.encode(obj)
    return len(body).to_bytes(4, "big") + body


class _Answer(msgspec.Struct):
    id: int | str | None = None
    result: Any = None
    error: Any = None
    event: str | None = None


_answer = msgspec.json.Decoder(_Answer)
_answer_mp = msgspec.msgpack.Decoder(_Answer)


def check_envelope(raw: bytes, *, binary: bool = False) -> dict[str, Any]:
    """Decode one answer and return its envelope; raise when the call did not succeed."""
    ans = (_answer_mp if binary else _answer).decode(raw)
    if ans.error is not None:
        raise RuntimeError(f"request failed: {ans.error}")
    env = ans.result
    if not isinstance(env, dict) or env.get("status") != "success":
        raise RuntimeError(f"call did not succeed: {str(env)[:500]}")
    return env


def unix_connect(path: str | Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))
    return s


class LineClient:
    """Newline-delimited frames over a connected socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile = sock.makefile("rb", buffering=1 << 16)

    def roundtrip(self, data: bytes) -> bytes:
        self.sock.sendall(data)
        return self.rfile.readline()

    def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """One control request (not timed); skips events; raises on an error answer."""
        rid = f"ctl-{time.monotonic_ns()}"
        self.sock.sendall(ndjson({"id": rid, "method": method, "params": params or {}}))
        while True:
            line = self.rfile.readline()
            if not line:
                raise ConnectionError("host closed the connection")
            ans = msgspec.json.decode(line)
            if ans.get("id") != rid:
                continue
            if "error" in ans:
                raise RuntimeError(f"{method}: {ans['error']}")
            return ans["result"]

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


class MsgpackClient:
    """4-byte big-endian length-prefixed MessagePack after a JSON ``server.hello``."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile = sock.makefile("rb", buffering=1 << 16)
        hello = {"id": 0, "method": "server.hello", "params": {"encoding": "msgpack"}}
        sock.sendall(ndjson(hello))
        if b'"result"' not in self.rfile.readline():
            raise RuntimeError("server.hello refused msgpack")

    def roundtrip(self, frame: bytes) -> bytes:
        self.sock.sendall(frame)
        read = self.rfile.read
        n = int.from_bytes(read(4), "big")
        return read(n)

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


class WsClient:
    """A minimal RFC 6455 client: one connection, text frames, masked as the RFC requires."""

    def __init__(self, url_host: str, port: int, token: str, path: str = "/ws") -> None:
        self.sock = socket.create_connection((url_host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile = self.sock.makefile("rb", buffering=1 << 16)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: {url_host}:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {token}\r\n\r\n"
            ).encode()
        )
        status = self.rfile.readline()
        if b" 101 " not in status:
            raise ConnectionError(f"WebSocket handshake refused: {status!r}")
        while self.rfile.readline() not in (b"\r\n", b""):
            pass

    @staticmethod
    def frame(payload: bytes, opcode: int = 1) -> bytes:
        """A masked client frame (a fresh random mask each time)."""
        n = len(payload)
        if n < 126:
            head = bytes((0x80 | opcode, 0x80 | n))
        elif n < 1 << 16:
            head = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
        else:
            head = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
        mask = os.urandom(4)
        key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
        masked = (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big") if n else b""
        return head + mask + masked

    def roundtrip_text(self, payload: bytes) -> bytes:
        self.sock.sendall(self.frame(payload))
        return self.receive()

    def receive(self) -> bytes:
        """One whole message (continuation frames joined); answers pings, skips pongs."""
        read = self.rfile.read
        parts: list[bytes] = []
        while True:
            b0, b1 = read(2)
            n = b1 & 0x7F
            if n == 126:
                n = int.from_bytes(read(2), "big")
            elif n == 127:
                n = int.from_bytes(read(8), "big")
            data = read(n)
            opcode = b0 & 0x0F
            if opcode == 9:  # ping
                self.sock.sendall(self.frame(data, opcode=10))
                continue
            if opcode == 10:
                continue
            if opcode == 8:
                raise ConnectionError("WebSocket closed by the host")
            parts.append(data)
            if b0 & 0x80:
                return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        try:
            self.sock.sendall(self.frame(b"\x03\xe8", opcode=8))
        except OSError:
            pass
        self.rfile.close()
        self.sock.close()


class _Id(msgspec.Struct):
    id: int = -1


_id_decoder = msgspec.json.Decoder(_Id)


class PipelinedClient:
    """Keep ``window`` ``tools.invoke`` calls in flight on one NDJSON connection.

    Every answer is matched to its request by id and immediately replaced by a new request
    with the same id, until ``calls`` answers have arrived.
    """

    def __init__(self, sock: socket.socket, tool: str, payload: str, window: int) -> None:
        self.sock = sock
        self.window = window
        self.requests = [ndjson(invoke_request(tool, payload, i)) for i in range(window)]

    def run(self, calls: int) -> tuple[list[float], float, int]:
        """Returns (latencies in s, elapsed s, answers that were not a success)."""
        sock, reqs = self.sock, self.requests
        window = min(self.window, calls)
        clock = time.perf_counter
        sent = [0.0] * self.window
        lat: list[float] = []
        issued = window
        bad = 0
        t_start = clock()
        for i in range(window):
            sent[i] = t_start
        sock.sendall(b"".join(reqs[:window]))
        buf = b""
        decode = _id_decoder.decode
        while len(lat) < calls:
            data = sock.recv(1 << 18)
            if not data:
                raise ConnectionError("host closed the connection")
            buf += data
            if b"\n" not in data:
                continue
            lines = buf.split(b"\n")
            buf = lines.pop()
            now = clock()
            out = []
            for line in lines:
                rid = decode(line).id
                if rid < 0:
                    continue
                lat.append(now - sent[rid])
                if b'"status":"success"' not in line[:200] and b'"success"' not in line:
                    bad += 1
                if issued < calls:
                    issued += 1
                    sent[rid] = now
                    out.append(reqs[rid])
            if out:
                sock.sendall(b"".join(out))
        return lat, clock() - t_start, bad
