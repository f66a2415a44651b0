"""Async tools: one Trio event loop per sidecar process, in its own thread.

# Strategy: the SDK's main thread keeps reading stdin exactly as for sync tools (so pings and
# cancels are answered at once whatever the tools do). The first time the sidecar needs async
# (at ``ready`` when any tool or the health check is ``async def``), :class:`AsyncRunner` starts
# a daemon thread running ``trio.run``. That loop lives as long as the process: a tool may leave
# tasks and connections (a WebSocket) in :attr:`AsyncRunner.nursery` (``ctx.nursery``) and find
# them on its next call. The main thread hands work to the loop with the loop's TrioToken
# (``run_sync_soon``), and a host ``cancel`` becomes ``CancelScope.cancel()`` on that call's
# scope: the tool sees a real ``trio.Cancelled`` at its next checkpoint, and its ``async with``
# blocks close what they opened.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import trio

# A unit of async work: gets the loop-wide nursery, returns when done.
Job = Callable[[trio.Nursery], Awaitable[None]]


class AsyncRunner:
    """The sidecar's single Trio event loop, running in a daemon thread."""

    def __init__(self, name: str = "sidecar") -> None:
        self._name = name
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._scopes: dict[int, trio.CancelScope] = {}
        self._lock = threading.Lock()
        self._startup_error: BaseException | None = None

    @property
    def nursery(self) -> trio.Nursery:
        """The loop-wide nursery: tasks started here outlive the call that started them."""
        if self._nursery is None:
            raise RuntimeError("the async runner is not started")
        return self._nursery

    @property
    def running(self) -> bool:
        return self._token is not None

    def start(self) -> None:
        """Start the loop thread (idempotent) and wait until it accepts work."""
        with self._lock:
            if self._thread is not None:
                self._started.wait()
                return
            self._thread = threading.Thread(
                target=self._thread_main, name=f"{self._name}-trio", daemon=True
            )
            self._thread.start()
        self._started.wait()
        if self._startup_error is not None:
            raise RuntimeError("the async runner failed to start") from self._startup_error

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # the loop itself died: record it, calls will see it
            self._startup_error = exc
            self._token = None
            self._started.set()

    async def _main(self) -> None:
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            self._started.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()
        self._token = None

    def submit(self, job: Job, *, key: int | None = None) -> None:
        """Run ``job`` on the loop; with ``key`` it can be cancelled with :meth:`cancel`.

        Thread-safe; returns at once. Raises ``RuntimeError`` if the loop is not running.
        """
        self.start()
        token = self._token
        if token is None:
            raise RuntimeError("the async runner has stopped")
        token.run_sync_soon(self._spawn, job, key)

    def _spawn(self, job: Job, key: int | None) -> None:
        # The scope is registered here, in submission order, so a cancel that follows the
        # submit at once still finds it (a scope cancelled before it is entered works).
        scope = trio.CancelScope()
        if key is not None:
            with self._lock:
                self._scopes[key] = scope
        self.nursery.start_soon(self._guarded, job, key, scope)

    async def _guarded(self, job: Job, key: int | None, scope: trio.CancelScope) -> None:
        try:
            with scope:
                await job(self.nursery)
        except Exception:  # one broken job must not take the loop (and every call) down
            traceback.print_exc(file=sys.stderr)
        finally:
            if key is not None:
                with self._lock:
                    self._scopes.pop(key, None)

    def cancel(self, key: int) -> None:
        """Cancel the job submitted with ``key`` (no-op when it already ended). Thread-safe."""
        token = self._token
        if token is None:
            return
        try:
            token.run_sync_soon(self._cancel_in_loop, key)
        except trio.RunFinishedError:
            pass

    def _cancel_in_loop(self, key: int) -> None:
        with self._lock:
            scope = self._scopes.get(key)
        if scope is not None:
            scope.cancel()

    def stop(self, timeout: float = 2.0) -> None:
        """Cancel every task (calls and long-lived state) and wait for the loop thread to end."""
        token, stop, thread = self._token, self._stop, self._thread
        if token is not None and stop is not None:
            try:
                token.run_sync_soon(stop.set)
            except trio.RunFinishedError:
                pass
        if thread is not None:
            thread.join(timeout)


async def run_with_nursery(fn: Callable[[trio.Nursery], Awaitable[Any]]) -> Any:
    """Run ``fn(nursery)`` with a nursery that is cancelled when ``fn`` returns (oneshot mode)."""
    async with trio.open_nursery() as nursery:
        try:
            return await fn(nursery)
        finally:
            nursery.cancel_scope.cancel()
