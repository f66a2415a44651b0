"""The kernel protocol's method table (PROTOCOL 6, plus the documented extensions).

Each method is a function of a :class:`Call` (the session, the codec of the frame that carried
the request, and the request id) and the raw params. Quick methods answer synchronously;
``tools.invoke`` starts its call and answers from the tick that ends it; other slow methods
(operator actions) are awaited by one of the session's invoker tasks. A handler
signals a protocol error by raising :class:`RpcFailure`; bad params raise ``BadParams``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec
import trio

import supervisor
from supervisor.contracts.envelope import Envelope
from supervisor.contracts.events import SubscribeParams
from supervisor.contracts.packages import ApplyParams, RollbackParams, StageParams
from supervisor.contracts.rpc import (
    PROTOCOL_NAME,
    CancelParams,
    EmptyParams,
    HelloParams,
    InvokeParams,
    ListParams,
    RequestId,
    RestartParams,
    ServerInfo,
)
from supervisor.host.host import Host
from supervisor.packages.errors import PackageError
from supervisor.server.codec import BadParams, Codec
from supervisor.server.formats import render


class RpcFailure(Exception):
    """Answer the request with a protocol error."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class SessionLike(Protocol):
    """What a method sees of its client session."""

    host: Host
    client_name: str

    def send(self, frame: bytes, codec: Codec) -> None: ...

    def switch_encoding(self, encoding: str) -> Codec: ...

    def start_subscription(self, codec: Codec) -> None: ...

    def start_events(self, codec: Codec, params: SubscribeParams) -> None: ...

    def call_key(self, request_id: RequestId) -> Any: ...

    def call_done(self, request_id: RequestId) -> None: ...


class Call:
    """One request being answered."""

    __slots__ = ("codec", "rid", "session")

    def __init__(self, session: SessionLike, codec: Codec, rid: RequestId) -> None:
        self.session = session
        self.codec = codec
        self.rid = rid

    @property
    def host(self) -> Host:
        return self.session.host

    def params(self, raw: msgspec.Raw, tp: type[Any]) -> Any:
        return self.codec.params(raw, tp)

    def event(self, name: str, data: Any) -> None:
        self.session.send(self.codec.event(name, data, self.rid), self.codec)


SyncMethod = Callable[[Call, msgspec.Raw], Any]
AsyncMethod = Callable[[Call, msgspec.Raw], Awaitable[Any]]

CAPABILITIES = {
    "encodings": ["json", "msgpack"],
    "formats": ["native", "openai", "anthropic", "mcp"],
    "streaming": True,
    "cancel": True,
    "subscribe": True,
    "events": ["workers", "calls", "logs"],
    "extensions": ["sidecar.logs", "registry.reload"],
    "packages": True,
}


class _AlreadySent:
    pass


ALREADY_SENT = _AlreadySent()


def hello(c: Call, raw: msgspec.Raw) -> Any:
    p = c.params(raw, HelloParams)
    if p.client is not None and p.client.name:
        c.session.client_name = f"{p.client.name}@{c.session.client_name}"
    result = {
        "protocol": PROTOCOL_NAME,
        "server": ServerInfo(name="toolhost", version=supervisor.__version__),
        "capabilities": {**CAPABILITIES, "endpoints": dict(c.host.endpoints)},
        "kits": c.host.catalog_snapshot(),
    }
    if p.encoding is not None and p.encoding != c.codec.encoding:
        # The response goes out in the old encoding; everything after it in the new one.
        c.session.send(c.codec.response(c.rid, result), c.codec)
        c.session.switch_encoding(p.encoding)
        return ALREADY_SENT
    return result


def catalog_get(c: Call, raw: msgspec.Raw) -> Any:
    c.params(raw, EmptyParams)
    return c.host.catalog_snapshot()


def catalog_subscribe(c: Call, raw: msgspec.Raw) -> Any:
    c.params(raw, EmptyParams)
    c.session.start_subscription(c.codec)
    return {"revision": c.host.catalog.revision}


def events_subscribe(c: Call, raw: msgspec.Raw) -> Any:
    """``events.subscribe``: operator events of the topics asked for (a later call on the same
    connection replaces the earlier subscription)."""
    p = c.params(raw, SubscribeParams)
    if not p.topics:
        raise BadParams("params.topics: name at least one of workers, calls, logs")
    c.session.start_events(c.codec, p)
    return {}


def tools_list(c: Call, raw: msgspec.Raw) -> Any:
    p = c.params(raw, ListParams)
    return {"tools": render(c.host.catalog.visible(), p.format)}


def tools_cancel(c: Call, raw: msgspec.Raw) -> Any:
    p = c.params(raw, CancelParams)
    return {"cancelled": c.host.cancel(c.session.call_key(p.id))}


def system_health(c: Call, raw: msgspec.Raw) -> Any:
    c.params(raw, EmptyParams)
    return c.host.health()


def system_stats(c: Call, raw: msgspec.Raw) -> Any:
    c.params(raw, EmptyParams)
    return c.host.stats()


class LogsParams(msgspec.Struct, kw_only=True):
    sidecar: str
    bytes: int = 64 * 1024


def sidecar_logs(c: Call, raw: msgspec.Raw) -> Any:
    """Extension: the stderr tail of a sidecar (live worker, else the last exited one)."""
    p = c.params(raw, LogsParams)
    pool = c.host.pools.get(p.sidecar)
    if pool is None:
        raise RpcFailure("not-found", f"no running sidecar named {p.sidecar!r}")
    return {"sidecar": p.sidecar, "stderr": pool.stderr_tail(max(1, min(p.bytes, 64 * 1024)))}


class DecideParams(msgspec.Struct, kw_only=True):
    callId: str
    token: str
    by: str
    granted: bool = True


def approvals_list(c: Call, raw: msgspec.Raw) -> Any:
    """Extension (docs/security.md): calls waiting for an operator's approval."""
    c.params(raw, EmptyParams)
    return {
        "approvalSource": c.host.registry.host.approval_source,
        "pending": c.host.invoker.approvals.pending(),
    }


def approvals_decide(c: Call, raw: msgspec.Raw) -> Any:
    """Extension (docs/security.md): an operator grants or denies a waiting call."""
    p = c.params(raw, DecideParams)
    approvals = c.host.invoker.approvals
    if not p.by.strip():
        raise BadParams("params.by: name who decides")
    if not approvals.check_token(p.token):
        raise RpcFailure(
            "unauthorized",
            "params.token: not the operator token (operator.token next to the socket)",
        )
    if not approvals.decide(p.callId, granted=p.granted, by=p.by):
        raise RpcFailure("not-found", f"no call {p.callId!r} is waiting for approval")
    return {"callId": p.callId, "granted": p.granted}


def tools_invoke(c: Call, raw: msgspec.Raw) -> None:
    """Start ``tools.invoke``: no task waits for it; the response is sent from whichever tick
    ends the call (``tool.start`` and ``tool.progress`` events first when ``stream`` is set)."""
    p = c.params(raw, InvokeParams)
    if p.timeoutMs is not None and p.timeoutMs < 1:
        raise RpcFailure("invalid-params", "params.timeoutMs: expected int >= 1")
    try:
        input_raw = c.codec.to_json(p.input)
    except (msgspec.DecodeError, TypeError) as exc:
        raise RpcFailure("invalid-params", f"params.input: {exc}") from exc
    host = c.host
    tool = host.resolve_name(p.tool)
    session, codec, rid = c.session, c.codec, c.rid
    on_progress = None
    if p.stream:
        c.event("tool.start", {"tool": tool})

        def on_progress(data: msgspec.Raw) -> None:
            c.event("tool.progress", data)

    trace = None
    tel = host.telemetry
    if tel is not None:  # the kernel request is a SERVER span around the call's span
        t = p.trace
        server, trace = tel.request_span(
            "tools.invoke",
            t.traceparent if t is not None else None,
            t.tracestate if t is not None else None,
            request_id=rid,
            tool=tool,
            client=session.client_name,
        )

        def done(env: Envelope) -> None:
            tel.end_span(server)
            session.call_done(rid)
            session.send(codec.response(rid, env), codec)

    else:

        def done(env: Envelope) -> None:
            session.call_done(rid)
            session.send(codec.response(rid, env), codec)

    host.start_invoke(
        tool,
        input_raw,
        timeout_ms=p.timeoutMs,
        approval=p.approval,
        on_progress=on_progress,
        call_key=session.call_key(rid),
        client=session.client_name,
        on_done=done,
        session=p.session,
        trace=trace,
    )


async def sidecar_restart(c: Call, raw: msgspec.Raw) -> Any:
    p = c.params(raw, RestartParams)
    pool = c.host.pools.get(p.sidecar)
    if pool is None:
        raise RpcFailure("not-found", f"no running sidecar named {p.sidecar!r}")
    if pool.inflight and not p.force:
        raise RpcFailure(
            "invalid-params",
            f"params.force: {p.sidecar} has {pool.inflight} call(s) running or queued; "
            "restarting fails them, so it is an operator decision: send force: true",
            {"inflight": pool.inflight},
        )
    replaced = [w.pid for w in pool.workers if w.pid is not None]
    with trio.move_on_after(30):
        await c.host.restart_sidecar(p.sidecar)
    return {"restarted": True, "replaced": replaced}


async def registry_reload(c: Call, raw: msgspec.Raw) -> Any:
    """Extension: re-read the registry (same as SIGHUP)."""
    c.params(raw, EmptyParams)
    return await c.host.reload()


# packages.* (docs/packages.md): operator actions on the package manager of the running host.

_PACKAGE_ERRORS = {"not-found": "not-found", "busy": "overloaded", "io-failed": "internal"}


def _package_failure(exc: PackageError) -> RpcFailure:
    """A refused package operation: the manager's code and every problem go in ``data``."""
    return RpcFailure(
        _PACKAGE_ERRORS.get(exc.code, "invalid-params"),
        exc.message,
        {"reason": exc.code, "problems": exc.problems},
    )


async def packages_status(c: Call, raw: msgspec.Raw) -> Any:
    c.params(raw, EmptyParams)
    try:
        return await c.host.upgrades.status()
    except PackageError as exc:
        raise _package_failure(exc) from exc


async def packages_stage(c: Call, raw: msgspec.Raw) -> Any:
    p = c.params(raw, StageParams)
    try:
        return await c.host.upgrades.stage(p.source)
    except PackageError as exc:
        raise _package_failure(exc) from exc


async def packages_apply(c: Call, raw: msgspec.Raw) -> Any:
    p = c.params(raw, ApplyParams)
    try:
        return await c.host.upgrades.apply(p.id, auto_rollback=p.autoRollback)
    except PackageError as exc:
        raise _package_failure(exc) from exc


async def packages_rollback(c: Call, raw: msgspec.Raw) -> Any:
    p = c.params(raw, RollbackParams)
    if p.confirm is not True:
        raise RpcFailure(
            "invalid-params",
            "params.confirm: packages.rollback is an operator decision; send confirm: true",
        )
    try:
        return await c.host.upgrades.rollback(p.id)
    except PackageError as exc:
        raise _package_failure(exc) from exc


STATE_CHANGING_METHODS = frozenset(
    {"sidecar.restart", "registry.reload", "packages.stage", "packages.apply", "packages.rollback"}
)
"""Methods that change the host's state: once their frame is read, they run to their end even
when the client leaves first (``tools.invoke`` of a tool not marked read-only too)."""


def changes_state(c: Call, method: str, raw: msgspec.Raw) -> bool:
    """Whether a request must run to its end although its client has left.

    ``tools.invoke`` changes state unless its tool's manifest says ``readOnly`` (a tool the host
    does not know, or params that do not decode, would only be refused: nothing to keep).
    """
    if method in STATE_CHANGING_METHODS:
        return True
    if method != "tools.invoke":
        return False
    try:
        p = c.params(raw, InvokeParams)
    except BadParams:
        return False
    d = c.host.catalog.get(c.host.resolve_name(p.tool))
    return d is not None and not d.annotations.readOnly


SYNC_METHODS: dict[str, SyncMethod] = {
    "server.hello": hello,
    "capability.catalog.get": catalog_get,
    "capability.catalog.subscribe": catalog_subscribe,
    "events.subscribe": events_subscribe,
    "tools.list": tools_list,
    "tools.cancel": tools_cancel,
    "system.health": system_health,
    "system.stats": system_stats,
    "sidecar.logs": sidecar_logs,
    "approvals.list": approvals_list,
    "approvals.decide": approvals_decide,
}

StartedMethod = Callable[[Call, msgspec.Raw], None]

STARTED_METHODS: dict[str, StartedMethod] = {
    "tools.invoke": tools_invoke,
}
"""Methods that start work and answer later through ``session.call_done`` and ``send``, with
no task waiting: they count as in flight for the request-id checks."""

ASYNC_METHODS: dict[str, AsyncMethod] = {
    "sidecar.restart": sidecar_restart,
    "registry.reload": registry_reload,
    "packages.status": packages_status,
    "packages.stage": packages_stage,
    "packages.apply": packages_apply,
    "packages.rollback": packages_rollback,
}
