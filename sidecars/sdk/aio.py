"""Async tools: a sidecar with any ``async def`` tool is served by one Trio event loop.

# Strategy: when a sidecar has an ``async def`` tool (or health check), ``Sidecar.run`` hands the
# protocol to :func:`serve`, a Trio loop in the main thread that owns the process's lifetime:
# stdin is read with a ``FdStream`` (no thread hop between a call line and its task), each async
# call is a task of the loop-wide nursery inside its own ``CancelScope`` (a host ``cancel``
# cancels that scope: the tool sees ``trio.Cancelled`` and its ``async with`` blocks close what
# they opened), and sync tools of the same sidecar run in worker threads
# (``trio.to_thread``, bounded by the advertised concurrency) exactly as in the threaded loop.
# Tasks a tool starts in ``ctx.nursery`` (the loop-wide nursery) outlive the call, so a
# connection opened by one call serves the next ones. Sidecars with only sync tools keep the
# thread-based loop of ``app.py`` unchanged.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from sidecars.sdk import tracing
from sidecars.sdk.lines import READ_CHUNK, LineReader
from supervisor.contracts import wire

if TYPE_CHECKING:
    from sidecars.sdk.app import Sidecar


async def _lines(stream: trio.lowlevel.FdStream, pending: bytes) -> AsyncIterator[bytes]:
    buf = bytearray(pending)
    start = 0
    while True:
        end = buf.find(b"\n", start)
        if end >= 0:
            yield bytes(buf[start : end + 1])
            start = end + 1
            continue
        del buf[:start]
        start = 0
        chunk = await stream.receive_some(READ_CHUNK)
        if not chunk:
            if buf:
                yield bytes(buf)
            return
        buf += chunk


async def serve(app: Sidecar, reader: LineReader) -> None:
    """Serve the persistent protocol on the current Trio loop until shutdown or EOF."""
    limiter = trio.CapacityLimiter(app.concurrency)
    decode = wire.host_decoder.decode
    stream = trio.lowlevel.FdStream(os.dup(reader.fd))
    async with trio.open_nursery() as nursery:
        try:
            async for line in _lines(stream, reader.take_pending()):
                try:
                    msg = decode(line)
                except msgspec.DecodeError as exc:
                    app._log("error", f"bad message from host: {exc}")
                    continue
                if isinstance(msg, wire.CallMessage):
                    flag = threading.Event()
                    with app._answered_lock:
                        app._pending[msg.id] = flag
                    spec = app.tools.get(msg.tool)
                    if spec is not None and spec.is_async:
                        scope = trio.CancelScope()
                        app._scopes[msg.id] = scope
                        nursery.start_soon(_async_call, app, msg, flag, scope, nursery)
                    else:
                        nursery.start_soon(_sync_call, app, msg, flag, limiter)
                elif isinstance(msg, wire.Ping):
                    nursery.start_soon(_pong, app, msg.id)
                elif isinstance(msg, wire.Cancel):
                    app._cancel(msg.id)
                elif isinstance(msg, wire.Response):
                    app._requests.resolve(msg)
                elif isinstance(msg, wire.Shutdown):
                    break
        finally:
            app._requests.fail_all("the host closed the connection")
            app._answer_pending("sidecar shutting down")
            nursery.cancel_scope.cancel()
            await stream.aclose()


async def _async_call(
    app: Sidecar,
    call: wire.CallMessage,
    flag: threading.Event,
    scope: trio.CancelScope,
    nursery: trio.Nursery,
) -> None:
    from sidecars.sdk.app import Context

    try:
        with scope:
            ctx = Context(app, call.id, call.deadlineMs, flag)
            ctx.nursery = nursery
            result = await tracing.run_async(
                app.name,
                call.tool,
                call.id,
                call.traceparent,
                call.tracestate,
                ctx,
                lambda: app.execute_async(call.tool, call.input, ctx),
            )
            result.id = call.id
            with app._answered_lock:
                if app._pending.pop(call.id, None) is None:
                    return  # cancelled meanwhile; that answer already went out
            app._send(result)
    except Exception:  # one broken call must not take the loop (and every call) down
        traceback.print_exc(file=sys.stderr)
    finally:
        app._scopes.pop(call.id, None)


async def _sync_call(
    app: Sidecar, call: wire.CallMessage, flag: threading.Event, limiter: trio.CapacityLimiter
) -> None:
    # A cancel answers at once and sets ``flag``; the thread finishes on its own. At shutdown
    # the loop does not wait for it.
    await trio.to_thread.run_sync(
        app._run_call, call, flag, limiter=limiter, abandon_on_cancel=True
    )


async def _pong(app: Sidecar, ping_id: str) -> None:
    tools: dict[str, wire.ToolHealth] = {}
    status: wire.HealthStatus = "healthy"
    check = app._health
    if check is not None and app._health_needed():
        try:
            answer = check(app)
            if isinstance(answer, Awaitable):
                answer = await answer
            tools = answer
        except Exception as exc:
            status = "degraded"
            app._log("error", f"health check raised: {exc!r}")
    app._send(wire.Pong(id=ping_id, status=status, tools=app._health_of(tools)))


async def run_with_nursery(fn: Callable[[trio.Nursery], Awaitable[Any]]) -> Any:
    """Run ``fn(nursery)`` with a nursery that is cancelled when ``fn`` returns (oneshot mode)."""
    async with trio.open_nursery() as nursery:
        try:
            return await fn(nursery)
        finally:
            nursery.cancel_scope.cancel()
