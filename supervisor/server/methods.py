"""The kernel protocol's method table (PROTOCOL 6).

Each method is a function of a :class:`Session` (one client connection) and the request. Quick
methods answer synchronously; ``tools.invoke``, ``sidecar.restart`` and ``packages.*`` are
awaited by one of the connection's invoker tasks. A handler signals a protocol error by raising
:class:`RpcFailure`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec
import trio

import supervisor
from supervisor.contracts.packages import ApplyParams, RollbackParams, StageParams
from supervisor.contracts.rpc import (
    PROTOCOL_NAME,
    CancelParams,
    EmptyParams,
    HelloParams,
    InvokeParams,
    ListParams,
    RequestId,
    ServerInfo,
    SidecarParams,
)
from supervisor.packages.errors import PackageError
from supervisor.runtime.host import Host
from supervisor.server.codec import Codec
from supervisor.server.formats import render


class RpcFailure(Exception):
    """Answer the request with a protocol error."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class Session(Protocol):
    """What a method sees of its connection."""

    host: Host
    codec: Codec
    client_name: str

    def send(self, frame: bytes) -> None: ...

    def switch_encoding(self, encoding: str) -> None: ...

    def start_subscription(self) -> None: ...

    def call_key(self, request_id: RequestId) -> Any: ...


SyncMethod = Callable[[Session, RequestId, msgspec.Raw], Any]
AsyncMethod = Callable[[Session, RequestId, msgspec.Raw], Awaitable[Any]]

CAPABILITIES = {
    "encodings": ["json", "msgpack"],
    "formats": ["native", "openai", "anthropic", "mcp"],
    "streaming": True,
    "cancel": True,
    "subscribe": True,
    "packages": True,
}


def hello(s: Session, rid: RequestId, raw: msgspec.Raw) -> Any:
    p = s.codec.params(raw, HelloParams)
    if p.client is not None:
        s.client_name = p.client.name or s.client_name
    result = {
        "protocol": PROTOCOL_NAME,
        "server": ServerInfo(name="toolhost", version=supervisor.__version__),
        "capabilities": CAPABILITIES,
        "kits": s.host.catalog_snapshot(),
    }
    if p.encoding != s.codec.encoding:
        s.send(s.codec.response(rid, result))
        s.switch_encoding(p.encoding)
        return _ALREADY_SENT
    return result


def catalog_get(s: Session, rid: RequestId, raw: msgspec.Raw) -> Any:
    s.codec.params(raw, EmptyParams)
    return s.host.catalog_snapshot()


def catalog_subscribe(s: Session, rid: RequestId, raw: msgspec.Raw) -> Any:
    s.codec.params(raw, EmptyParams)
    s.start_subscription()
    return {"revision": s.host.catalog.revision}


def tools_list(s: Session, rid: RequestId, raw: msgspec.Raw) -> Any:
    p = s.codec.params(raw, ListParams)
    return {"tools": render(s.host.catalog.visible(), p.format)}


def tools_cancel(s: Session, rid: RequestId, raw: msgspec.Raw) -> Any:
    p = s.codec.params(raw, CancelParams)
    return {"cancelled": s.host.cancel(s.call_key(p.id))}


def system_health(s: Session, rid: RequestId, raw: msgspec.Raw) -> Any:
    s.codec.params(raw, EmptyParams)
    return s.host.health()


def system_stats(s: Session, rid: RequestId, raw: msgspec.Raw) -> Any:
    s.codec.params(raw, EmptyParams)
    return s.host.stats()


async def tools_invoke(s: Session, rid: RequestId, raw: msgspec.Raw) -> Any:
    p = s.codec.params(raw, InvokeParams)
    if p.timeoutMs is not None and p.timeoutMs < 1:
        raise RpcFailure("invalid-params", "params.timeoutMs: expected int >= 1")
    tool = s.host.resolve_name(p.tool)
    on_progress = None
    if p.stream:
        s.send(s.codec.event("tool.start", {"tool": tool}, rid))

        def on_progress(data: msgspec.Raw) -> None:
            s.send(s.codec.event("tool.progress", data, rid))

    try:
        input_raw = s.codec.to_json(p.input)
    except msgspec.DecodeError as exc:
        raise RpcFailure("invalid-params", f"params.input: {exc}") from exc
    return await s.host.invoke(
        tool,
        input_raw,
        timeout_ms=p.timeoutMs,
        approval=p.approval,
        on_progress=on_progress,
        call_key=s.call_key(rid),
        client=s.client_name,
    )


async def sidecar_restart(s: Session, rid: RequestId, raw: msgspec.Raw) -> Any:
    p = s.codec.params(raw, SidecarParams)
    if p.sidecar not in s.host.pools:
        raise RpcFailure("not-found", f"no running sidecar named {p.sidecar!r}")
    with trio.move_on_after(30):
        await s.host.restart_sidecar(p.sidecar)
    return {"restarted": True}


# packages.* (docs/packages.md): operator actions on the package manager of the running host.

_PACKAGE_ERRORS = {"not-found": "not-found", "busy": "overloaded", "io-failed": "internal"}


def _package_failure(exc: PackageError) -> RpcFailure:
    """A refused package operation: the manager's code and every problem go in ``data``."""
    return RpcFailure(
        _PACKAGE_ERRORS.get(exc.code, "invalid-params"),
        exc.message,
        {"reason": exc.code, "problems": exc.problems},
    )


async def packages_status(s: Session, rid: RequestId, raw: msgspec.Raw) -> Any:
    s.codec.params(raw, EmptyParams)
    try:
        return await s.host.upgrades.status()
    except PackageError as exc:
        raise _package_failure(exc) from exc


async def packages_stage(s: Session, rid: RequestId, raw: msgspec.Raw) -> Any:
    p = s.codec.params(raw, StageParams)
    try:
        return await s.host.upgrades.stage(p.source)
    except PackageError as exc:
        raise _package_failure(exc) from exc


async def packages_apply(s: Session, rid: RequestId, raw: msgspec.Raw) -> Any:
    p = s.codec.params(raw, ApplyParams)
    try:
        return await s.host.upgrades.apply(p.id, auto_rollback=p.autoRollback)
    except PackageError as exc:
        raise _package_failure(exc) from exc


async def packages_rollback(s: Session, rid: RequestId, raw: msgspec.Raw) -> Any:
    p = s.codec.params(raw, RollbackParams)
    if p.confirm is not True:
        raise RpcFailure(
            "invalid-params",
            "params.confirm: packages.rollback is an operator decision; send confirm: true",
        )
    try:
        return await s.host.upgrades.rollback(p.id)
    except PackageError as exc:
        raise _package_failure(exc) from exc


_ALREADY_SENT = object()

SYNC_METHODS: dict[str, SyncMethod] = {
    "server.hello": hello,
    "capability.catalog.get": catalog_get,
    "capability.catalog.subscribe": catalog_subscribe,
    "tools.list": tools_list,
    "tools.cancel": tools_cancel,
    "system.health": system_health,
    "system.stats": system_stats,
}

ASYNC_METHODS: dict[str, AsyncMethod] = {
    "tools.invoke": tools_invoke,
    "sidecar.restart": sidecar_restart,
    "packages.status": packages_status,
    "packages.stage": packages_stage,
    "packages.apply": packages_apply,
    "packages.rollback": packages_rollback,
}


def already_sent(result: Any) -> bool:
    return result is _ALREADY_SENT
