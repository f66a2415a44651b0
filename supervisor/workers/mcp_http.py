"""A worker hosting one remote MCP server over Streamable HTTP (protocol ``mcp-http``).

# Strategy: the worker is a *connection*, not a process. ``run`` opens an MCP session
# (``initialize`` answered with an ``Mcp-Session-Id``, ``notifications/initialized``, every page
# of ``tools/list`` within ``startTimeoutMs``), then serves until it is stopped or the server is
# lost, and ends the session with a ``DELETE``. Every JSON-RPC message is one HTTP/1.1 POST on
# its own TCP connection (h11 over trio; ``Connection: close``, so any number of calls stream at
# once); its answer, a JSON body or an SSE stream carrying progress and then the response, is
# fed to the worker's :class:`~supervisor.workers.mcp_client.McpClient`, the same session the
# stdio worker carries (this module is only its transport). A refused connection, a
# stream cut before its answer, or a ``404`` for our session (the server restarted) ends the
# worker as ``crashed`` (``start-failed`` before ready): the pool's restart policy opens a new
# session when the server is back, and availability reads ``unavailable`` meanwhile. Deadlines
# and ``tools.cancel`` abandon a call: ``notifications/cancelled`` is POSTed and the call's
# stream closed. ``ping`` is the probe. In the handshake era the session's ``GET`` stream is
# kept open too, for what the server sends outside any request (resource updates, list changes).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import trio

from supervisor.calls.call import Call
from supervisor.contracts import wire
from supervisor.protocols import mcp_http
from supervisor.protocols.errors import ProtocolError
from supervisor.protocols.outcome import CallOutcome, preview
from supervisor.workers.base import ExitReason, LaunchSpec, Worker, WorkerExit, WorkerHooks
from supervisor.workers.mcp_client import RELISTEN_BACKOFF_S, McpClient

READ_CHUNK = 1 << 16
DELETE_TIMEOUT_S = 1.0


class Lost(Exception):
    """The HTTP exchange broke: the server is gone or is not an HTTP server."""


class McpHttpWorker(Worker):
    """One session with a remote MCP server (``spec.argv[0]`` is its URL), carrying an
    :class:`~supervisor.workers.mcp_client.McpClient`."""

    TRANSPORT = "tcp"

    def __init__(self, spec: LaunchSpec, hooks: WorkerHooks, index: int = 0) -> None:
        super().__init__(spec, hooks, index)
        self.url = spec.argv[0] if spec.argv else ""
        self.endpoint: mcp_http.Endpoint | None = None
        self._bad_url: str | None = None
        try:
            self.endpoint = mcp_http.parse_url(self.url)
        except mcp_http.BadUrl as exc:
            self._bad_url = str(exc)
        self.extra = mcp_http.extra_headers(spec.init.config if spec.init is not None else {})
        self.session: str | None = None
        self._scopes: dict[int, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        self._over = trio.Event()
        self._exited = trio.Event()
        self.concurrency = max(1, spec.concurrency)
        self.mcp = McpClient(self, spec, "in an HTTP answer")
        self.conn = self.mcp.conn

    @property
    def alive(self) -> bool:
        return self._end is None and not self._over.is_set()

    # lifecycle ---------------------------------------------------------------------------

    async def run(self) -> WorkerExit:
        self.started_at = self.calls.last_active = trio.current_time()
        if self.endpoint is None or self.spec.problem is not None:
            self.state = "exited"
            self._exited.set()
            message = self.spec.problem or f"bad url: {self._bad_url}"
            return WorkerExit(reason="start-failed", message=message)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._handshake)
                await self._over.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                self.state = "exited"
                result = self._exit_record()
                self._fail_calls(result)
                if self.session is not None and result.reason != "crashed":
                    with trio.move_on_after(DELETE_TIMEOUT_S):
                        try:
                            await self._http(None, None)
                        except (Lost, OSError, trio.BrokenResourceError):
                            pass
                self._exited.set()
        return result

    async def _handshake(self) -> None:
        ready = await self.mcp.handshake()
        if ready is not None:
            if self.conn.era == "handshake" and self.session is not None and self._nursery:
                self._nursery.start_soon(self._server_stream)
            self.ready_msg = ready
            await self._became_ready()

    async def _server_stream(self) -> None:
        """The handshake era's ``GET`` stream of the session, where the server sends what
        belongs to no request (``notifications/resources/updated``, ``*/list_changed``), kept
        open while the session lives (reopened, backing off, after it ends; never for a server
        that answers 405: it has none)."""
        backoff = RELISTEN_BACKOFF_S[0]
        while self.alive:
            status: int | None = None
            try:
                status = await self._get()
            except (Lost, OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            except (h11.LocalProtocolError, ValueError):
                return  # a header h11 refuses: the POSTs say so
            if status == 405:
                return
            if status == 200:
                backoff = RELISTEN_BACKOFF_S[0]
            await trio.sleep(backoff)
            backoff = min(backoff * 2, RELISTEN_BACKOFF_S[1])

    async def _request_head(
        self,
        stream: trio.abc.Stream,
        method: str,
        body: bytes | None,
        routing: list[tuple[str, str]] | None,
    ) -> tuple[h11.Connection, h11.Response, dict[str, str]]:
        """Send one request on ``stream`` and read its response head: the HTTP connection (for
        the body), the head, and its header fields by lower-case name.

        Raises:
            Lost: The connection failed, or what came back was not an HTTP response.
        """
        ep = self.endpoint
        assert ep is not None
        h = h11.Connection(h11.CLIENT, max_incomplete_event_size=64 * 1024)
        headers = mcp_http.request_headers(
            ep,
            session=self.session,
            version=self.conn.protocol_version,
            extra=self.extra,
            body=body,
            routing=routing,
        )
        out = h.send(h11.Request(method=method, target=ep.target, headers=headers)) or b""
        if body is not None:
            out += h.send(h11.Data(data=body)) or b""
        out += h.send(h11.EndOfMessage()) or b""
        await stream.send_all(out)
        head = await self._next(h, stream)
        if not isinstance(head, h11.Response):
            raise Lost(f"no HTTP response ({type(head).__name__})")
        fields = {k.decode().lower(): v.decode("latin-1") for k, v in head.headers}
        return h, head, fields

    async def _get(self) -> int:
        """One ``GET`` of the session's stream, fed to the session until it ends; its status."""
        stream = await self._open()
        async with stream:
            h, head, fields = await self._request_head(stream, "GET", None, None)
            if head.status_code != 200:
                return int(head.status_code)
            if not fields.get("content-type", "").startswith("text/event-stream"):
                return 0  # not a stream: try again later, backing off
            await self._sse(h, stream)
            return 200

    def _exit_record(self) -> WorkerExit:
        reason, message = self._end or ("crashed", f"{self.url}: the session ended")
        return self._exit(reason, message)

    def _fail_calls(self, ex: WorkerExit) -> None:
        """The session is over: every call still on it fails with why."""
        code = "protocol-error" if ex.reason == "protocol-error" else "worker-crashed"
        sidecar = self.sidecar

        def outcome(call: Call) -> CallOutcome:
            return CallOutcome(
                ok=False,
                code=code,
                error=f"MCP server {sidecar} ended while running {call.tool}: {ex.message}",
            )

        self.calls.fail_all(outcome)

    def kill(self, reason: ExitReason, message: str) -> None:
        if self._end is None:
            self._end = (reason, message)
        if self.state != "exited":
            self.state = "stopping"
        self._over.set()

    async def stop(self, reason: ExitReason = "stopped", *, drain_s: float = 0.0) -> None:
        await self._drain(reason, drain_s)
        self.state = "stopping"
        self._over.set()
        if self._nursery is not None:
            await self._exited.wait()

    def exceed(self, pid: int, message: str, details: dict[str, Any]) -> None:
        self.kill("quota-exceeded", message)  # never called: a remote server has no process

    def _lost(self, message: str) -> None:
        """The server cannot be reached: end the worker (the restart policy reconnects)."""
        if self.alive:
            reason: ExitReason = "crashed" if self.ready_at is not None else "start-failed"
            self.kill(reason, f"{self.url}: {message}")

    # calls -------------------------------------------------------------------------------

    def start(self, call: Call) -> None:
        got = self.mcp.call_line(call)
        if got is not None:
            rid, line = got
            self.calls.add(rid, call)
            self.send(line, rid)

    def abandon(self, call: Call) -> None:
        slot = self.calls.abandon(call)
        if slot is None:
            return
        line = self.mcp.cancel_line(slot.id)
        if self.conn.era == "modern":
            line = b""  # stateless: closing the call's POST is the cancellation
        if self.alive and self._nursery is not None:
            self._nursery.start_soon(self._cancel, slot.id, line)
        self.calls.release(slot)

    async def _cancel(self, rid: int, line: bytes) -> None:
        """Tell the server, then close the call's stream."""
        if line:
            await self._exchange(line, None)
        self.forget(rid)

    async def ping(self, timeout_s: float) -> wire.Pong | None:
        return await self.mcp.ping(timeout_s)

    # the session's carrier ---------------------------------------------------------------

    def send(self, line: bytes, rid: int | None) -> None:
        assert self._nursery is not None  # a session runs in its nursery
        self._nursery.start_soon(self._exchange, line, rid)

    async def notify(self, line: bytes) -> None:
        await self._exchange(line, None)

    def forget(self, rid: int) -> None:
        scope = self._scopes.get(rid)
        if scope is not None:
            scope.cancel()

    def where(self) -> str:
        return f"{self.url}: "

    def start_soon(self, fn: Callable[[], Awaitable[object]]) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(fn)

    def _receive(self, data: bytes) -> None:
        try:
            self.mcp.receive(data)
        except ProtocolError as exc:
            self.kill("protocol-error", f"protocol error: {exc.message}")

    # HTTP --------------------------------------------------------------------------------

    async def _exchange(self, line: bytes, rid: int | None) -> None:
        """POST one JSON-RPC message and feed its answer to the connection."""
        scope = trio.CancelScope()
        if rid is not None:
            self._scopes[rid] = scope
        problem: str | None = None
        try:
            with scope:
                problem = await self._http(line.rstrip(b"\n"), rid)
            if problem is not None and rid is not None:
                self.mcp.unanswered(rid, problem)
            elif problem is not None:
                self.stderr.write(f"[toolhost] {problem}\n".encode())
        except (Lost, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._lost(str(exc) or type(exc).__name__)
        except (h11.LocalProtocolError, ValueError) as exc:  # e.g. a header value h11 refuses
            # Not str(exc): it may quote a header value, i.e. a secret.
            self._lost(f"cannot send the request ({type(exc).__name__}): check config.headers")
        finally:
            if rid is not None:
                self._scopes.pop(rid, None)
                if self.alive and not scope.cancel_called:
                    self.mcp.unanswered(rid, "the server ended the stream without an answer")

    async def _open(self) -> trio.abc.Stream:
        ep = self.endpoint
        assert ep is not None
        try:
            if ep.tls:
                return await trio.open_ssl_over_tcp_stream(ep.host, ep.port, https_compatible=True)
            return await trio.open_tcp_stream(ep.host, ep.port)
        except OSError as exc:
            raise Lost(f"cannot connect to {ep.host}:{ep.port}: {_why(exc)}") from exc

    async def _http(self, body: bytes | None, rid: int | None) -> str | None:
        """One POST (``body``) or, with None, the session's DELETE.

        Returns:
            None when the answer was fed to the connection (or the message was accepted),
            else what the server said instead (an HTTP error status).

        Raises:
            Lost: The connection failed or broke before the answer was complete.
        """
        stream = await self._open()
        async with stream:
            routing = self.conn.http_headers(rid) if rid is not None else None
            method = "POST" if body is not None else "DELETE"
            h, head, fields = await self._request_head(stream, method, body, routing)
            sid = fields.get(mcp_http.SESSION_HEADER)
            if sid and self.session is None:
                self.session = sid
            status = head.status_code
            if body is None:
                return None
            if status == 404 and self.session is not None:
                raise Lost(f"the server no longer knows session {self.session} (HTTP 404)")
            if status == 202 or (status == 200 and rid is None):
                return None
            if status != 200:
                text = await self._body(h, stream, 4096)
                if rid is not None and mcp_http.answers(text, rid):
                    self._receive(mcp_http.json_line(text))  # a JSON-RPC error, as an HTTP error
                    return None
                return f"HTTP {status} from {self.url}: {preview(text)}"
            if fields.get("content-type", "").startswith("text/event-stream"):
                await self._sse(h, stream)
            else:
                self._receive(mcp_http.json_line(await self._body(h, stream, self.spec.max_line)))
            return None

    async def _next(self, h: h11.Connection, stream: trio.abc.Stream) -> Any:
        while True:
            try:
                event = h.next_event()
            except h11.RemoteProtocolError as exc:
                raise Lost(f"bad HTTP from the server: {exc}") from exc
            if event is h11.NEED_DATA:
                data = bytes(await stream.receive_some(READ_CHUNK))
                try:
                    h.receive_data(data)
                except h11.RemoteProtocolError as exc:
                    raise Lost(f"bad HTTP from the server: {exc}") from exc
                continue
            if isinstance(event, h11.ConnectionClosed):
                raise Lost("the server closed the connection before answering")
            if isinstance(event, h11.InformationalResponse):
                continue
            return event

    async def _body(self, h: h11.Connection, stream: trio.abc.Stream, limit: int) -> bytes:
        data = bytearray()
        while True:
            event = await self._next(h, stream)
            if isinstance(event, h11.EndOfMessage):
                return bytes(data)
            if isinstance(event, h11.Data):
                data += event.data
                if len(data) > limit:
                    raise Lost(f"an answer longer than {limit} bytes")

    async def _sse(self, h: h11.Connection, stream: trio.abc.Stream) -> None:
        parser = mcp_http.SseParser(self.spec.max_line)
        while True:
            event = await self._next(h, stream)
            if isinstance(event, h11.EndOfMessage):
                return
            if isinstance(event, h11.Data):
                try:
                    lines = parser.feed(bytes(event.data))
                except ValueError as exc:
                    raise Lost(str(exc)) from exc
                for line in lines:
                    self._receive(line)


def _why(exc: OSError) -> str:
    """The OS's reason for a failed connect (trio wraps one error per address tried)."""
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup):
        for sub in cause.exceptions:
            if isinstance(sub, OSError) and sub.errno:
                return os.strerror(sub.errno)
    if exc.errno:
        return os.strerror(exc.errno)
    return str(exc)
