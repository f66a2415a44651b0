"""One kernel client connection: frames in, method calls, responses and events out.

# Strategy: the reader decodes frames and answers quick methods inline; ``tools.invoke`` goes to a
# small pool of long-lived invoker tasks owned by the connection (grown on demand, so thousands of
# calls can be in flight without a task spawn per call in the steady state). Everything sent goes
# through one bounded outbound queue drained by a writer task that batches frames into one write;
# a client that stops reading and lets the queue grow past its bound is disconnected. When the
# client goes away, the connection's nursery is cancelled and with it every call it started.
"""

from __future__ import annotations

import logging
import math
import socket
import struct
from collections import deque
from typing import Any

import msgspec
import trio

from supervisor.contracts.rpc import RequestId
from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.framing import LengthPrefixSplitter, LineSplitter, length_prefixed
from supervisor.runtime.host import Host
from supervisor.server.codec import BadFrame, BadParams, Codec, Encoding
from supervisor.server.methods import (
    ASYNC_METHODS,
    SYNC_METHODS,
    AsyncMethod,
    RpcFailure,
    already_sent,
)

log = logging.getLogger("toolhost.server")

RECV_CHUNK = 1 << 16
MAX_INVOKERS = 8192
MAX_IDLE_INVOKERS = 64
MAX_PENDING_REQUESTS = 65536


class ConnectionLimits(msgspec.Struct, kw_only=True):
    max_frame: int = 16 * 1024 * 1024
    max_queue_bytes: int = 64 * 1024 * 1024


def peer_name(stream: trio.abc.Stream, transport: str) -> str:
    """``unix:pid=1234,uid=1000`` from SO_PEERCRED when available."""
    sock = getattr(stream, "socket", None)
    if sock is not None and hasattr(socket, "SO_PEERCRED"):
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid, uid, _gid = struct.unpack("3i", raw)
            return f"{transport}:pid={pid},uid={uid}"
        except OSError:
            pass
    return transport


class Connection:
    """Serve one client on a byte stream (Unix socket) until it leaves."""

    def __init__(
        self,
        host: Host,
        stream: trio.abc.Stream,
        *,
        limits: ConnectionLimits | None = None,
        name: str = "unix",
    ) -> None:
        self.host = host
        self.stream = stream
        self.limits = limits or ConnectionLimits()
        self.codec = Codec("json")
        self.client_name = name
        self._lines: LineSplitter | None = LineSplitter(self.limits.max_frame)
        self._frames: LengthPrefixSplitter | None = None
        self._switch_to: Encoding | None = None
        self._out: deque[bytes] = deque()
        self._out_bytes = 0
        self._out_event = trio.Event()
        self._drained = trio.Event()
        self._writing = False
        self._nursery: trio.Nursery | None = None
        self._inv_send, self._inv_recv = trio.open_memory_channel[
            tuple[AsyncMethod, RequestId, msgspec.Raw]
        ](math.inf)
        self._invokers = 0
        self._idle = 0
        self._queued = 0
        self._inflight: set[RequestId] = set()
        self._subscribed = False
        self.closed = False
        self.close_reason = ""

    # Session protocol ----------------------------------------------------------------------

    def send(self, frame: bytes) -> None:
        if self.closed:
            return
        self._out.append(frame)
        self._out_bytes += len(frame)
        if self._out_bytes > self.limits.max_queue_bytes:
            self._disconnect(
                f"client is not reading: over {self.limits.max_queue_bytes} bytes queued"
            )
            return
        self._out_event.set()

    def switch_encoding(self, encoding: str) -> None:
        self._switch_to = "msgpack" if encoding == "msgpack" else "json"

    def start_subscription(self) -> None:
        if self._subscribed or self._nursery is None:
            return
        self._subscribed = True
        self._nursery.start_soon(self._forward_changes, self.host.subscribe())

    def call_key(self, request_id: RequestId) -> Any:
        return (id(self), request_id)

    # running -----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                await self._reader()
                nursery.cancel_scope.cancel()
        finally:
            self.closed = True
            with trio.CancelScope(shield=True):
                try:
                    await self.stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass

    def _disconnect(self, reason: str) -> None:
        if not self.closed:
            log.warning("disconnecting %s: %s", self.client_name, reason)
            self.close_reason = reason
        self.closed = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _reader(self) -> None:
        stream = self.stream
        while not self.closed:
            try:
                data = await stream.receive_some(RECV_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return
            if not data:
                return  # the client left: its calls are cancelled with the nursery
            try:
                frames = self._feed(data)
                i = 0
                while i < len(frames):
                    self._handle(frames[i])
                    i += 1
                    if self._switch_to is not None:
                        frames = self._apply_switch(frames[i:])
                        i = 0
            except LineTooLong as exc:
                self.send(
                    self.codec.error(None, "invalid-request", f"frame too large: {exc.message}")
                )
                await self._flush(timeout_s=1.0)
                self._disconnect("oversized frame")
                return

    def _feed(self, data: bytes | bytearray) -> list[bytes]:
        if self._lines is not None:
            return self._lines.feed(data)
        assert self._frames is not None
        return self._frames.feed(data)

    def _apply_switch(self, rest: list[bytes]) -> list[bytes]:
        """Switch framing after ``server.hello``; re-feed bytes that followed the hello."""
        target = self._switch_to
        self._switch_to = None
        if target == self.codec.encoding:
            return rest
        if self._lines is not None:
            leftover = b"".join(f + b"\n" for f in rest) + self._lines.take_pending()
        else:
            assert self._frames is not None
            leftover = b"".join(length_prefixed(f) for f in rest) + bytes(self._frames._buf)
        self.codec = Codec(target or "json")
        if target == "msgpack":
            self._lines, self._frames = None, LengthPrefixSplitter(self.limits.max_frame)
        else:
            self._lines, self._frames = LineSplitter(self.limits.max_frame), None
        return self._feed(leftover) if leftover else []

    def _handle(self, frame: bytes) -> None:
        codec = self.codec
        if self._lines is not None and not frame.strip():
            return
        try:
            req = codec.request(frame)
        except BadFrame as exc:
            self.send(codec.error(exc.request_id, "invalid-request", exc.message))
            return
        rid = req.id
        method = SYNC_METHODS.get(req.method)
        if method is not None:
            try:
                result = method(self, rid, req.params)
            except BadParams as exc:
                self.send(codec.error(rid, "invalid-params", exc.message))
            except RpcFailure as exc:
                self.send(codec.error(rid, exc.code, exc.message, exc.data))
            except Exception as exc:
                log.exception("method %s failed", req.method)
                self.send(
                    codec.error(rid, "internal", f"{req.method}: {type(exc).__name__}: {exc}")
                )
            else:
                if not already_sent(result):
                    self.send(self.codec.response(rid, result))
            return
        amethod = ASYNC_METHODS.get(req.method)
        if amethod is None:
            self.send(codec.error(rid, "unknown-method", f"unknown method {req.method!r}"))
            return
        if rid in self._inflight:
            self.send(
                codec.error(rid, "invalid-request", f"request id {rid!r} is already in flight")
            )
            return
        if len(self._inflight) >= MAX_PENDING_REQUESTS:
            self.send(
                codec.error(rid, "overloaded", "too many requests in flight on this connection")
            )
            return
        self._inflight.add(rid)
        self._queued += 1
        self._inv_send.send_nowait((amethod, rid, req.params))
        if (
            self._queued > self._idle
            and self._invokers < MAX_INVOKERS
            and self._nursery is not None
        ):
            self._invokers += 1
            self._nursery.start_soon(self._invoker)

    async def _invoker(self) -> None:
        recv = self._inv_recv
        try:
            while True:
                self._idle += 1
                try:
                    method, rid, params = await recv.receive()
                finally:
                    self._idle -= 1
                self._queued -= 1
                try:
                    await self._run_async(method, rid, params)
                finally:
                    self._inflight.discard(rid)
                if self._idle >= MAX_IDLE_INVOKERS:
                    return
        finally:
            self._invokers -= 1

    async def _run_async(self, method: AsyncMethod, rid: RequestId, params: msgspec.Raw) -> None:
        try:
            result = await method(self, rid, params)
        except BadParams as exc:
            self.send(self.codec.error(rid, "invalid-params", exc.message))
        except RpcFailure as exc:
            self.send(self.codec.error(rid, exc.code, exc.message, exc.data))
        except Exception as exc:
            log.exception("async method failed")
            self.send(self.codec.error(rid, "internal", f"{type(exc).__name__}: {exc}"))
        else:
            self.send(self.codec.response(rid, result))

    async def _forward_changes(self, recv: trio.MemoryReceiveChannel[Any]) -> None:
        async with recv:
            async for event in recv:
                self.send(self.codec.event("catalog.changed", event))
        if not self.closed:
            self._disconnect("catalog subscription fell behind")

    async def _writer(self) -> None:
        stream = self.stream
        try:
            while True:
                await self._out_event.wait()
                self._out_event = trio.Event()
                if not self._out:
                    continue
                out = self._out
                data = out[0] if len(out) == 1 else b"".join(out)
                out.clear()
                self._out_bytes = 0
                self._writing = True
                await stream.send_all(data)
                self._writing = False
                if not out:
                    self._drained.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self._disconnect("write failed")

    async def _flush(self, timeout_s: float) -> None:
        """Wait (bounded) until the writer has written everything queued."""
        with trio.move_on_after(timeout_s):
            while self._out or self._writing:
                self._drained = trio.Event()
                await self._drained.wait()
