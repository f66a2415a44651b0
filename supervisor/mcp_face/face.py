"""The MCP face of the host: one MCP session driven through one kernel-protocol connection.

# Strategy: ``toolhost mcp`` is a *client of the kernel protocol*, not a second invoke path.
# Every MCP session owns one kernel connection (the host's Unix socket, or an in-memory link into
# an in-process host: ``--embedded``, a session ``toolhost serve`` adopted; stateless HTTP
# requests share one per client name), so a
# ``tools/call`` is a ``tools.invoke`` and passes every gate a kernel call passes (visibility,
# sandbox and approval, quotas, deadlines, audit, accounting). ``tools/list`` is ``tools.list``
# in the ``mcp`` format (only model-visible tools); ``notifications/cancelled`` is
# ``tools.cancel``; a progress token turns on ``stream`` and every ``tool.progress`` event
# becomes ``notifications/progress``; a ``catalog.changed`` subscription calls back when the
# *visible* list really changed (the transport sends ``notifications/tools/list_changed`` in the
# era the client speaks), and so do the ``offers.changed`` (hosted resources, prompts) and
# ``resource.updated`` events of the same kernel connection (``resources/subscribe`` and a
# listen stream's ``resourceSubscriptions`` are ``resources.subscribe`` on it). A client's
# profile (:mod:`supervisor.mcp_face.profiles`) filters what
# it is listed and refuses a call outside it with an MCP error naming the profile, before the
# host is asked. The wire side (framing, both eras, result shapes) is
# :mod:`supervisor.protocols.mcp_server`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio

from supervisor.client import Client, ConnectionLost, RpcError
from supervisor.contracts import mcp
from supervisor.contracts.envelope import Envelope
from supervisor.contracts.rpc import InvokeParams, TraceContext
from supervisor.mcp_face.profiles import Profile
from supervisor.protocols.mcp_pages import PAGE_SIZE, BadCursor, paginate
from supervisor.protocols.mcp_results import call_result, progress_fields
from supervisor.protocols.mcp_server import (
    CallTool,
    Cancelled,
    Forward,
    Line,
    McpServerConnection,
)
from supervisor.server.link import FrameLink

log = logging.getLogger("toolhost.mcp")

Notify = Callable[[Line], None]
OnChange = Callable[[str], None]
"""Called with the kind of list that changed: ``tools``, ``resources`` or ``prompts``."""
OnUpdated = Callable[[str], None]
"""Called with the URI of a subscribed resource that changed."""
_IDENT = {"resources": "uri", "resourceTemplates": "uriTemplate", "prompts": "name"}
_RESOURCE_METHODS = ("resources/read", "resources/subscribe", "resources/unsubscribe")
Connect = Callable[[], Awaitable[trio.abc.Stream | FrameLink]]
"""Opens a fresh kernel connection (one per MCP session): a socket, or an in-memory link to a
host in this process."""

_RPC_TO_MCP = {"invalid-params": mcp.INVALID_PARAMS, "invalid-request": mcp.INVALID_REQUEST}
RESOURCE_NOT_FOUND = -32002
"""MCP's error for a resource no server has."""
_LISTS = {
    "resources/list": ("resources", "resources_of"),
    "resources/templates/list": ("resourceTemplates", "templates_of"),
    "prompts/list": ("prompts", "prompts_of"),
}


def unix_connector(path: str) -> Connect:
    """Kernel connections to a running host's socket."""

    async def connect() -> trio.SocketStream:
        return await trio.open_unix_socket(path)

    return connect


def embedded_connector(host: Any, nursery: trio.Nursery) -> Connect:
    """Kernel connections into an in-process host (in memory: :func:`backend_connector`)."""
    from supervisor.server.backend import Backend

    return backend_connector(Backend.of(host), nursery)


def backend_connector(backend: Any, nursery: trio.Nursery, name: str = "mcp-embedded") -> Connect:
    """Kernel connections to ``backend`` (a :class:`~supervisor.server.backend.Backend` of a
    host in this process), each an in-memory link served in ``nursery`` by a
    :class:`~supervisor.server.memory.MemoryConnection` named ``name`` (``--embedded``, and the
    sessions ``toolhost serve`` adopts): whole frames, no socket."""
    from supervisor.server.memory import MemoryConnection

    async def connect() -> FrameLink:
        server = MemoryConnection(backend, name)
        nursery.start_soon(server.run)
        return server.link

    return connect


def _note(event: Any, on_change: OnChange, on_updated: OnUpdated | None) -> bool:
    """Hand a kernel event to the face's callbacks; True for a ``catalog.changed`` (the visible
    tools must be listed again)."""
    name = event.get("event")
    data = event.get("data")
    data = data if isinstance(data, dict) else {}
    if name == "resource.updated":
        uri = data.get("uri")
        if on_updated is not None and isinstance(uri, str):
            on_updated(uri)
    elif name == "offers.changed":
        for kind in data.get("kinds") or []:
            if kind in ("resources", "prompts"):
                on_change(kind)
    return name == "catalog.changed"


def _fingerprint(tools: list[Any]) -> bytes:
    return msgspec.json.encode(sorted(tools, key=lambda t: str(t.get("name"))))


class McpFace:
    """One MCP session's calls, made on ``kernel``; tasks (cancels) go to ``nursery``."""

    def __init__(
        self,
        conn: McpServerConnection,
        kernel: Client,
        nursery: trio.Nursery,
        *,
        tracing: Any = None,
        transport: str = "pipe",
        session_id: str | None = None,
        profile: Profile | None = None,
    ) -> None:
        self.conn = conn
        self.kernel = kernel
        self._nursery = nursery
        self.tracing = tracing
        """``supervisor.telemetry.tracing.Tracing`` for MCP server spans, or None (then a
        ``_meta.traceparent`` still reaches the host as the kernel request's ``trace``)."""
        self.transport = transport
        """``network.transport``: ``pipe`` (stdio) or ``tcp`` (Streamable HTTP)."""
        self.session_id = session_id
        self.profile = profile
        """What this client may see and call (None: every model-visible tool); a reload may
        replace it."""
        self._calls: dict[mcp.RequestId, int] = {}
        self._cancelled: set[mcp.RequestId] = set()
        self._visible: bytes | None = None
        self.page_size = PAGE_SIZE
        """Items per page of the lists (``nextCursor`` past it)."""

    async def _tools(self) -> list[Any]:
        tools: list[Any] = await self.kernel.tools("mcp")
        profile = self.profile
        return tools if profile is None else profile.tools_of(tools)

    async def list_tools(self, rid: mcp.RequestId, cursor: str | None = None) -> Line:
        """The ``tools/list`` answer: the model-visible tools of the profile, as MCP tools, the
        page ``cursor`` starts (:attr:`page_size` a page)."""
        try:
            tools = await self._tools()
        except (RpcError, ConnectionLost) as exc:
            return self.conn.error(rid, mcp.INTERNAL_ERROR, f"toolhost: {exc}")
        self._visible = _fingerprint(tools)
        try:
            page, following = paginate(tools, cursor, "name", self.page_size)
        except BadCursor as exc:
            return self.conn.error(rid, mcp.INVALID_PARAMS, str(exc))
        return self.conn.tools_page(rid, page, following)

    def call_now(
        self, ev: CallTool, write: Notify, on_end: Callable[[], None] | None = None
    ) -> bool:
        """Start ``tools/call`` with no task of its own (stdio): the ``tools.invoke`` goes out
        now and the answer is written from the kernel connection's reader, what
        :meth:`call_tool` would answer (nothing when the client cancelled it); ``on_end`` is
        called once the call is over (answered, failed or cancelled; at once when refused
        here). False, with nothing done, when the call needs :meth:`call_tool`'s task: progress
        asked for, or MCP server spans on."""
        if ev.progress_token is not None or self.tracing is not None:
            return False
        conn = self.conn
        profile = self.profile
        rid = ev.id
        refusal = None
        if profile is not None and not profile.allows("tool", ev.name):
            message = profile.refusal("tool", ev.name)
            refusal = conn.error(rid, mcp.INVALID_PARAMS, message, {"profile": profile.name})
        elif rid in self._calls:
            refusal = conn.error(rid, mcp.INVALID_REQUEST, f"request id {rid!r} is in flight")
        if refusal is not None:
            write(refusal)
            if on_end is not None:
                on_end()
            return True
        krid = self.kernel.new_id()
        self._calls[rid] = krid
        trace = None
        if ev.traceparent:
            trace = TraceContext(traceparent=ev.traceparent, tracestate=ev.tracestate or None)
        params = InvokeParams(tool=ev.name, input=ev.arguments, trace=trace)

        def answered(envelope: Envelope | None, error: BaseException | None) -> None:
            self._calls.pop(rid, None)
            try:
                _answer(envelope, error)
            finally:
                if on_end is not None:
                    on_end()

        def _answer(envelope: Envelope | None, error: BaseException | None) -> None:
            if isinstance(error, RpcError):
                self._cancelled.discard(rid)
                code = _RPC_TO_MCP.get(error.code, mcp.INTERNAL_ERROR)
                write(conn.error(rid, code, error.message, {"code": error.code}))
            elif error is not None:
                self._cancelled.discard(rid)
                write(conn.error(rid, mcp.INTERNAL_ERROR, "toolhost: the host connection closed"))
            elif rid in self._cancelled:
                self._cancelled.discard(rid)
            elif envelope is not None:
                write(conn.result(rid, call_result(envelope)))

        # In the host's process the params go over as the struct and the envelope comes back
        # as the host's object: neither is encoded or decoded on the way (server/link.py).
        self.kernel.request_soon(
            "tools.invoke", params, request_id=krid, on_answer=answered, typed=Envelope
        )
        return True

    async def call_tool(self, ev: CallTool, notify: Notify) -> Line | None:
        """Run ``tools/call`` as ``tools.invoke``; the answer, or None if the client cancelled
        it (MCP: no response to a cancelled request). Progress goes to ``notify``."""
        conn = self.conn
        profile = self.profile
        if profile is not None and not profile.allows("tool", ev.name):
            message = profile.refusal("tool", ev.name)
            return conn.error(ev.id, mcp.INVALID_PARAMS, message, {"profile": profile.name})
        if ev.id in self._calls:
            return conn.error(ev.id, mcp.INVALID_REQUEST, f"request id {ev.id!r} is in flight")
        krid = self.kernel.new_id()
        self._calls[ev.id] = krid
        params: dict[str, Any] = {"tool": ev.name, "input": ev.arguments}
        traceparent, tracestate, span = ev.traceparent, ev.tracestate, None
        tracing = self.tracing
        if tracing is not None:  # the MCP SERVER span; the kernel request goes under it
            span, traceparent, tracestate = tracing.mcp_server_span(
                ev.name,
                traceparent,
                tracestate,
                request_id=ev.id,
                session_id=self.session_id,
                transport=self.transport,
                protocol_version=conn.protocol_version,
            )
        if traceparent:
            params["trace"] = {"traceparent": traceparent}
            if tracestate:
                params["trace"]["tracestate"] = tracestate
        on_event = None
        token = ev.progress_token
        if token is not None:
            params["stream"] = True
            seq = 0

            def on_event(name: str, data: Any) -> None:
                nonlocal seq
                if name == "tool.progress":
                    seq += 1
                    progress, total, message = progress_fields(data, seq)
                    notify(conn.progress(token, progress, total, message))

        error: tuple[str, str] | None = ("cancelled", "cancelled")
        try:
            envelope: Envelope = await self.kernel.request(
                "tools.invoke", params, request_id=krid, on_event=on_event, typed=Envelope
            )
            failure = envelope.error
            error = (failure.code, failure.message) if failure is not None else None
        except RpcError as exc:
            error = (exc.code, exc.message)
            code = _RPC_TO_MCP.get(exc.code, mcp.INTERNAL_ERROR)
            return conn.error(ev.id, code, exc.message, {"code": exc.code})
        except ConnectionLost:
            error = ("connection-lost", "the host connection closed")
            return conn.error(ev.id, mcp.INTERNAL_ERROR, "toolhost: the host connection closed")
        finally:
            self._calls.pop(ev.id, None)
            if tracing is not None:
                tracing.end_span(span, *(error or (None, "")))
        if ev.id in self._cancelled:
            self._cancelled.discard(ev.id)
            return None
        return conn.result(ev.id, call_result(envelope))

    def forward_now(
        self, ev: Forward, write: Notify, on_end: Callable[[], None] | None = None
    ) -> bool:
        """Start a read, get or completion with no task of its own (stdio): asked now, answered
        from the kernel connection's reader with what :meth:`forward` would answer (nothing
        when the client cancelled it); ``on_end`` once it is over (at once when refused here).
        False, with nothing done, for a list (:meth:`forward`'s task pages it)."""
        if ev.method in _LISTS:
            return False
        refusal = self._refused(ev)
        if refusal is not None:
            write(refusal)
            if on_end is not None:
                on_end()
            return True
        rid = ev.id
        krid = self.kernel.new_id()
        self._calls[rid] = krid

        def answered(result: Any, error: BaseException | None) -> None:
            self._calls.pop(rid, None)
            try:
                answer = self._answer(ev, result, error)
                if answer is not None:
                    write(answer)
            finally:
                if on_end is not None:
                    on_end()

        # Its parts pass through as JSON (split from the kernel's answer in the pass that finds
        # its id: a 1 MiB read is scanned once), answered from the tick that reads them.
        self.kernel.request_soon(
            ev.kernel, ev.params, request_id=krid, on_answer=answered, members=True
        )
        return True

    async def forward(self, ev: Forward) -> Line | None:
        """A resources, prompts or completion request answered through its kernel method;
        lists filtered by the profile, a read, get or completion outside it refused; None when
        the client cancelled it (the kernel request is cancelled too, :meth:`cancel`)."""
        refusal = self._refused(ev)
        if refusal is not None:
            return refusal
        listing = _LISTS.get(ev.method)
        krid = self.kernel.new_id()
        self._calls[ev.id] = krid
        try:
            result = await self.kernel.request(
                ev.kernel, ev.params, request_id=krid, members=listing is None
            )
        except (RpcError, ConnectionLost) as exc:
            return self._answer(ev, None, exc)
        finally:
            self._calls.pop(ev.id, None)
        if listing is None or ev.id in self._cancelled or not isinstance(result, dict):
            return self._answer(ev, result, None)
        key, of = listing
        items = [
            {k: v for k, v in i.items() if k != "sidecar"}
            for i in result.get(key, [])
            if isinstance(i, dict)
        ]
        if self.profile is not None:
            items = getattr(self.profile, of)(items)
        cursor = ev.params.get("cursor")
        try:
            page, following = paginate(
                items, cursor if isinstance(cursor, str) else None, _IDENT[key], self.page_size
            )
        except BadCursor as exc:
            return self.conn.error(ev.id, mcp.INVALID_PARAMS, str(exc))
        return self.conn.page(ev.id, key, page, following)

    def _refused(self, ev: Forward) -> Line | None:
        """The answer refusing ``ev`` (outside the profile, or its id in flight); None when it
        may go."""
        conn, profile, params = self.conn, self.profile, ev.params
        if profile is not None:
            raw_ref = params.get("ref")
            ref: dict[str, Any] = raw_ref if isinstance(raw_ref, dict) else {}
            target: tuple[Any, str] | None = None
            if ev.method in _RESOURCE_METHODS:
                target = ("resource", str(params.get("uri", "")))
            elif ev.method == "prompts/get":
                target = ("prompt", str(params.get("name", "")))
            elif ref.get("type") == "ref/prompt":
                target = ("prompt", str(ref.get("name", "")))
            elif ref.get("type") == "ref/resource":
                target = ("resource", str(ref.get("uri", "")))
            if target is not None and not profile.allows(*target):
                message = profile.refusal(*target)
                return conn.error(ev.id, mcp.INVALID_PARAMS, message, {"profile": profile.name})
        if ev.id in self._calls:
            return conn.error(ev.id, mcp.INVALID_REQUEST, f"request id {ev.id!r} is in flight")
        return None

    def _answer(self, ev: Forward, result: Any, error: BaseException | None) -> Line | None:
        """The MCP answer to ``ev`` from its kernel result (an object) or error; None when the
        client cancelled it."""
        conn = self.conn
        if isinstance(error, RpcError):
            if ev.id in self._cancelled:
                self._cancelled.discard(ev.id)
                return None
            code = _RPC_TO_MCP.get(error.code, mcp.INTERNAL_ERROR)
            if error.code == "not-found":
                code = RESOURCE_NOT_FOUND if ev.method in _RESOURCE_METHODS else mcp.INVALID_PARAMS
            return conn.error(ev.id, code, error.message, {"code": error.code})
        if error is not None:
            return conn.error(ev.id, mcp.INTERNAL_ERROR, "toolhost: the host connection closed")
        if ev.id in self._cancelled:
            self._cancelled.discard(ev.id)
            return None
        if not isinstance(result, dict):
            return conn.error(ev.id, mcp.INTERNAL_ERROR, f"toolhost: {ev.kernel} gave no object")
        answer = {k: v for k, v in result.items() if k not in ("_meta", "resultType")}
        return conn.result(ev.id, answer)

    def cancel(self, ev: Cancelled) -> None:
        """``notifications/cancelled``: cancel the kernel call, or read of a hosted server (a
        no-op when it already ended)."""
        krid = self._calls.get(ev.id)
        if krid is None:
            return
        self._cancelled.add(ev.id)
        self._nursery.start_soon(self._cancel, krid)

    async def _cancel(self, krid: int) -> None:
        try:
            await self.kernel.cancel(krid)
        except (RpcError, ConnectionLost) as exc:
            log.warning("could not cancel kernel call %s: %s", krid, exc)

    async def subscribe(self, uris: list[str]) -> list[str]:
        """Subscribe this session's kernel connection to ``uris`` (a listen stream's
        ``resourceSubscriptions``); the ones subscribed (outside the profile, or offered by no
        available server: left out)."""
        done = []
        for uri in uris:
            if self.profile is not None and not self.profile.allows("resource", uri):
                continue
            try:
                await self.kernel.request("resources.subscribe", {"uri": uri})
            except RpcError as exc:
                log.info("listen: cannot subscribe to %s: %s", uri, exc)
                continue
            done.append(uri)
        return done

    async def unsubscribe(self, uris: list[str]) -> None:
        for uri in uris:
            try:
                await self.kernel.request("resources.unsubscribe", {"uri": uri})
            except (RpcError, ConnectionLost) as exc:
                log.info("listen: cannot unsubscribe from %s: %s", uri, exc)

    async def watch_catalog(
        self,
        on_change: OnChange,
        *,
        on_updated: OnUpdated | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call ``on_change("tools")`` whenever the tools this client sees change,
        ``on_change("resources" | "prompts")`` when the hosted resources (or templates) or
        prompts change, and ``on_updated(uri)`` at each update of a resource this kernel
        connection subscribed to; ``started`` once subscribed; returns when the kernel
        connection closes."""
        try:
            await self.kernel.subscribe()
            self._visible = _fingerprint(await self._tools())
            task_status.started()
            events = self.kernel.events
            async for event in events:
                if not _note(event, on_change, on_updated):
                    continue
                # One tools/list answers every catalog change queued meanwhile: the events that
                # came while the last one was asked are taken now, so they cannot pile up.
                while True:
                    try:
                        _note(events.receive_nowait(), on_change, on_updated)
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                fingerprint = _fingerprint(await self._tools())
                if fingerprint != self._visible:
                    self._visible = fingerprint
                    on_change("tools")
        except (RpcError, ConnectionLost) as exc:
            log.warning("catalog watch ended: %s", exc)
