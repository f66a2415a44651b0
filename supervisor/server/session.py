"""A kernel client session, independent of its transport (Unix stream or WebSocket).

# Strategy: a transport hands the session complete frames with the codec that decodes them; the
# session answers quick methods inline, starts ``tools.invoke`` inline (the call answers from the
# tick that ends it, with no task per call), and gives slow operator methods to a pool of
# long-lived invoker tasks it owns, grown on demand. Everything it sends goes through the
# transport's bounded :class:`OutQueue`; a client that stops reading is disconnected instead of
# making the host buffer without bound. A client that half-closes (EOF: it shut down its sending
# side, as ``nc`` does when its stdin ends) still reads: the transport stops reading, answers
# every request already read (:meth:`QueuedTransport.finish`), then closes. Only a client that is
# gone (a hang-up or reset seen on the socket, a failed write, a disconnect) makes the transport
# call :meth:`Session.leave`: every request whose frame was read and that changes state
# (``STATE_CHANGING_METHODS``, ``tools.invoke`` of a tool not marked read-only) runs to its end
# with its answer dropped; read-only ones are dropped (cancelled if running), each logged with
# why. Then the nursery holding the invokers is cancelled.
"""

from __future__ import annotations

import logging
import math
import select
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec
import trio

from supervisor.contracts.events import SubscribeParams
from supervisor.contracts.rpc import RequestId
from supervisor.host.host import Host
from supervisor.server.codec import BadFrame, BadParams, Codec
from supervisor.server.methods import (
    ALREADY_SENT,
    ASYNC_METHODS,
    STARTED_METHODS,
    SYNC_METHODS,
    AsyncMethod,
    Call,
    RpcFailure,
    changes_state,
)
from supervisor.telemetry.events import Subscription

log = logging.getLogger("toolhost.server")

MAX_INVOKERS = 8192
MAX_IDLE_INVOKERS = 64
MAX_PENDING_REQUESTS = 65536


class Transport(Protocol):
    def send(self, frame: bytes, binary: bool) -> None: ...

    def disconnect(self, reason: str) -> None: ...

    def switch_encoding(self, encoding: str) -> Codec: ...

    async def wait_backlog(self, limit: int) -> None: ...

    def backlog(self) -> int: ...


EVENTS_FLUSH_S = 0.02
"""Operator events are moved to the client at most this often: under load a console costs a
few writes a second instead of one per scheduler tick."""
EVENTS_BACKLOG = 256 * 1024
"""Operator events move to the client's outbound queue only while less than this waits there:
a client that stops reading makes its subscription drop events (``events.dropped``), it never
makes the host queue more."""


def hung_up(fd: int) -> bool:
    """The peer of socket ``fd`` is gone: it hung up entirely (closed, not just shut down its
    sending side) or the connection broke (a reset). A half-close is not a hang-up."""
    poller = select.poll()
    poller.register(fd, 0)  # POLLHUP and POLLERR are reported whatever the mask
    return bool(poller.poll(0))


async def wait_hung_up(fd: int) -> None:
    """Return once :func:`hung_up` is true for ``fd``, woken by the kernel (an epoll set that
    watches only for that); never returns where there is no epoll."""
    if not hasattr(select, "epoll"):  # pragma: no cover - Linux has it
        await trio.sleep_forever()
    ep = select.epoll()
    try:
        ep.register(fd, 0)  # EPOLLHUP and EPOLLERR only
        while not ep.poll(0):
            await trio.lowlevel.wait_readable(ep.fileno())
    finally:
        ep.close()


class OutQueue:
    """Frames waiting to be written, bounded in bytes.

    Args:
        limit: Bytes that may wait; past it ``on_overflow`` is called (the client is too slow).
        on_overflow: Called once with a reason when the bound is passed.
    """

    def __init__(self, limit: int, on_overflow: Callable[[str], None]) -> None:
        self.limit = limit
        self._items: deque[tuple[bytes, bool]] = deque()
        self._bytes = 0
        self._ready = trio.Event()
        self._drained = trio.Event()
        self._busy = False
        self._on_overflow = on_overflow
        self.closed = False

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def put(self, frame: bytes, binary: bool) -> None:
        if self.closed:
            return
        self._items.append((frame, binary))
        self._bytes += len(frame)
        if self._bytes > self.limit:
            self.closed = True
            self._on_overflow(f"client is not reading: over {self.limit} bytes queued")
            return
        self._ready.set()

    async def take(self) -> list[tuple[bytes, bool]]:
        """Everything queued (waits for at least one frame); marks the writer busy."""
        while not self._items:
            self._ready = trio.Event()
            await self._ready.wait()
        items = list(self._items)
        self._items.clear()
        self._bytes = 0
        self._busy = True
        return items

    def written(self) -> None:
        self._busy = False
        if not self._items:
            self._drained.set()

    async def drain(self, timeout_s: float) -> None:
        """Wait (bounded) until everything queued has been written."""
        with trio.move_on_after(timeout_s):
            while self._items or self._busy:
                self._drained = trio.Event()
                await self._drained.wait()


class QueuedTransport:
    """Shared by the transports: a session, a bounded outbound queue, and a disconnect that
    stops the reading (the transport sets ``_scope`` around its reader, then lets the session
    finish what changes state and cancels the rest)."""

    def __init__(self, host: Host, name: str, max_queue_bytes: int) -> None:
        self.session = Session(host, self, name)
        self.out = OutQueue(max_queue_bytes, self.disconnect)
        self._scope: trio.CancelScope | None = None
        self.close_reason = ""

    def send(self, frame: bytes, binary: bool) -> None:
        self.out.put(frame, binary)

    def disconnect(self, reason: str) -> None:
        if not self.close_reason:
            self.close_reason = reason
            log.warning("disconnecting %s: %s", self.session.client_name, reason)
        self.out.closed = True
        if self._scope is not None:
            self._scope.cancel()

    def gone(self, reason: str) -> None:
        """The client is gone (it hung up, the connection broke): stop as :meth:`disconnect`
        does, without its warning (hanging up is what clients do)."""
        if not self.close_reason:
            self.close_reason = reason
        self.out.closed = True
        if self._scope is not None:
            self._scope.cancel()

    async def finish(self, fd: int, flushed: Callable[[], Awaitable[None]]) -> None:
        """The client half-closed (EOF) after its frames: answer every request already read,
        wait for ``flushed`` (the answers written), then return so the transport closes. A
        hang-up or reset of socket ``fd`` meanwhile makes the client :meth:`gone` (the
        transport then lets :meth:`Session.leave` decide what still runs)."""
        if hung_up(fd):
            self.gone("the client closed its end")
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_hangup, fd)
            await self.session.answered()
            await flushed()
            nursery.cancel_scope.cancel()

    async def _watch_hangup(self, fd: int) -> None:
        await wait_hung_up(fd)
        self.gone("the client hung up")

    def switch_encoding(self, encoding: str) -> Codec:  # pragma: no cover - overridden
        raise NotImplementedError

    def backlog(self) -> int:
        """Bytes waiting to be written to the client."""
        return self.out.queued_bytes

    async def wait_backlog(self, limit: int) -> None:
        """Return once at most ``limit`` bytes wait to be written (or the client is gone)."""
        out = self.out
        while out.queued_bytes > limit and not out.closed:
            await out.drain(timeout_s=1.0)


class Session:
    """Requests of one client."""

    def __init__(self, host: Host, transport: Transport, name: str) -> None:
        self.host = host
        self.transport = transport
        self.client_name = name
        self._nursery: trio.Nursery | None = None
        self._inv_send, self._inv_recv = trio.open_memory_channel[
            tuple[str, AsyncMethod, Call, msgspec.Raw]
        ](math.inf)
        self._invokers = 0
        self._idle = 0
        self._queued = 0
        self._inflight: set[RequestId] = set()
        self._subscribed = False
        self._events: tuple[Subscription, trio.CancelScope] | None = None
        self._started: dict[RequestId, tuple[str, Call, msgspec.Raw]] = {}
        self._running: dict[RequestId, tuple[str, Call, msgspec.Raw, trio.CancelScope]] = {}
        self._leaving = False
        self._settled = trio.Event()
        self.closed = False
        # Fairness: past this many calls in flight the transport stops reading this client.
        self.max_calls = host.registry.host.max_calls_per_client
        self._room = trio.Event()
        self._quiet = trio.Event()

    def attach(self, nursery: trio.Nursery) -> None:
        """The nursery that owns the session's tasks (cancelled when the client leaves)."""
        self._nursery = nursery

    # SessionLike ---------------------------------------------------------------------------

    def send(self, frame: bytes, codec: Codec) -> None:
        if not self.closed:
            self.transport.send(frame, codec.binary)

    def switch_encoding(self, encoding: str) -> Codec:
        return self.transport.switch_encoding(encoding)

    def start_subscription(self, codec: Codec) -> None:
        if self._subscribed or self._nursery is None:
            return
        self._subscribed = True
        self._nursery.start_soon(self._forward_changes, self.host.subscribe(), codec)

    def start_events(self, codec: Codec, params: SubscribeParams) -> None:
        """Subscribe to operator events (replacing this session's earlier subscription)."""
        if self._nursery is None or self.closed:
            return
        self._stop_events()
        sub = self.host.events.subscribe(params.topics, params.sidecar)
        scope = trio.CancelScope()
        self._events = (sub, scope)
        self._nursery.start_soon(self._forward_events, sub, scope, codec)

    def _stop_events(self) -> None:
        if self._events is not None:
            sub, scope = self._events
            self._events = None
            self.host.events.unsubscribe(sub)
            scope.cancel()

    def call_key(self, request_id: RequestId) -> Any:
        return (id(self), request_id)

    def call_done(self, request_id: RequestId) -> None:
        self._started.pop(request_id, None)
        self._inflight.discard(request_id)
        self._wake()

    def _wake(self) -> None:
        """A request ended: room for the next frame; quiet once none is left."""
        self._room.set()
        if not self._inflight:
            self._quiet.set()

    async def answered(self) -> None:
        """Return once every request read so far has been answered."""
        while self._inflight:
            self._quiet = trio.Event()
            await self._quiet.wait()

    @property
    def full(self) -> bool:
        """The client has ``host.maxCallsPerClient`` calls in flight (read no more frames)."""
        return len(self._inflight) >= self.max_calls

    async def wait_room(self) -> None:
        """Wait until the client is under its cap again (or the session closed)."""
        while self.full and not self.closed:
            self._room = trio.Event()
            await self._room.wait()

    def close(self) -> None:
        """The client is gone: nothing more is sent, and its started calls still here are
        cancelled (the awaited methods end with the transport's nursery)."""
        self.closed = True
        self._stop_events()
        for rid in list(self._started):
            self.host.cancel(self.call_key(rid), "client disconnected")

    async def leave(self, why: str = "the client left") -> None:
        """The client left after the frames already read: finish what changes state, drop the
        rest (logged, with ``why``), and return once nothing that must finish is left.

        A request that changes state runs to its end (its answer goes nowhere); a read-only one
        is cancelled if running, skipped if still queued. Called by the transport once it has
        stopped reading; the transport then cancels the session's nursery.
        """
        self.closed = True
        self._leaving = True
        for rid, (name, call, params) in list(self._started.items()):
            if changes_state(call, name, params):
                self._keep(rid, name, why)
                del self._started[rid]  # runs on its worker; close() must not cancel it
            else:
                self._drop(rid, name, why, "running")
                self.host.cancel(self.call_key(rid), "client disconnected")
        for rid, (name, call, params, scope) in list(self._running.items()):
            if changes_state(call, name, params):
                self._keep(rid, name, why)
            else:
                self._drop(rid, name, why, "running")
                scope.cancel()
        self._check_settled()
        await self._settled.wait()

    def _keep(self, rid: RequestId, method: str, why: str) -> None:
        log.warning(
            "request %r (%s) from %s runs to its end although %s; its answer is dropped",
            rid,
            method,
            self.client_name,
            why,
        )

    def _drop(self, rid: RequestId, method: str, why: str, stage: str) -> None:
        log.warning(
            "dropped request %r (%s, %s) from %s: %s, and it is read-only",
            rid,
            method,
            stage,
            self.client_name,
            why,
        )

    def _check_settled(self) -> None:
        if self._leaving and self._queued == 0 and not self._running:
            self._settled.set()

    # handling ----------------------------------------------------------------------------

    def handle(self, frame: bytes, codec: Codec) -> None:
        """Decode one frame and answer it (now, or from an invoker task)."""
        try:
            req = codec.request(frame)
        except BadFrame as exc:
            self.send(codec.error(exc.request_id, "invalid-request", exc.message), codec)
            return
        rid = req.id
        method = SYNC_METHODS.get(req.method)
        if method is not None:
            call = Call(self, codec, rid)
            try:
                result = method(call, req.params)
            except BadParams as exc:
                self.send(codec.error(rid, "invalid-params", exc.message), codec)
            except RpcFailure as exc:
                self.send(codec.error(rid, exc.code, exc.message, exc.data), codec)
            except Exception as exc:
                log.exception("method %s failed", req.method)
                self.send(
                    codec.error(rid, "internal", f"{req.method}: {type(exc).__name__}: {exc}"),
                    codec,
                )
            else:
                if result is not ALREADY_SENT:
                    self.send(codec.response(rid, result), codec)
            return
        started = STARTED_METHODS.get(req.method)
        amethod = ASYNC_METHODS.get(req.method) if started is None else None
        if started is None and amethod is None:
            self.send(codec.error(rid, "unknown-method", f"unknown method {req.method!r}"), codec)
            return
        if rid in self._inflight:
            self.send(
                codec.error(rid, "invalid-request", f"request id {rid!r} is already in flight"),
                codec,
            )
            return
        if len(self._inflight) >= MAX_PENDING_REQUESTS:  # transports stop reading long before
            self.send(codec.error(rid, "overloaded", "too many requests in flight"), codec)
            return
        self._inflight.add(rid)
        call = Call(self, codec, rid)
        if started is not None:
            self._started[rid] = (req.method, call, req.params)
            try:
                started(call, req.params)
            except BadParams as exc:
                self.call_done(rid)
                self.send(codec.error(rid, "invalid-params", exc.message), codec)
            except RpcFailure as exc:
                self.call_done(rid)
                self.send(codec.error(rid, exc.code, exc.message, exc.data), codec)
            except Exception as exc:
                self.call_done(rid)
                log.exception("method %s failed", req.method)
                self.send(
                    codec.error(rid, "internal", f"{req.method}: {type(exc).__name__}: {exc}"),
                    codec,
                )
            return
        assert amethod is not None
        self._queued += 1
        self._inv_send.send_nowait((req.method, amethod, call, req.params))
        if self._queued > self._idle and self._invokers < MAX_INVOKERS and self._nursery:
            self._invokers += 1
            self._nursery.start_soon(self._invoker)

    async def _invoker(self) -> None:
        recv = self._inv_recv
        try:
            while True:
                self._idle += 1
                try:
                    name, method, call, params = await recv.receive()
                finally:
                    self._idle -= 1
                self._queued -= 1
                if self._leaving:
                    if not changes_state(call, name, params):
                        self._drop(call.rid, name, "the client left before it ran", "queued")
                        self._inflight.discard(call.rid)
                        self._wake()
                        self._check_settled()
                        continue
                    self._keep(call.rid, name, "the client left before it ran")
                with trio.CancelScope() as scope:
                    self._running[call.rid] = (name, call, params, scope)
                    try:
                        await self._run_async(method, call, params)
                    finally:
                        del self._running[call.rid]
                        self._inflight.discard(call.rid)
                        self._wake()
                        self._check_settled()
                if self._idle >= MAX_IDLE_INVOKERS:
                    return
        finally:
            self._invokers -= 1

    async def _run_async(self, method: AsyncMethod, call: Call, params: msgspec.Raw) -> None:
        codec = call.codec
        try:
            result = await method(call, params)
        except BadParams as exc:
            self.send(codec.error(call.rid, "invalid-params", exc.message), codec)
        except RpcFailure as exc:
            self.send(codec.error(call.rid, exc.code, exc.message, exc.data), codec)
        except Exception as exc:
            log.exception("async method failed")
            self.send(codec.error(call.rid, "internal", f"{type(exc).__name__}: {exc}"), codec)
        else:
            self.send(codec.response(call.rid, result), codec)

    async def _forward_events(
        self, sub: Subscription, scope: trio.CancelScope, codec: Codec
    ) -> None:
        """Move a subscription's events to the client, pausing while its backlog is large."""
        try:
            with scope:
                while not self.closed:
                    events = await sub.take()
                    if not events:
                        return
                    for i, (name, data) in enumerate(events):
                        if self.transport.backlog() > EVENTS_BACKLOG:
                            sub.put_back(events[i:])
                            break
                        self.send(codec.event(name, data), codec)
                    await self.transport.wait_backlog(EVENTS_BACKLOG)
                    await trio.sleep(EVENTS_FLUSH_S)  # let the next events gather
        finally:
            self.host.events.unsubscribe(sub)

    async def _forward_changes(self, recv: trio.MemoryReceiveChannel[Any], codec: Codec) -> None:
        async with recv:
            async for event in recv:
                self.send(codec.event("catalog.changed", event), codec)
        self.transport.disconnect("catalog subscription fell behind")
