"""The kernel protocol's one method table (PROTOCOL 6, plus the documented extensions).

# Strategy: every method is a function of a :class:`RequestContext` (the session, the codec of
# the frame that carried the request, the request id, and the :class:`Backend` of host parts it
# may talk to) and the raw params, and has one row in :data:`METHODS` that says how the session
# runs it and whether it must run to its end once read. ``quick`` methods answer synchronously;
# ``started`` ones (``tools.invoke``) start their work and answer from the tick that ends it,
# with no task waiting; ``awaited`` ones (operator actions) are run by one of the session's
# runner tasks. A handler signals a protocol error by raising :class:`RpcFailure`; bad params
# raise ``BadParams``. Handlers talk to the invoker, the approvals and the views; none reaches
# into the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

import msgspec
import trio

import supervisor
from supervisor.calls.call import InvokeRequest
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
from supervisor.host.offers import DEFAULT_TIMEOUT_S, OfferError, no_answer
from supervisor.packages.errors import PackageError
from supervisor.server.adopt import GO_AHEAD, Adopter, AdoptParams, AdoptRefused
from supervisor.server.backend import Backend
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

    backend: Backend
    client_name: str

    def send(self, frame: bytes, codec: Codec) -> None: ...

    def send_result(self, request_id: RequestId, result: Any, codec: Codec) -> None: ...

    def switch_encoding(self, encoding: str) -> Codec: ...

    def start_subscription(self, codec: Codec) -> None: ...

    def start_events(self, codec: Codec, params: SubscribeParams) -> None: ...

    def call_key(self, request_id: RequestId) -> Any: ...

    def call_done(self, request_id: RequestId) -> None: ...

    def cancel_request(self, request_id: RequestId) -> bool: ...

    def read_started(self, request_id: RequestId, cancel: Callable[[], None]) -> None: ...

    def read_done(self, request_id: RequestId) -> bool: ...

    def adopt(self, adopter: Adopter, checked: Any) -> None: ...


class RequestContext:
    """One request being answered: who asked, in which encoding, under which id."""

    __slots__ = ("backend", "codec", "rid", "session")

    def __init__(self, session: SessionLike, codec: Codec, rid: RequestId) -> None:
        self.session = session
        self.codec = codec
        self.rid = rid
        self.backend = session.backend

    def params(self, raw: msgspec.Raw, tp: type[Any]) -> Any:
        return self.codec.params(raw, tp)

    def event(self, name: str, data: Any) -> None:
        self.session.send(self.codec.event(name, data, self.rid), self.codec)


CAPABILITIES = {
    "encodings": ["json", "msgpack"],
    "formats": ["native", "openai", "anthropic", "mcp"],
    "streaming": True,
    "cancel": True,
    "subscribe": True,
    "events": ["workers", "calls", "logs"],
    # What this host speaks beyond PROTOCOL.md; docs/kernel-protocol.md "Extensions, in one
    # place" has a row per name (a unit test keeps the two equal).
    "extensions": [
        "packages",
        "offers.changed",
        "cancel.offers",
        "restart.replaced",
        "reload.needsRestart",
        "logs.hints",
        "health.ready",
        "events.extras",
        "mcp.adopt",
    ],
    "packages": True,
    "resources": True,
    "prompts": True,
    "completions": True,
}


class _AlreadySent:
    pass


ALREADY_SENT = _AlreadySent()


def hello(c: RequestContext, raw: msgspec.Raw) -> Any:
    p = c.params(raw, HelloParams)
    if p.client is not None and p.client.name:
        c.session.client_name = f"{p.client.name}@{c.session.client_name}"
    result = {
        "protocol": PROTOCOL_NAME,
        "server": ServerInfo(name="toolhost", version=supervisor.__version__),
        "capabilities": {**CAPABILITIES, "endpoints": dict(c.backend.endpoints)},
        "kits": c.backend.views.snapshot(),
    }
    if p.encoding is not None and p.encoding != c.codec.encoding:
        # The response goes out in the old encoding; everything after it in the new one.
        c.session.send(c.codec.response(c.rid, result), c.codec)
        c.session.switch_encoding(p.encoding)
        return ALREADY_SENT
    return result


def catalog_get(c: RequestContext, raw: msgspec.Raw) -> Any:
    c.params(raw, EmptyParams)
    return c.backend.views.snapshot()


def catalog_subscribe(c: RequestContext, raw: msgspec.Raw) -> Any:
    c.params(raw, EmptyParams)
    c.session.start_subscription(c.codec)
    return {"revision": c.backend.views.revision}


def events_subscribe(c: RequestContext, raw: msgspec.Raw) -> Any:
    """``events.subscribe``: operator events of the topics asked for (a later call on the same
    connection replaces the earlier subscription)."""
    p = c.params(raw, SubscribeParams)
    if not p.topics:
        raise BadParams("params.topics: name at least one of workers, calls, logs")
    c.session.start_events(c.codec, p)
    return {}


def tools_list(c: RequestContext, raw: msgspec.Raw) -> Any:
    p = c.params(raw, ListParams)
    return {"tools": render(c.backend.views.visible(), p.format)}


def tools_cancel(c: RequestContext, raw: msgspec.Raw) -> Any:
    p = c.params(raw, CancelParams)
    if c.backend.invoker.cancel(c.session.call_key(p.id)):
        return {"cancelled": True}
    return {"cancelled": c.session.cancel_request(p.id)}  # a read of a hosted MCP server


def system_health(c: RequestContext, raw: msgspec.Raw) -> Any:
    c.params(raw, EmptyParams)
    return c.backend.views.health()


def system_stats(c: RequestContext, raw: msgspec.Raw) -> Any:
    c.params(raw, EmptyParams)
    return c.backend.views.stats()


class LogsParams(msgspec.Struct, kw_only=True):
    sidecar: str
    bytes: int = 64 * 1024


def sidecar_logs(c: RequestContext, raw: msgspec.Raw) -> Any:
    """Extension: the stderr tail of a sidecar (live worker, else the last exited one), with
    ``confinement.hints`` when it shows the sidecar's walls refused something."""
    p = c.params(raw, LogsParams)
    tail = c.backend.views.stderr_tail(p.sidecar, max(1, min(p.bytes, 64 * 1024)))
    if tail is None:
        raise RpcFailure("not-found", f"no running sidecar named {p.sidecar!r}")
    hints = c.backend.views.confinement_hints(p.sidecar, tail)
    if hints:  # what its walls refused, and the grant that would allow it (PROTOCOL 7)
        return {"sidecar": p.sidecar, "stderr": tail, "confinement": {"hints": hints}}
    return {"sidecar": p.sidecar, "stderr": tail}


class DecideParams(msgspec.Struct, kw_only=True):
    callId: str
    token: str
    by: str
    granted: bool = True


def approvals_list(c: RequestContext, raw: msgspec.Raw) -> Any:
    """Extension (docs/security.md): calls waiting for an operator's approval."""
    c.params(raw, EmptyParams)
    backend = c.backend
    return {
        "approvalSource": backend.views.host_config().approval_source,
        "pending": backend.approvals.pending(),
    }


def approvals_decide(c: RequestContext, raw: msgspec.Raw) -> Any:
    """Extension (docs/security.md): an operator grants or denies a waiting call."""
    p = c.params(raw, DecideParams)
    approvals = c.backend.approvals
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


def tools_invoke(c: RequestContext, raw: msgspec.Raw) -> None:
    """Start ``tools.invoke``: no task waits for it; the response is sent from whichever tick
    ends the call (``tool.start`` and ``tool.progress`` events first when ``stream`` is set)."""
    p = c.params(raw, InvokeParams)
    if p.timeoutMs is not None and p.timeoutMs < 1:
        raise RpcFailure("invalid-params", "params.timeoutMs: expected int >= 1")
    try:
        input_raw = c.codec.to_json(p.input)
    except (msgspec.DecodeError, TypeError) as exc:
        raise RpcFailure("invalid-params", f"params.input: {exc}") from exc
    backend = c.backend
    tool = backend.feed.resolve_name(p.tool)
    session, codec, rid = c.session, c.codec, c.rid
    on_progress = None
    if p.stream:
        c.event("tool.start", {"tool": tool})

        def on_progress(data: msgspec.Raw) -> None:
            c.event("tool.progress", data)

    trace = None
    tel = backend.telemetry
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
            session.send_result(rid, env, codec)

    else:

        def done(env: Envelope) -> None:
            session.call_done(rid)
            session.send_result(rid, env, codec)

    request = InvokeRequest(
        tool,
        input_raw,
        timeout_ms=p.timeoutMs,
        approval=p.approval,
        client=session.client_name,
        session=p.session,
        key=session.call_key(rid),
        trace=trace,
    )
    backend.invoker.start(request, done, on_progress)


async def sidecar_restart(c: RequestContext, raw: msgspec.Raw) -> Any:
    p = c.params(raw, RestartParams)
    workload = c.backend.views.workload(p.sidecar)
    if workload is None:
        raise RpcFailure("not-found", f"no running sidecar named {p.sidecar!r}")
    inflight, replaced = workload
    if inflight and not p.force:
        raise RpcFailure(
            "invalid-params",
            f"params.force: {p.sidecar} has {inflight} call(s) running or queued; "
            "restarting fails them, so it is an operator decision: send force: true",
            {"inflight": inflight},
        )
    with trio.move_on_after(30):
        await c.backend.control.restart_sidecar(p.sidecar)
    return {"restarted": True, "replaced": replaced}


async def registry_reload(c: RequestContext, raw: msgspec.Raw) -> Any:
    """Extension: re-read the registry (same as SIGHUP)."""
    c.params(raw, EmptyParams)
    return await c.backend.control.reload()


# packages.* (docs/packages.md): operator actions on the package manager of the running host.

_PACKAGE_ERRORS = {"not-found": "not-found", "busy": "overloaded", "io-failed": "internal"}


def _package_failure(exc: PackageError) -> RpcFailure:
    """A refused package operation: the manager's code and every problem go in ``data``."""
    return RpcFailure(
        _PACKAGE_ERRORS.get(exc.code, "invalid-params"),
        exc.message,
        {"reason": exc.code, "problems": exc.problems},
    )


async def packages_status(c: RequestContext, raw: msgspec.Raw) -> Any:
    c.params(raw, EmptyParams)
    try:
        return await c.backend.upgrades.status()
    except PackageError as exc:
        raise _package_failure(exc) from exc


async def packages_stage(c: RequestContext, raw: msgspec.Raw) -> Any:
    p = c.params(raw, StageParams)
    try:
        return await c.backend.upgrades.stage(p.source)
    except PackageError as exc:
        raise _package_failure(exc) from exc


async def packages_apply(c: RequestContext, raw: msgspec.Raw) -> Any:
    p = c.params(raw, ApplyParams)
    try:
        return await c.backend.upgrades.apply(p.id, auto_rollback=p.autoRollback)
    except PackageError as exc:
        raise _package_failure(exc) from exc


async def packages_rollback(c: RequestContext, raw: msgspec.Raw) -> Any:
    p = c.params(raw, RollbackParams)
    if p.confirm is not True:
        raise RpcFailure(
            "invalid-params",
            "params.confirm: packages.rollback is an operator decision; send confirm: true",
        )
    try:
        return await c.backend.upgrades.rollback(p.id)
    except PackageError as exc:
        raise _package_failure(exc) from exc


# resources.*, prompts.*, completion.complete (PROTOCOL 6): lists from what the host knows,
# the rest routed to the owning MCP server.


class CursorParams(msgspec.Struct, kw_only=True):
    cursor: str | None = None


class UriParams(msgspec.Struct, kw_only=True):
    uri: str


class PromptParams(msgspec.Struct, kw_only=True):
    name: str
    arguments: dict[str, str] | None = None


class CompleteParams(msgspec.Struct, kw_only=True):
    ref: dict[str, Any]
    argument: dict[str, Any]
    context: dict[str, Any] | None = None


def _listing(key: str) -> Handler:
    def run(c: RequestContext, raw: msgspec.Raw) -> Any:
        c.params(raw, CursorParams)  # one page: the whole list
        offers = c.backend.offers
        return {key: offers.listed(key), "shadowed": offers.shadowed((key,))}

    return run


def _offer_call(c: RequestContext, sid: str, method: str, params: dict[str, Any]) -> None:
    """Ask hosted server ``sid`` ``method`` and answer from the task that reads its answer
    (no task waits: as ``tools.invoke``); at most ``DEFAULT_TIMEOUT_S``, and ``tools.cancel``
    or the client leaving abandons it (``Session.read_started``)."""
    session, codec, rid = c.session, c.codec, c.rid
    timers = c.backend.invoker.timers

    def done(result: Any, error: OfferError | None) -> None:
        timers.cancel(timer)
        if not session.read_done(rid):
            return  # cancelled, or the client left
        if error is not None:
            session.send(codec.error(rid, error.code, error.message, error.data), codec)
        else:
            session.send_result(rid, result, codec)

    try:
        abandon = c.backend.offers.request_soon(sid, method, params, done)
    except OfferError as exc:
        raise RpcFailure(exc.code, exc.message, exc.data) from None

    def expire() -> None:
        abandon()
        done(None, no_answer(sid, method))

    timer = timers.at(trio.current_time() + DEFAULT_TIMEOUT_S, expire)

    def cancel() -> None:
        timers.cancel(timer)
        abandon()

    session.read_started(rid, cancel)


def _owner(find: Callable[[str], str], what: str) -> str:
    try:
        return find(what)
    except OfferError as exc:
        raise RpcFailure(exc.code, exc.message, exc.data) from None


def resources_read(c: RequestContext, raw: msgspec.Raw) -> None:
    p = c.params(raw, UriParams)
    sid = _owner(c.backend.offers.owner_of_uri, p.uri)
    _offer_call(c, sid, "resources/read", {"uri": p.uri})


def resources_subscribe(c: RequestContext, raw: msgspec.Raw) -> Any:
    """``resources.subscribe``: ``resource.updated {uri}`` events on this connection whenever
    the owning server says the resource changed (until unsubscribed or the connection ends)."""
    p = c.params(raw, UriParams)
    session, codec = c.session, c.codec

    def deliver(uri: str) -> None:
        session.send(codec.event("resource.updated", {"uri": uri}), codec)

    try:
        c.backend.offers.subscribe(p.uri, session, deliver)
    except OfferError as exc:
        raise RpcFailure(exc.code, exc.message, exc.data) from None
    return {}


def resources_unsubscribe(c: RequestContext, raw: msgspec.Raw) -> Any:
    """``resources.unsubscribe``: no more ``resource.updated`` for that URI (a URI this
    connection did not follow is answered the same)."""
    p = c.params(raw, UriParams)
    c.backend.offers.unsubscribe(p.uri, c.session)
    return {}


def prompts_get(c: RequestContext, raw: msgspec.Raw) -> None:
    p = c.params(raw, PromptParams)
    sid = _owner(c.backend.offers.owner_of_prompt, p.name)
    params: dict[str, Any] = {"name": p.name}
    if p.arguments:
        params["arguments"] = p.arguments
    _offer_call(c, sid, "prompts/get", params)


def completion_complete(c: RequestContext, raw: msgspec.Raw) -> None:
    p = c.params(raw, CompleteParams)
    offers = c.backend.offers
    if p.ref.get("type") == "ref/prompt":
        sid = _owner(offers.owner_of_prompt, str(p.ref.get("name")))
    elif p.ref.get("type") == "ref/resource":
        sid = _owner(offers.owner_of_uri, str(p.ref.get("uri")))
    else:
        raise RpcFailure("invalid-params", "params.ref.type: ref/prompt or ref/resource")
    params: dict[str, Any] = {"ref": p.ref, "argument": p.argument}
    if p.context is not None:
        params["context"] = p.context
    _offer_call(c, sid, "completion/complete", params)


def invoke_changes_state(c: RequestContext, raw: msgspec.Raw) -> bool:
    """``tools.invoke`` changes state unless its tool's manifest says ``readOnly`` (a tool the
    host does not know, or params that do not decode, would only be refused: nothing to keep)."""
    try:
        p = c.params(raw, InvokeParams)
    except BadParams:
        return False
    backend = c.backend
    d = backend.views.descriptor(backend.feed.resolve_name(p.tool))
    return d is not None and not d.annotations.readOnly


def _always(c: RequestContext, raw: msgspec.Raw) -> bool:
    return True


def _never(c: RequestContext, raw: msgspec.Raw) -> bool:
    return False


Handler = Callable[[RequestContext, msgspec.Raw], Any]
Kind = Literal["quick", "started", "awaited"]


class Method(msgspec.Struct, frozen=True):
    """One row of the method table.

    Attributes:
        run: The handler.
        kind: ``quick``: answered now from its return value; ``started``: starts work that
            answers later through ``session.call_done`` (a read: ``session.read_done``) and
            ``send``, with no task waiting (it counts as in flight); ``awaited``: a coroutine
            run by one of the session's runners.
        changes_state: Whether a request, once its frame was read, must run to its end even
            when its client leaves first (``Session.leave``).
    """

    run: Handler
    kind: Kind
    changes_state: Callable[[RequestContext, msgspec.Raw], bool] = _never


def mcp_adopt(c: RequestContext, raw: msgspec.Raw) -> Any:
    """Extension (docs/mcp-server.md): the host serves ``toolhost mcp``'s stdio session; the
    answer is the go-ahead for the descriptors (``server/adopt.py``)."""
    p = c.params(raw, AdoptParams)
    if p.profile is not None and p.tools is not None:
        raise BadParams("params: profile and tools exclude each other")
    adopter = c.backend.adopter
    if adopter is None:
        raise RpcFailure("unsupported", "this host does not serve MCP sessions itself")
    try:
        c.session.adopt(adopter, adopter.check(p))
    except AdoptRefused as exc:
        raise RpcFailure(exc.code, exc.message) from None
    return GO_AHEAD


METHODS: dict[str, Method] = {
    "server.hello": Method(hello, "quick"),
    "capability.catalog.get": Method(catalog_get, "quick"),
    "capability.catalog.subscribe": Method(catalog_subscribe, "quick"),
    "events.subscribe": Method(events_subscribe, "quick"),
    "tools.list": Method(tools_list, "quick"),
    "tools.cancel": Method(tools_cancel, "quick"),
    "system.health": Method(system_health, "quick"),
    "system.stats": Method(system_stats, "quick"),
    "sidecar.logs": Method(sidecar_logs, "quick"),
    "approvals.list": Method(approvals_list, "quick"),
    "approvals.decide": Method(approvals_decide, "quick"),
    "tools.invoke": Method(tools_invoke, "started", invoke_changes_state),
    "sidecar.restart": Method(sidecar_restart, "awaited", _always),
    "registry.reload": Method(registry_reload, "awaited", _always),
    "packages.status": Method(packages_status, "awaited"),
    "packages.stage": Method(packages_stage, "awaited", _always),
    "packages.apply": Method(packages_apply, "awaited", _always),
    "packages.rollback": Method(packages_rollback, "awaited", _always),
    "resources.list": Method(_listing("resources"), "quick"),
    "resources.templates": Method(_listing("resourceTemplates"), "quick"),
    "resources.read": Method(resources_read, "started"),
    "resources.subscribe": Method(resources_subscribe, "quick"),
    "resources.unsubscribe": Method(resources_unsubscribe, "quick"),
    "prompts.list": Method(_listing("prompts"), "quick"),
    "prompts.get": Method(prompts_get, "started"),
    "completion.complete": Method(completion_complete, "started"),
    "mcp.adopt": Method(mcp_adopt, "quick"),
}
"""Every method of the kernel protocol, by name."""


def changes_state(c: RequestContext, method: str, raw: msgspec.Raw) -> bool:
    """Whether a request must run to its end although its client has left."""
    m = METHODS.get(method)
    return m is not None and m.changes_state(c, raw)
