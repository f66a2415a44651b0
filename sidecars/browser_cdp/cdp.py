"""A small Chrome DevTools Protocol client: trio-websocket for the socket, msgspec for JSON.

# Strategy: one browser-level WebSocket (``webSocketDebuggerUrl`` from ``GET /json/version``)
# carries every target through flattened sessions (``Target.attachToTarget {flatten: true}``):
# each message names its ``sessionId``. A reader task, started in the sidecar loop's long-lived
# nursery, routes responses to waiting requests by ``id`` and events to subscribers by
# ``(sessionId, method)``. When the socket closes (the browser died), every waiting request
# fails at once with :class:`BrowserGone` and the connection is marked closed; the next call
# opens a new one. Every request waits at most until a caller-given deadline.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec
import trio
from trio_websocket import ConnectionClosed, HandshakeError, WebSocketConnection
from trio_websocket import connect_websocket_url as _connect

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode

MAX_MESSAGE = 256 * 1024 * 1024  # full-page screenshots arrive as one base64 message


class CDPError(Exception):
    """The browser answered a request with a protocol error."""

    def __init__(self, method: str, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{method}: {message} (CDP error {code})")
        self.method = method
        self.code = code
        self.message = message
        self.data = data


GONE_SESSION = "Session with given id not found (the tab was closed)"


def is_gone_session(exc: CDPError) -> bool:
    """Whether the browser refused a request because its session's tab is gone."""
    return "session with given id not found" in exc.message.lower()


class BrowserGone(Exception):
    """The DevTools connection closed (or could not be opened) while a request waited."""


class CDPTimeout(Exception):
    """A request got no answer before its deadline."""

    def __init__(self, method: str) -> None:
        super().__init__(f"{method}: no answer from the browser before the call's deadline")
        self.method = method


class EndpointDown(Exception):
    """``GET /json/version`` on the configured endpoint failed."""


class _Waiter:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None


async def http_get_json(endpoint: str, path: str, *, within: float) -> Any:
    """``GET endpoint+path`` over plain HTTP/1.1 and decode the JSON body.

    Raises:
        EndpointDown: Connection refused, timeout, non-200 status or a body that is not JSON.
    """
    parts = urlsplit(endpoint)
    if parts.scheme != "http" or not parts.hostname:
        raise EndpointDown(f"endpoint {endpoint!r} is not an http://host:port URL")
    port = parts.port or 80
    host_header = parts.netloc
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n"
        "Accept: application/json\r\n\r\n"
    ).encode()
    try:
        with trio.fail_after(within):
            stream = await trio.open_tcp_stream(parts.hostname, port)
            async with stream:
                await stream.send_all(request)
                raw = await _read_response(stream, f"{endpoint}{path}")
    except trio.TooSlowError:
        raise EndpointDown(f"{endpoint}{path}: no answer within {within:.1f}s") from None
    except OSError as exc:
        raise EndpointDown(f"{endpoint}{path}: {exc.strerror or exc}") from None
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = lines[0].split(b" ", 2)
    if len(status) < 2 or status[1] != b"200":
        shown = lines[0].decode("latin-1", "replace")
        raise EndpointDown(f"{endpoint}{path}: HTTP status {shown!r}")
    if any(line.lower().startswith(b"transfer-encoding: chunked") for line in lines[1:]):
        body = _dechunk(body)
    try:
        return _decode(body)
    except msgspec.DecodeError as exc:
        raise EndpointDown(f"{endpoint}{path}: answer is not JSON ({exc})") from None


async def _read_response(stream: trio.SocketStream, shown: str) -> bytes:
    """Read one HTTP response: to ``Content-Length`` when given (the DevTools server keeps the
    connection open), else to EOF."""
    buf = bytearray()
    length: int | None = None
    head_end = -1
    while True:
        if head_end < 0:
            head_end = buf.find(b"\r\n\r\n")
            if head_end >= 0:
                for line in bytes(buf[:head_end]).split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip() or b"0")
        if length is not None and head_end >= 0 and len(buf) >= head_end + 4 + length:
            return bytes(buf[: head_end + 4 + length])
        data = await stream.receive_some(65536)
        if not data:
            return bytes(buf)
        buf += data
        if len(buf) > 4 * 1024 * 1024:
            raise EndpointDown(f"{shown}: answer too large")


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0], 16)
        except ValueError:
            break
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return bytes(out)


def browser_socket_url(endpoint: str, version: Any) -> str:
    """The browser WebSocket URL from ``/json/version``, addressed through ``endpoint``'s host.

    Raises:
        EndpointDown: The answer has no ``webSocketDebuggerUrl``.
    """
    url = version.get("webSocketDebuggerUrl") if isinstance(version, dict) else None
    if not isinstance(url, str) or not url.startswith("ws"):
        raise EndpointDown(f"{endpoint}/json/version has no webSocketDebuggerUrl")
    ws = urlsplit(url)
    return urlunsplit((ws.scheme, urlsplit(endpoint).netloc, ws.path, ws.query, ""))


class Connection:
    """One browser-level CDP WebSocket and the requests and subscriptions on it."""

    def __init__(self, ws: WebSocketConnection, url: str) -> None:
        self.ws = ws
        self.url = url
        self.closed = trio.Event()
        self.close_reason = ""
        self._next_id = 0
        self._waiting: dict[int, tuple[str, _Waiter, str]] = {}  # id -> method, waiter, session
        self._subs: dict[tuple[str, str], list[trio.MemorySendChannel[dict[str, Any]]]] = {}
        self.detached: set[str] = set()  # sessions whose target went away (tab closed)

    @classmethod
    async def open(cls, nursery: trio.Nursery, url: str, *, within: float) -> Connection:
        """Connect to ``url`` and start the reader in ``nursery`` (which outlives the call).

        Raises:
            BrowserGone: The handshake failed or timed out.
        """
        try:
            with trio.fail_after(within):
                ws = await _connect(nursery, url, max_message_size=MAX_MESSAGE)
        except (OSError, HandshakeError, ConnectionClosed, trio.TooSlowError) as exc:
            raise BrowserGone(f"cannot open the DevTools WebSocket {url}: {exc!r}") from None
        conn = cls(ws, url)
        nursery.start_soon(conn._reader)
        return conn

    @property
    def alive(self) -> bool:
        return not self.closed.is_set()

    async def _reader(self) -> None:
        try:
            while True:
                message = await self.ws.get_message()
                try:
                    msg = _decode(message)
                except msgspec.DecodeError:
                    continue
                if not isinstance(msg, dict):
                    continue
                if "id" in msg:
                    entry = self._waiting.pop(msg["id"], None)
                    if entry is None:
                        continue
                    method, waiter, _session = entry
                    err = msg.get("error")
                    if isinstance(err, dict):
                        waiter.error = CDPError(
                            method,
                            int(err.get("code", 0)),
                            str(err.get("message", "")),
                            err.get("data"),
                        )
                    else:
                        waiter.result = msg.get("result", {})
                    waiter.done.set()
                elif "method" in msg:
                    if msg["method"] == "Target.detachedFromTarget":
                        self._detach(str((msg.get("params") or {}).get("sessionId")))
                    key = (msg.get("sessionId", ""), msg["method"])
                    for chan in list(self._subs.get(key, ())):
                        try:
                            chan.send_nowait(msg)
                        except (
                            trio.WouldBlock,
                            trio.BrokenResourceError,
                            trio.ClosedResourceError,
                        ):
                            pass
        except ConnectionClosed as exc:
            self._shut(f"DevTools connection closed ({exc.reason})")
        except Exception as exc:  # never let a bad frame take the sidecar's loop down
            self._shut(f"DevTools connection reader failed: {exc!r}")
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                await self.ws.aclose()
        finally:
            if self.alive:
                self._shut("DevTools connection reader stopped")

    def _detach(self, session: str) -> None:
        """The session's tab is gone: its waiting requests fail now (Chromium never answers
        them) and its event streams end."""
        self.detached.add(session)
        for rid, (method, waiter, waiting_session) in list(self._waiting.items()):
            if waiting_session == session:
                del self._waiting[rid]
                waiter.error = CDPError(method, -32001, GONE_SESSION)
                waiter.done.set()
        for key in [k for k in self._subs if k[0] == session]:
            for chan in self._subs.pop(key):
                chan.close()

    def _shut(self, reason: str) -> None:
        if self.closed.is_set():
            return
        self.close_reason = reason
        self.closed.set()
        waiting, self._waiting = self._waiting, {}
        for method, waiter, _session in waiting.values():
            waiter.error = BrowserGone(f"{method}: {reason}")
            waiter.done.set()
        # Event subscribers see their stream end (and then check ``alive``).
        subs, self._subs = self._subs, {}
        for chans in subs.values():
            for chan in chans:
                chan.close()

    async def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        deadline: float = math.inf,
    ) -> Any:
        """Send one request and wait for its result, at most until ``deadline`` (trio time).

        Raises:
            CDPError: The browser refused the request.
            BrowserGone: The connection closed before the answer.
            CDPTimeout: No answer before ``deadline``.
        """
        if not self.alive:
            raise BrowserGone(f"{method}: {self.close_reason}")
        self._next_id += 1
        rid = self._next_id
        body: dict[str, Any] = {"id": rid, "method": method, "params": params or {}}
        if session:
            body["sessionId"] = session
        waiter = _Waiter()
        self._waiting[rid] = (method, waiter, session or "")
        try:
            with trio.move_on_at(deadline) as scope:
                try:
                    await self.ws.send_message(_encode(body).decode())
                except ConnectionClosed as exc:
                    self._shut(f"DevTools connection closed ({exc.reason})")
                    raise BrowserGone(f"{method}: {self.close_reason}") from None
                await waiter.done.wait()
            if scope.cancelled_caught:
                raise CDPTimeout(method)
        finally:
            self._waiting.pop(rid, None)
        if waiter.error is not None:
            if session and isinstance(waiter.error, CDPError) and is_gone_session(waiter.error):
                self.detached.add(session)
            raise waiter.error
        return waiter.result

    @contextmanager
    def subscribe(
        self, session: str, *methods: str, size: int = 64
    ) -> Iterator[trio.MemoryReceiveChannel[dict[str, Any]]]:
        """Receive the events ``methods`` on ``session`` (whole messages) for the block.

        Subscribe before sending the request that causes the events, so none is missed.
        """
        send, receive = trio.open_memory_channel[dict[str, Any]](size)
        keys = [(session, m) for m in methods]
        for key in keys:
            self._subs.setdefault(key, []).append(send)
        try:
            yield receive
        finally:
            for key in keys:
                subs = self._subs.get(key, [])
                if send in subs:
                    subs.remove(send)
                if not subs:
                    self._subs.pop(key, None)
            send.close()

    async def aclose(self) -> None:
        """Close the socket (the reader then ends)."""
        self._shut("closed by the sidecar")
        with trio.move_on_after(1):
            await self.ws.aclose()
