"""Host services from a tool (PROTOCOL 3.5): ``ctx.invoke``, ``ctx.state(name)``, ``ctx.vault``.

# Strategy: a request is one ``request`` line naming the call in flight; its ``response`` comes
# back on stdin, where the sidecar's reader (the threaded loop or the Trio loop) hands it to
# :meth:`Requests.resolve`. A sync tool (a worker thread) blocks on a ``threading.Event``, waking
# every 50 ms to notice a host ``cancel``; an async tool awaits a ``trio.Event``, and a cancel is
# a real ``trio.Cancelled``. The same methods serve both: called from an async tool they return
# an awaitable (``await ctx.invoke(...)``), from a sync tool the answer itself. In oneshot mode
# there is no host to ask: they raise :class:`ToolError` at once.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import msgspec

from sidecars.sdk import tracing
from supervisor.contracts import wire

if TYPE_CHECKING:
    import trio

    from sidecars.sdk.app import Context, Sidecar

_encode = msgspec.json.Encoder().encode
_MISSING: Any = object()


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


class _Waiter:
    __slots__ = ("answer", "thread_event", "trio_event")

    def __init__(self, in_trio: bool) -> None:
        self.answer: wire.Response | None = None
        self.thread_event: threading.Event | None = None
        self.trio_event: trio.Event | None = None
        if in_trio:
            import trio

            self.trio_event = trio.Event()
        else:
            self.thread_event = threading.Event()


class Requests:
    """The requests a sidecar has out, by id."""

    def __init__(self, app: Sidecar) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._seq = 0
        self._waiting: dict[str, _Waiter] = {}

    def resolve(self, response: wire.Response) -> None:
        """A ``response`` arrived (called by the sidecar's reader)."""
        with self._lock:
            waiter = self._waiting.pop(str(response.id), None)
        if waiter is None:
            return
        waiter.answer = response
        if waiter.thread_event is not None:
            waiter.thread_event.set()
        elif waiter.trio_event is not None:
            waiter.trio_event.set()  # the reader runs on the same Trio loop

    def ask(self, ctx: Context, method: str, params: Any) -> Any:
        """Send a request for ``ctx``'s call; an awaitable in a Trio task, else the answer."""
        if ctx.call_id is None:
            from sidecars.sdk.app import ToolError

            raise ToolError(
                f"{method}: host services need a persistent worker (this is a oneshot run)",
                code="unsupported",
            )
        in_trio = _in_trio_task()
        with self._lock:
            self._seq += 1
            rid = f"s{self._seq}"
            waiter = _Waiter(in_trio)
            self._waiting[rid] = waiter
        self.app._write(
            _encode(
                wire.Request(
                    id=rid,
                    callId=ctx.call_id,
                    method=method,
                    params=msgspec.Raw(_encode(params)),
                )
            )
            + b"\n"
        )
        if in_trio:
            return self._await(rid, waiter, method)
        return self._block(rid, waiter, method, ctx)

    def _block(self, rid: str, waiter: _Waiter, method: str, ctx: Context) -> Any:
        event = waiter.thread_event
        assert event is not None
        while not event.wait(0.05):
            if ctx.cancelled.is_set():
                self._forget(rid)
                from sidecars.sdk.app import ToolError

                raise ToolError("call cancelled", code="cancelled")
        return _unwrap(method, waiter.answer)

    async def _await(self, rid: str, waiter: _Waiter, method: str) -> Any:
        event = waiter.trio_event
        assert event is not None
        try:
            await event.wait()
        finally:
            self._forget(rid)
        return _unwrap(method, waiter.answer)

    def _forget(self, rid: str) -> None:
        with self._lock:
            self._waiting.pop(rid, None)

    def fail_all(self, why: str) -> None:
        """The host is gone: wake every waiter with an error."""
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for rid, waiter in waiting.items():
            waiter.answer = wire.Response(
                id=rid, error=wire.ServiceError(code="host-gone", message=why)
            )
            if waiter.thread_event is not None:
                waiter.thread_event.set()
            elif waiter.trio_event is not None:
                waiter.trio_event.set()


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


def invoke(ctx: Context, tool: str, input: Any, timeout_ms: int | None) -> Any:
    params: dict[str, Any] = {"tool": tool, "input": input}
    if timeout_ms is not None:
        params["timeoutMs"] = timeout_ms
    return _then(
        ctx.app._requests.ask(ctx, "tools.invoke", params),
        lambda env: msgspec.convert(env, Invocation),
    )


class State:
    """A declared store (``ctx.state(name)``): ``get``/``set``/``delete``/``list``.

    In an async tool every method returns an awaitable.
    """

    def __init__(self, ctx: Context, name: str) -> None:
        self._ctx = ctx
        self.name = name

    def _ask(self, method: str, params: dict[str, Any]) -> Any:
        return self._ctx.app._requests.ask(self._ctx, method, {"name": self.name, **params})

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


def vault(ctx: Context, key: str) -> Any:
    # The value is masked from this sidecar's exported spans from now on (as the host masks
    # it from everything it writes).
    return _then(
        ctx.app._requests.ask(ctx, "vault.get", {"key": key}),
        lambda r: tracing.conceal(r["value"]),
    )
