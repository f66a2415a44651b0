"""The default driver: a reading thread and a pool of call threads (every tool is sync).

# Strategy: the main thread only reads stdin and hands each line to the session
# (``sidecars.sdk.session``), so a busy pool still pongs and a cancel is answered at once: calls
# run on a thread pool sized to the advertised concurrency, a ``ping`` runs the (sync) health
# check on the reading thread, and a ``cancel`` sets the call's flag, which the tool notices
# through ``ctx.cancelled`` while the session has already answered ``cancelled``. Each call's
# CPU time (``time.thread_time``) is reported as ``cpuMs``. :func:`run_call` is also how the
# Trio driver runs a sync tool in a worker thread. On ``shutdown`` or EOF the session answers
# what is still in flight and the pool is shut down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from sidecars.sdk import health, tracing
from sidecars.sdk.context import Context, SidecarView
from sidecars.sdk.execution import execute
from sidecars.sdk.tools import HealthMap
from supervisor.contracts import wire


def serve(app: SidecarView, lines: Iterable[bytes]) -> None:
    """Serve the persistent protocol from ``lines`` until shutdown or EOF."""
    pool = ThreadPoolExecutor(max_workers=app.concurrency, thread_name_prefix="call")
    session = app.session
    driver = _ThreadDriver(app, pool)
    try:
        for line in lines:
            if not session.dispatch(line, driver):
                break
    finally:
        session.close()
        pool.shutdown(wait=True, cancel_futures=True)


class _ThreadDriver:
    """The session's :class:`~sidecars.sdk.session.Driver` on threads."""

    def __init__(self, app: SidecarView, pool: ThreadPoolExecutor) -> None:
        self.app = app
        self.pool = pool

    def call(self, call: wire.CallMessage, cancelled: threading.Event) -> None:
        self.pool.submit(run_call, self.app, call, cancelled)

    def ping(self, ping_id: str) -> None:
        answer: HealthMap | Exception
        try:
            answer = cast(HealthMap, health.check(self.app))
        except Exception as exc:
            answer = exc
        self.app.session.send(health.pong(self.app, ping_id, answer))

    def cancelled(self, call_id: int) -> None:
        pass  # a sync tool notices its flag (ctx.cancelled); the session has answered


def run_call(app: SidecarView, call: wire.CallMessage, cancelled: threading.Event) -> None:
    """Run one call of a sync tool in the current (worker) thread and answer it."""
    if cancelled.is_set():
        return
    t0 = time.thread_time()
    ctx = Context(app, call.id, call.deadlineMs, cancelled)
    result = tracing.run(
        app.name,
        call.tool,
        call.id,
        call.traceparent,
        call.tracestate,
        ctx,
        lambda: execute(app, call.tool, call.input, ctx),
    )
    result.id = call.id
    result.cpuMs = round((time.thread_time() - t0) * 1000.0, 3)
    app.session.answer(result)
