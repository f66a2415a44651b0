"""The MCP client session (PROTOCOL 3.4) both MCP workers run, over the transport they carry.

# Strategy: :class:`McpClient` is the session on one sans-IO
# :class:`~supervisor.protocols.mcp.McpConnection`: ``server/discover`` first (waiting at most
# min(10 s, half the start timeout); a stateless answer opens the modern era, with
# ``subscriptions/listen`` kept open for change notifications and ``server/discover`` as the
# probe), else ``initialize`` then ``notifications/initialized`` (a server that died while the
# probe was pending is remembered as handshake-only, so a legacy server that exits on an unknown
# method does not crash-loop), and every page of ``tools/list`` within ``startTimeoutMs`` (the
# tools become the worker's ``ready`` message, so pools and the catalog treat an MCP server like
# any sidecar), calls as ``tools/call`` on the worker's slots keyed by request id (also the
# progress token), ``ping`` (handshake era) as the probe, the tool list re-read after
# ``tools/list_changed``, requests the server sends answered. It is composed, not inherited: the
# stdio worker (``mcp.py``, lines on a pipe) and the Streamable HTTP worker (``mcp_http.py``, a
# POST per message) each own one and are its :class:`McpCarrier`, which says how a message
# leaves (``send``, ``notify``) and how the worker ends (``kill``). Everything the server says
# comes back through :meth:`McpClient.receive`, whatever carried it. Resources, templates and
# prompts are listed into :attr:`McpClient.offer` at start and on list_changed (then
# ``on_offer``); the host's resource subscriptions for this server are
# :attr:`McpClient.subscriptions` (``resources/subscribe`` in the handshake era, the listen
# stream's ``resourceSubscriptions`` in the stateless era), their updates go to ``on_updated``;
# a request the host stops waiting for (deadline, or its asker cancelled) is announced with
# ``notifications/cancelled`` as a ``tools/call`` is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Protocol

import trio

import supervisor
from supervisor.calls.call import Call
from supervisor.contracts import mcp as mcp_types
from supervisor.contracts import wire
from supervisor.processes.child import StderrRing
from supervisor.protocols import mcp as proto
from supervisor.protocols.errors import ProtocolError
from supervisor.protocols.outcome import CallOutcome
from supervisor.workers.base import ExitReason, LaunchSpec, WorkerState
from supervisor.workers.slots import SlotTable

DISCOVER_MAX_S = 10.0
"""``server/discover`` waits at most this long (and at most half the start timeout) before the
session falls back to the handshake."""
RELISTEN_BACKOFF_S = (0.05, 5.0)
"""``subscriptions/listen`` is opened again after its stream ends, backing off between these."""
HANDSHAKE_ONLY: dict[tuple[str, tuple[str, ...]], bool] = {}
"""Sidecars (by id and argv) whose server ended while ``server/discover`` was pending: a legacy
server that exits on a method it does not know before ``initialize``. Their next sessions skip
the probe, so they never crash-loop on it (a process-wide memory; a new command probes again)."""
MAX_TOOL_PAGES = 100
"""A server that keeps answering ``nextCursor`` past this many pages is broken."""
INTERNAL_ERROR = -32603
CANCELLED = "the host stopped waiting (deadline or tools.cancel)"


Request = Callable[[int, bytes], Awaitable["proto.Response | None"]]


async def list_tools(conn: proto.McpConnection, request: Request) -> list[wire.ToolInfo] | None:
    """Every page of ``tools/list`` through ``request`` (None if the worker ended meanwhile).

    Raises:
        RequestFailed: The server answered ``tools/list`` with an error.
        ProtocolError: A page is malformed or pagination does not end.
    """
    server = conn.server
    if server is not None and server.capabilities.tools is None:
        return []  # the server offers no tools: ready, serving nothing
    tools: list[wire.ToolInfo] = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        response = await request(*conn.list_tools(cursor))
        if response is None:
            return None
        page, cursor = proto.tools_page(response)
        tools.extend(page)
        if cursor is None:
            return tools
    raise ProtocolError(f"tools/list did not end after {MAX_TOOL_PAGES} pages")


class Relister:
    """Re-reads an MCP server's tool list after ``tools/list_changed``, coalescing bursts (one
    run at a time; a change during a run makes it read once more).
    """

    def __init__(
        self,
        list_all: Callable[[], Awaitable[list[wire.ToolInfo] | None]],
        timeout_s: float,
        *,
        on_tools: Callable[[list[wire.ToolInfo]], None],
        on_broken: Callable[[str], None],
        log: Callable[[bytes], object],
    ) -> None:
        self._list_all = list_all
        self._timeout_s = timeout_s
        self._on_tools = on_tools
        self._on_broken = on_broken
        self._log = log
        self._running = False
        self._again = False

    async def run(self) -> None:
        if self._running:
            self._again = True
            return
        self._running = True
        try:
            while True:
                self._again = False
                tools: list[wire.ToolInfo] | None = None
                try:
                    with trio.move_on_after(self._timeout_s):
                        tools = await self._list_all()
                except proto.RequestFailed as exc:
                    self._log(f"[toolhost] tools/list after list_changed: {exc}\n".encode())
                except ProtocolError as exc:
                    self._on_broken(exc.message)
                    return
                if tools is not None:
                    self._on_tools(tools)
                if not self._again:
                    return
        finally:
            self._running = False


class McpCarrier(Protocol):
    """What the session needs of the worker that carries it."""

    TRANSPORT: str
    """``network.transport`` of the MCP client spans (``pipe``, ``tcp``)."""
    session: str | None
    """The transport's session id (Streamable HTTP), for the MCP client spans."""
    sidecar: str
    pid: int | None
    state: WorkerState
    concurrency: int
    stderr: StderrRing
    calls: SlotTable

    @property
    def alive(self) -> bool: ...

    def kill(self, reason: ExitReason, message: str) -> None: ...

    def tools_changed(self, tools: list[wire.ToolInfo]) -> None: ...

    def send(self, line: bytes, rid: int | None) -> None:
        """Send a message now; the answer to request ``rid`` (if any) comes back through
        :meth:`McpClient.receive`."""

    async def notify(self, line: bytes) -> None:
        """Send a notification and return once it is delivered."""

    def forget(self, rid: int) -> None:
        """Request ``rid`` will not be waited for any more (a ping that timed out)."""

    def where(self) -> str:
        """What start failures are prefixed with (the server's URL for a remote one)."""

    def start_soon(self, fn: Callable[[], Awaitable[object]]) -> None:
        """Run ``fn`` in the worker's nursery (nothing once it has none)."""


class McpClient:
    """One MCP client session carried by ``carrier``.

    Args:
        carrier: The worker that owns the session and moves its messages.
        spec: The worker's launch spec (line limit, start timeout).
        channel: Where server messages come from, for protocol errors (``on stdout``).
    """

    def __init__(self, carrier: McpCarrier, spec: LaunchSpec, channel: str) -> None:
        self.carrier = carrier
        self.calls = carrier.calls
        self.conn = proto.McpConnection(
            max_line=spec.max_line,
            client_name="toolhost",
            client_version=supervisor.__version__,
            channel=channel,
            routes=carrier.TRANSPORT != "pipe",  # HTTP's routing headers; stdio has none
        )
        self.start_timeout_s = spec.start_timeout_s
        self._era_key = (spec.sidecar, tuple(spec.argv))
        self.offer: dict[str, list[dict[str, object]]] = {}
        """What the server offers besides tools, as it gave them, kept current on its change
        notifications: ``resources``, ``resourceTemplates``, ``prompts`` (absent: none)."""
        self.subscriptions: set[str] = set()
        """Resource URIs the host subscribed to (``resources/subscribe``)."""
        self.on_offer: Callable[[], None] | None = None
        """Called when :attr:`offer` changed after ready (the host's list_changed)."""
        self.on_updated: Callable[[str], None] | None = None
        """Called with the URI of a subscribed resource the server says changed."""
        self._listen_backoff = RELISTEN_BACKOFF_S[0]
        self._listen_rid: int | None = None
        self.relist = Relister(
            self.list_tools,
            spec.start_timeout_s,
            on_tools=carrier.tools_changed,
            on_broken=self._broke,
            log=carrier.stderr.write,
        )

    # lifecycle ---------------------------------------------------------------------------

    async def handshake(self) -> wire.Ready | None:
        """Open the session within the start timeout: the server's ``ready``, or None when the
        worker ended (it was killed with why, if that was the session's doing)."""
        carrier = self.carrier
        timeout = self.start_timeout_s
        tools: list[wire.ToolInfo] | None = None
        failure: str | None = None
        with trio.move_on_after(timeout):
            try:
                modern = await self._discover(min(DISCOVER_MAX_S, timeout / 2))
                if modern is None:
                    return None
                if not modern:
                    response = await self.request(*self.conn.initialize())
                    if response is None:
                        return None
                    # A server slow to start answers the discover given up on, then refuses
                    # the initialize: it speaks the stateless era after all.
                    if response.error is None or not self.conn.take_late_discovery():
                        await carrier.notify(self.conn.initialized(response))
                tools = await self.list_tools()
            except proto.RequestFailed as exc:
                failure = str(exc)
            except ProtocolError as exc:
                self._broke(exc.message)
                return None
        if tools is None or failure is not None:
            HANDSHAKE_ONLY.pop(self._era_key, None)  # a start that failed probes again next time
        if failure is not None:
            carrier.kill("start-failed", f"{carrier.where()}{failure}")
            return None
        if tools is None:
            if carrier.alive:
                ms = int(timeout * 1000)
                carrier.kill(
                    "start-timeout",
                    f"{carrier.where()}no answer to initialize and tools/list within "
                    f"startTimeoutMs={ms}",
                )
            return None
        with trio.move_on_after(timeout):
            try:
                await self.read_offer()
            except (proto.RequestFailed, ProtocolError) as exc:  # tools still served
                carrier.stderr.write(f"[toolhost] resources/prompts: {exc}\n".encode())
        server = self.conn.server
        info = server.serverInfo if server is not None else None
        if self.conn.era == "modern":
            self.listen()
        else:
            for uri in sorted(self.subscriptions):
                carrier.start_soon(partial(self._subscribe, "resources/subscribe", uri))
        return wire.Ready(
            name=info.name if info else "",
            version=info.version if info else "",
            concurrency=carrier.concurrency,
            tools=tools,
        )

    async def _discover(self, wait_s: float) -> bool | None:
        """``server/discover`` first: True when the server answered in a stateless revision
        (the session is ready), False for the handshake, None when the worker ended.

        Raises:
            RequestFailed: The server speaks only stateless revisions, none of ours.
        """
        key = self._era_key
        if HANDSHAKE_ONLY.get(key):
            return False
        conn, carrier = self.conn, self.carrier
        rid, line = conn.discover()
        # A process is remembered until it answers or outlives the wait: if it dies meanwhile
        # (the worker's nursery ends this task), its next session skips the probe. (A remote
        # server that cannot be reached says nothing about its era.)
        if carrier.TRANSPORT == "pipe":
            HANDSHAKE_ONLY[key] = True
        carrier.send(line, rid)
        response: proto.Response | None = await self.calls.wait_for(rid, wait_s)
        if response is None:
            if not carrier.alive:
                return None
            HANDSHAKE_ONLY.pop(key, None)
            conn.abandon_discover()  # never cancelled: the specification asks so
            carrier.forget(rid)
            return False
        HANDSHAKE_ONLY.pop(key, None)
        return conn.discovered(response)

    async def read_offer(self, kinds: tuple[str, ...] = ("resources", "prompts")) -> None:
        """List what the capabilities say the server has (``kinds``) into :attr:`offer`."""
        server = self.conn.server
        caps = server.capabilities if server is not None else None
        if caps is None:
            return
        lists = []
        if "resources" in kinds and caps.resources is not None:
            lists += [
                ("resources/list", "resources"),
                ("resources/templates/list", "resourceTemplates"),
            ]
        if "prompts" in kinds and caps.prompts is not None:
            lists.append(("prompts/list", "prompts"))
        for method, key in lists:
            items: list[dict[str, object]] = []
            cursor: str | None = None
            for _ in range(MAX_TOOL_PAGES):
                params: dict[str, object] = {} if cursor is None else {"cursor": cursor}
                response = await self.request(*self.conn.ask(method, params))
                if response is None:
                    return
                if response.error is not None and response.error.code == mcp_types.METHOD_NOT_FOUND:
                    break  # e.g. no templates
                page, cursor = proto.list_page(response, key)
                items.extend(page)
                if cursor is None:
                    break
            self.offer[key] = items

    async def _reoffer(self, kind: str) -> None:
        with trio.move_on_after(self.start_timeout_s):
            try:
                await self.read_offer((kind,))
            except (proto.RequestFailed, ProtocolError) as exc:
                self.carrier.stderr.write(f"[toolhost] {kind} after list_changed: {exc}\n".encode())
                return
        if self.on_offer is not None:
            self.on_offer()

    async def ask(
        self, method: str, params: dict[str, object], name: str | None, timeout_s: float
    ) -> proto.Response | None:
        """One request of a ready session, answered within ``timeout_s`` (None: not ready, no
        answer in time, or the worker ended)."""
        carrier = self.carrier
        if not carrier.alive or self.conn.state != "ready":
            return None
        rid, line = self.conn.ask(method, params, name)
        carrier.send(line, rid)
        response: proto.Response | None = None
        try:
            response = await self.calls.wait_for(rid, timeout_s)
        finally:
            if response is None:  # no answer in time, or the asker was cancelled
                self._abandon(rid, CANCELLED)
        return response

    def ask_soon(
        self,
        method: str,
        params: dict[str, object],
        name: str | None,
        on_response: Callable[[proto.Response | None], None],
    ) -> int | None:
        """Send one request of a ready session; ``on_response`` is called with its answer from
        the reader (None when the worker ends; never before this returns) and no task waits.
        The request id (for :meth:`abandon`), or None with nothing sent when the session is not
        ready."""
        carrier = self.carrier
        if not carrier.alive or self.conn.state != "ready":
            return None
        rid, line = self.conn.ask(method, params, name)
        self.calls.when_resolved(rid, on_response)
        carrier.send(line, rid)
        return rid

    def abandon(self, rid: int) -> None:
        """Stop waiting for :meth:`ask_soon`'s request ``rid`` (no answer in time, or the asker
        cancelled it): the server is told, as for :meth:`ask`."""
        self.calls.forget(rid)
        self._abandon(rid, CANCELLED)

    def _abandon(self, rid: int, reason: str) -> None:
        """Stop waiting for request ``rid``: ``notifications/cancelled`` is sent when the
        transport cancels that way (stdio in both eras, the handshake era over HTTP; a
        stateless HTTP request is cancelled by closing its POST), then its stream is closed."""
        carrier = self.carrier
        line = self.conn.cancel(rid, reason)
        if (
            line
            and carrier.alive
            and not (carrier.TRANSPORT == "tcp" and self.conn.era == "modern")
        ):
            carrier.send(line, None)
        carrier.forget(rid)

    # resource subscriptions ---------------------------------------------------------------

    def sync_subscriptions(self, uris: set[str]) -> None:
        """Subscribe the server to exactly ``uris`` (the host's subscriptions it owns). Before
        ready only the set changes (the session subscribes when it opens); in the handshake
        era each change is a ``resources/subscribe`` / ``resources/unsubscribe`` (when the
        server says it supports them); in the stateless era the listen stream is reopened
        with the new ``resourceSubscriptions``."""
        added, removed = uris - self.subscriptions, self.subscriptions - uris
        if not added and not removed:
            return
        self.subscriptions = set(uris)
        carrier = self.carrier
        if not carrier.alive or self.conn.state != "ready":
            return
        if self.conn.era == "modern":
            old, self._listen_rid = self._listen_rid, None
            if old is not None:
                self._abandon(old, "the host's resource subscriptions changed")
            self.listen()
            return
        for uri in sorted(added):
            carrier.start_soon(partial(self._subscribe, "resources/subscribe", uri))
        for uri in sorted(removed):
            carrier.start_soon(partial(self._subscribe, "resources/unsubscribe", uri))

    async def _subscribe(self, method: str, uri: str) -> None:
        server = self.conn.server
        caps = server.capabilities.resources if server is not None else None
        if not caps or not caps.get("subscribe"):
            return  # updates the server sends anyway are still routed
        response = await self.ask(method, {"uri": uri}, uri, self.start_timeout_s)
        if response is not None and response.error is not None:
            text = f"[toolhost] {method} {uri}: {response.error.message}\n"
            self.carrier.stderr.write(text.encode())

    def listen(self) -> None:
        """Open ``subscriptions/listen`` (stateless era) without waiting: change notifications
        come on its stream; its answer means the stream ended (:meth:`_relisten`)."""
        carrier = self.carrier
        if carrier.alive and self.conn.state == "ready":
            rid, line = self.conn.listen(subscriptions=tuple(sorted(self.subscriptions)))
            self._listen_rid = rid
            carrier.send(line, rid)

    async def _relisten(self, failed: bool) -> None:
        if failed:
            await trio.sleep(self._listen_backoff)
            self._listen_backoff = min(self._listen_backoff * 2, RELISTEN_BACKOFF_S[1])
        else:
            self._listen_backoff = RELISTEN_BACKOFF_S[0]
            await trio.sleep(self._listen_backoff)
        if self._listen_rid is None:  # not reopened meanwhile (the subscriptions changed)
            self.listen()

    async def request(self, rid: int, line: bytes) -> proto.Response | None:
        """Send a request and wait for its response (None if the worker ended first)."""
        self.carrier.send(line, rid)
        response: proto.Response | None = await self.calls.wait_for(rid, float("inf"))
        return response

    async def list_tools(self) -> list[wire.ToolInfo] | None:
        return await list_tools(self.conn, self.request)

    def _broke(self, message: str) -> None:
        self.carrier.kill("protocol-error", f"protocol error: {message}")

    # calls -------------------------------------------------------------------------------

    def call_line(self, call: Call) -> tuple[int, bytes] | None:
        """The ``tools/call`` request of ``call``; None (and the call failed) when the session
        is not ready."""
        carrier = self.carrier
        if not carrier.alive or self.conn.state != "ready":
            call.ended(
                CallOutcome(
                    ok=False,
                    code="worker-crashed",
                    error=f"MCP server {carrier.sidecar} is not ready ({self.conn.state})",
                    pid=carrier.pid,
                )
            )
            return None
        traceparent = None
        if call.trace is not None:  # an MCP CLIENT span; its traceparent goes in _meta
            traceparent = call.trace.mcp_client(call, carrier.TRANSPORT, carrier.session)
        return self.conn.call_tool(
            call.tool,
            call.input_raw,
            progress=call.on_progress is not None,
            traceparent=traceparent,
        )

    def cancel_line(self, rid: int) -> bytes:
        """``notifications/cancelled`` for an abandoned call (its answer will be dropped)."""
        return self.conn.cancel(rid, CANCELLED)

    async def ping(self, timeout_s: float) -> wire.Pong | None:
        carrier = self.carrier
        if not carrier.alive or self.conn.state != "ready":
            return None
        rid, line = self.conn.probe()
        carrier.send(line, rid)
        response = await self.calls.wait_for(rid, timeout_s)
        if response is None:
            self.conn.cancel(rid, "ping timed out")
            carrier.forget(rid)
            return None
        # An error answer still proves the server is alive and reading.
        return wire.Pong(id=str(rid), status="healthy")

    # server -> host ----------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Handle bytes the server sent (a chunk of stdout, an HTTP body, an SSE event).

        Raises:
            ProtocolError: The server broke the protocol (what came before it was handled).
        """
        dispatch = self.dispatch
        try:
            events = self.conn.feed(data)
        except ProtocolError as exc:
            for event in exc.accepted:
                dispatch(event)
            raise
        for event in events:
            dispatch(event)

    def dispatch(self, event: proto.Event) -> None:
        carrier = self.carrier
        if type(event) is proto.Response:
            if event.method == "tools/call":
                outcome = proto.call_answer(event)
                outcome.pid = carrier.pid
                self.calls.answer(event.id, outcome)
            elif event.method == "subscriptions/listen":
                if event.id == self._listen_rid:
                    self._listen_rid = None
                if carrier.alive:  # the stream ended: listen again (backing off after errors)
                    failed = event.error is not None
                    carrier.start_soon(lambda: self._relisten(failed))
            else:
                self.calls.resolve(event.id, event)
        elif type(event) is proto.Progress:
            self.calls.progress(event.id, event.payload)
        elif type(event) is proto.Reply:
            carrier.send(event.data, None)
        elif type(event) is proto.ToolsChanged:
            if carrier.state == "ready":
                carrier.start_soon(self.relist.run)
        elif type(event) is proto.ListChanged:
            if carrier.state == "ready":
                kind = event.kind
                carrier.start_soon(lambda: self._reoffer(kind))
        elif type(event) is proto.ResourceUpdated:
            if self.on_updated is not None and event.uri in self.subscriptions:
                self.on_updated(event.uri)
        elif type(event) is proto.Log:
            carrier.stderr.write(event.text.encode("utf-8", "replace") + b"\n")

    def unanswered(self, rid: int, message: str) -> None:
        """Request ``rid`` got no JSON-RPC answer (its HTTP exchange ended without one): it
        ends with an internal error."""
        method = self.conn.pending.get(rid)
        if method is None:
            return
        self.conn.cancel(rid, message)
        error = mcp_types.RpcErrorInfo(code=INTERNAL_ERROR, message=message)
        self.dispatch(proto.Response(id=rid, method=method, error=error))
