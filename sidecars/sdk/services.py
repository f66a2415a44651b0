"""Host services from a tool (PROTOCOL 3.5): ``ctx.invoke``, ``ctx.state(name)``, ``ctx.vault``.

# Strategy: a request is one ``request`` line naming the call in flight, sent and booked by the
# sidecar's :class:`~sidecars.sdk.session.Session`; its ``response`` comes back on stdin, where
# the driver's read loop hands it to the session, which wakes the request's waiter. A sync tool
# (a worker thread) blocks on a ``threading.Event``, waking every 50 ms to notice a host
# ``cancel``; an async tool awaits a ``trio.Event``, and a cancel is a real ``trio.Cancelled``.
# The same methods serve both: called from an async tool they return an awaitable
# (``await ctx.invoke(...)``), from a sync tool the answer itself. In oneshot mode (and under
# ``--mcp``) there is no host to ask: they raise :class:`ToolError` at once. This module needs of
# a call only its id, its cancel flag and its sidecar's session (:class:`ServiceCaller`), so it
# sits below the ``Context`` that offers it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from sidecars.sdk import tracing
from sidecars.sdk.session import Session
from sidecars.sdk.tools import ToolError
from supervisor.contracts import wire

if TYPE_CHECKING:
    import trio

_MISSING: Any = object()


class HasSession(Protocol):
    @property
    def session(self) -> Session: ...


class ServiceCaller(Protocol):
    """What a request needs of the call making it (a ``Context`` is one)."""

    @property
    def app(self) -> HasSession: ...

    @property
    def call_id(self) -> int | None: ...

    @property
    def cancelled(self) -> threading.Event: ...


class ServiceError(Exception):
    """The host refused a service request (``code``: ``state-refused``, ``would-deadlock``...).

    Uncaught in a tool it answers ``failed`` with ``details.serviceCode``.
    """

    def __init__(self, method: str, code: str, message: str) -> None:
        super().__init__(f"{method}: {code}: {message}")
        self.method = method
        self.code = code
        self.message = message


class ErrorInfo(msgspec.Struct, kw_only=True):
    code: str
    message: str
    exitCode: int | None = None
    stderr: str | None = None
    details: dict[str, Any] | None = None


class Invocation(msgspec.Struct, kw_only=True):
    """The result envelope of a child call (PROTOCOL 5)."""

    status: str
    tool: str
    content: str = ""
    data: Any = None
    error: ErrorInfo | None = None
    meta: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "success"


class _ThreadWaiter:
    """A sync tool's wait for a response (in a worker thread)."""

    __slots__ = ("answer", "event")

    def __init__(self) -> None:
        self.answer: wire.Response | None = None
        self.event = threading.Event()

    def wake(self, response: wire.Response) -> None:
        self.answer = response
        self.event.set()


class _TrioWaiter:
    """An async tool's wait for a response (the reader runs on the same Trio loop)."""

    __slots__ = ("answer", "event")

    def __init__(self) -> None:
        import trio

        self.answer: wire.Response | None = None
        self.event: trio.Event = trio.Event()

    def wake(self, response: wire.Response) -> None:
        self.answer = response
        self.event.set()


def ask(caller: ServiceCaller, method: str, params: Any) -> Any:
    """Send a request for ``caller``'s call; an awaitable in a Trio task, else the answer."""
    call_id = caller.call_id
    if call_id is None:
        raise ToolError(
            f"{method}: host services need a persistent worker (this is a oneshot run)",
            code="unsupported",
        )
    session = caller.app.session
    if _in_trio_task():
        trio_waiter = _TrioWaiter()
        rid = session.request(call_id, method, params, trio_waiter)
        return _await(session, rid, trio_waiter, method)
    waiter = _ThreadWaiter()
    rid = session.request(call_id, method, params, waiter)
    while not waiter.event.wait(0.05):
        if caller.cancelled.is_set():
            session.forget(rid)
            raise ToolError("call cancelled", code="cancelled")
    return _unwrap(method, waiter.answer)


async def _await(session: Session, rid: str, waiter: _TrioWaiter, method: str) -> Any:
    try:
        await waiter.event.wait()
    finally:
        session.forget(rid)
    return _unwrap(method, waiter.answer)


def _in_trio_task() -> bool:
    """Whether we run in a Trio task (an async tool), without importing trio in sidecars that
    never loaded it (sync-only sidecars start faster without it)."""
    if "trio" not in sys.modules:
        return False
    import trio

    return trio.lowlevel.in_trio_task()


def _unwrap(method: str, response: wire.Response | None) -> Any:
    if response is None:
        raise ServiceError(method, "host-gone", "no response")
    if response.error is not None:
        raise ServiceError(method, response.error.code, response.error.message)
    raw = response.result if isinstance(response.result, msgspec.Raw) else wire.NULL
    return msgspec.json.decode(raw)


def _then(value: Any, fn: Any) -> Any:
    """Apply ``fn`` to ``value`` now, or after awaiting it (async tools)."""
    if isinstance(value, Awaitable):

        async def later() -> Any:
            return fn(await value)

        return later()
    return fn(value)


def invoke(ctx: ServiceCaller, tool: str, input: Any, timeout_ms: int | None) -> Any:
    params: dict[str, Any] = {"tool": tool, "input": input}
    if timeout_ms is not None:
        params["timeoutMs"] = timeout_ms
    return _then(
        ask(ctx, "tools.invoke", params),
        lambda env: msgspec.convert(env, Invocation),
    )


class State:
    """A declared store (``ctx.state(name)``): ``get``/``set``/``delete``/``list``.

    In an async tool every method returns an awaitable.
    """

    def __init__(self, ctx: ServiceCaller, name: str) -> None:
        self._ctx = ctx
        self.name = name

    def _ask(self, method: str, params: dict[str, Any]) -> Any:
        return ask(self._ctx, method, {"name": self.name, **params})

    def get(self, key: str) -> Any:
        """The value stored under ``key`` (None when absent)."""
        return _then(self._ask("state.get", {"key": key}), lambda r: r["value"])

    def set(
        self, key: str, value: Any, *, if_value: Any = _MISSING, if_absent: bool = False
    ) -> Any:
        """Store ``value``. With ``if_value``/``if_absent`` it is a compare-and-set: returns False
        (nothing written) when the stored value is not the expected one, else True."""
        params: dict[str, Any] = {"key": key, "value": value}
        if if_absent:
            params["ifAbsent"] = True
        elif if_value is not _MISSING:
            params["ifValue"] = if_value
        conditional = if_absent or if_value is not _MISSING
        try:
            result = self._ask("state.set", params)
        except ServiceError as exc:  # a sync tool: the answer came back already
            if conditional and exc.code == "conflict":
                return False
            raise
        if isinstance(result, Awaitable):

            async def later() -> bool:
                try:
                    await result
                except ServiceError as exc:
                    if conditional and exc.code == "conflict":
                        return False
                    raise
                return True

            return later()
        return True

    def delete(self, key: str) -> Any:
        return _then(self._ask("state.delete", {"key": key}), lambda r: None)

    def list(self, prefix: str = "") -> Any:
        """Keys (under ``prefix``, inside the declared key prefix)."""
        return _then(self._ask("state.list", {"prefix": prefix}), lambda r: r["keys"])


def vault(ctx: ServiceCaller, key: str) -> Any:
    # The value is masked from this sidecar's exported spans from now on (as the host masks
    # it from everything it writes).
    return _then(
        ask(ctx, "vault.get", {"key": key}),
        lambda r: tracing.conceal(r["value"]),
    )
