"""Async tools: a sidecar with any ``async def`` tool is served by one Trio event loop.

# Strategy: when a sidecar has an ``async def`` tool (or health check), ``Sidecar.run`` hands the
# protocol to :func:`serve`, a Trio loop in the main thread that owns the process's lifetime:
# stdin is read with a ``FdStream`` (no thread hop between a call line and its task) into the
# same line splitter and the same session as the thread driver, each async call is a task of
# the loop-wide nursery inside its own ``CancelScope`` (a host ``cancel`` cancels that scope: the
# tool sees ``trio.Cancelled`` and its ``async with`` blocks close what they opened), and sync
# tools of the same sidecar run in worker threads (``trio.to_thread``, bounded by the advertised
# concurrency) exactly as under the thread driver (:func:`~sidecars.sdk.drivers.threads.run_call`).
# Tasks a tool starts in ``ctx.nursery`` (the loop-wide nursery) outlive the call, so a
# connection opened by one call serves the next ones. A health check runs as a task, so the loop
# keeps serving while an async check awaits.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Awaitable

import trio

from sidecars.sdk import health, tracing
from sidecars.sdk.context import Context, SidecarView
from sidecars.sdk.drivers.threads import run_call
from sidecars.sdk.execution import execute_async
from sidecars.sdk.stdio import LineReader, receive_lines
from sidecars.sdk.tools import HealthMap
from supervisor.contracts import wire


async def serve(app: SidecarView, reader: LineReader) -> None:
    """Serve the persistent protocol on the current Trio loop until shutdown or EOF.

    ``reader`` read the init line; what it read beyond it is served first.
    """
    session = app.session
    stream = trio.lowlevel.FdStream(os.dup(reader.fd))
    async with trio.open_nursery() as nursery:
        driver = _TrioDriver(app, nursery, trio.CapacityLimiter(app.concurrency))
        try:
            async for line in receive_lines(stream, reader.take_pending()):
                if not session.dispatch(line, driver):
                    break
        finally:
            session.close()
            nursery.cancel_scope.cancel()
            await stream.aclose()


class _TrioDriver:
    """The session's :class:`~sidecars.sdk.session.Driver` on one Trio loop."""

    def __init__(
        self, app: SidecarView, nursery: trio.Nursery, limiter: trio.CapacityLimiter
    ) -> None:
        self.app = app
        self.nursery = nursery
        self.limiter = limiter
        self.scopes: dict[int, trio.CancelScope] = {}
        """The async calls in flight, by id."""

    def call(self, call: wire.CallMessage, cancelled: threading.Event) -> None:
        spec = self.app.tools.get(call.tool)
        if spec is not None and spec.is_async:
            scope = trio.CancelScope()
            self.scopes[call.id] = scope
            self.nursery.start_soon(_async_call, self, call, cancelled, scope)
        else:
            self.nursery.start_soon(_sync_call, self.app, call, cancelled, self.limiter)

    def ping(self, ping_id: str) -> None:
        self.nursery.start_soon(_pong, self.app, ping_id)

    def cancelled(self, call_id: int) -> None:
        scope = self.scopes.pop(call_id, None)  # an async call (a sync one notices its flag)
        if scope is not None:
            scope.cancel()


async def _async_call(
    driver: _TrioDriver, call: wire.CallMessage, flag: threading.Event, scope: trio.CancelScope
) -> None:
    app = driver.app
    try:
        with scope:
            ctx = Context(app, call.id, call.deadlineMs, flag)
            ctx.nursery = driver.nursery
            result = await tracing.run_async(
                app.name,
                call.tool,
                call.id,
                call.traceparent,
                call.tracestate,
                ctx,
                lambda: execute_async(app, call.tool, call.input, ctx),
            )
            result.id = call.id
            app.session.answer(result)
    except Exception:  # one broken call must not take the loop (and every call) down
        traceback.print_exc(file=sys.stderr)
    finally:
        driver.scopes.pop(call.id, None)


async def _sync_call(
    app: SidecarView, call: wire.CallMessage, flag: threading.Event, limiter: trio.CapacityLimiter
) -> None:
    # A cancel answers at once and sets ``flag``; the thread finishes on its own. At shutdown
    # the loop does not wait for it.
    await trio.to_thread.run_sync(
        run_call, app, call, flag, limiter=limiter, abandon_on_cancel=True
    )


async def _pong(app: SidecarView, ping_id: str) -> None:
    answer: HealthMap | Awaitable[HealthMap] | Exception
    try:
        answer = health.check(app)
        if isinstance(answer, Awaitable):
            answer = await answer
    except Exception as exc:
        answer = exc
    app.session.send(health.pong(app, ping_id, answer))
