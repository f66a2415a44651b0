"""A kernel client session, independent of its transport (Unix stream or WebSocket).

# Strategy: a transport hands the session complete frames with the codec that decodes them; the
# session looks each method up once in the method table (``server/methods.py``) and answers
# ``quick`` methods inline, starts ``started`` ones inline (``tools.invoke``, and the reads of
# hosted MCP servers: each answers from the tick that ends it, with no task per request; a read
# is abandoned through what it registered, ``read_started``), and gives ``awaited`` operator
# methods to
# a pool of long-lived runner tasks it owns, grown on demand. Everything it sends goes through
# its transport (``server/transport.py``: bounded, a slow client is disconnected). A client that
# half-closes (EOF: it shut down its sending side, as ``nc`` does when its stdin ends) still
# reads: the transport stops reading, answers every request already read, then closes. Only a
# client that is gone (a hang-up or reset seen on the socket, a failed write, a disconnect)
# makes the transport call :meth:`Session.leave`: every request whose frame was read and that
# changes state (its row in the method table says so; ``tools.invoke`` of a tool not marked
# read-only too) runs to its end with its answer dropped; read-only ones are dropped
# (cancelled if running), each logged with why. Then the nursery holding the runners is
# cancelled.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
import trio

from supervisor.contracts.events import SubscribeParams
from supervisor.contracts.rpc import Request, RequestId
from supervisor.server.adopt import Adopter
from supervisor.server.backend import Backend
from supervisor.server.codec import BadFrame, BadParams, Codec
from supervisor.server.methods import (
    ALREADY_SENT,
    METHODS,
    Handler,
    RequestContext,
    RpcFailure,
    changes_state,
)
from supervisor.telemetry.events import Subscription

log = logging.getLogger("toolhost.server")

MAX_RUNNERS = 8192
"""Runner tasks one session may have (each runs one awaited method at a time)."""
MAX_IDLE_RUNNERS = 64
MAX_PENDING_REQUESTS = 65536


class Transport(Protocol):
    """What a session needs of its transport."""

    def send(self, frame: bytes, binary: bool) -> None: ...

    def send_result(self, request_id: RequestId, result: Any, codec: Codec) -> None: ...

    def disconnect(self, reason: str) -> None: ...

    def switch_encoding(self, encoding: str) -> Codec: ...

    async def wait_backlog(self, limit: int) -> None: ...

    def backlog(self) -> int: ...

    def adopt(self, adopter: Adopter, checked: Any) -> None: ...


EVENTS_FLUSH_S = 0.02
"""Operator events are moved to the client at most this often: under load a console costs a
few writes a second instead of one per scheduler tick."""
EVENTS_BACKLOG = 256 * 1024
"""Operator events move to the client's outbound queue only while less than this waits there:
a client that stops reading makes its subscription drop events (``events.dropped``), it never
makes the host queue more."""


class Session:
    """Requests of one client."""

    def __init__(self, backend: Backend, transport: Transport, name: str) -> None:
        self.backend = backend
        self.transport = transport
        self.client_name = name
        self._nursery: trio.Nursery | None = None
        self._queue_send, self._queue_recv = trio.open_memory_channel[
            tuple[str, Handler, RequestContext, msgspec.Raw]
        ](math.inf)
        self._runners = 0
        self._idle = 0
        self._queued = 0
        self._inflight: set[RequestId] = set()
        self._subscribed = False
        self._events: tuple[Subscription, trio.CancelScope] | None = None
        self._started: dict[RequestId, tuple[str, RequestContext, msgspec.Raw]] = {}
        self._reads: dict[RequestId, Callable[[], None]] = {}
        """Reads of hosted MCP servers out now (``resources.read``, ``prompts.get``,
        ``completion.complete``: started methods), with what abandons each."""
        self._running: dict[
            RequestId, tuple[str, RequestContext, msgspec.Raw, trio.CancelScope]
        ] = {}
        self._leaving = False
        self._settled = trio.Event()
        self.closed = False
        # Fairness: past this many calls in flight the transport stops reading this client.
        self.max_calls = backend.views.host_config().max_calls_per_client
        self._room = trio.Event()
        self._quiet = trio.Event()

    def attach(self, nursery: trio.Nursery) -> None:
        """The nursery that owns the session's tasks (cancelled when the client leaves)."""
        self._nursery = nursery

    # SessionLike ---------------------------------------------------------------------------

    def send(self, frame: bytes, codec: Codec) -> None:
        if not self.closed:
            self.transport.send(frame, codec.binary)

    def send_result(self, request_id: RequestId, result: Any, codec: Codec) -> None:
        """The response to ``request_id``: encoded by the transport (an in-memory one hands a
        client in this process the object when it asked for it)."""
        if not self.closed:
            self.transport.send_result(request_id, result, codec)

    def switch_encoding(self, encoding: str) -> Codec:
        return self.transport.switch_encoding(encoding)

    def start_subscription(self, codec: Codec) -> None:
        if self._subscribed or self._nursery is None:
            return
        self._subscribed = True
        self._nursery.start_soon(self._forward_changes, self.backend.feed.subscribe(), codec)

        def lists_changed(kinds: tuple[str, ...]) -> None:
            self.send(codec.event("offers.changed", {"kinds": list(kinds)}), codec)

        self.backend.offers.watch_lists(self, lists_changed)

    def start_events(self, codec: Codec, params: SubscribeParams) -> None:
        """Subscribe to operator events (replacing this session's earlier subscription)."""
        if self._nursery is None or self.closed:
            return
        self._stop_events()
        sub = self.backend.events.subscribe(params.topics, params.sidecar)
        scope = trio.CancelScope()
        self._events = (sub, scope)
        self._nursery.start_soon(self._forward_events, sub, scope, codec)

    def _stop_events(self) -> None:
        if self._events is not None:
            sub, scope = self._events
            self._events = None
            self.backend.events.unsubscribe(sub)
            scope.cancel()

    def call_key(self, request_id: RequestId) -> Any:
        return (id(self), request_id)

    def cancel_request(self, request_id: RequestId) -> bool:
        """``tools.cancel`` of a read of a hosted MCP server (``resources.read``,
        ``prompts.get``, ``completion.complete``): it stops (the server is told) and is answered
        with the error ``cancelled``. False when no such request of this client is out."""
        cancel = self._reads.pop(request_id, None)
        if cancel is None:
            return False
        cancel()
        name, ctx, _ = self._started[request_id]
        self.call_done(request_id)
        message = f"{name} cancelled by tools.cancel"
        self.send(ctx.codec.error(request_id, "cancelled", message), ctx.codec)
        return True

    def adopt(self, adopter: Adopter, checked: Any) -> None:
        """``mcp.adopt`` accepted by the adopter: the transport takes the descriptors next
        (raises ``AdoptRefused`` when it cannot)."""
        self.transport.adopt(adopter, checked)

    def read_started(self, request_id: RequestId, cancel: Callable[[], None]) -> None:
        """A read of a hosted MCP server is out (``methods._offer_call``): ``cancel`` abandons
        it (``tools.cancel``, the client gone)."""
        self._reads[request_id] = cancel

    def read_done(self, request_id: RequestId) -> bool:
        """The read's answer (or error) came: True when it is still to be sent (False: it was
        cancelled, or its client left)."""
        if self._reads.pop(request_id, None) is None:
            return False
        self.call_done(request_id)
        return True

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
        self.backend.offers.drop(self)  # its resource subscriptions and list watch end
        reads, self._reads = self._reads, {}
        for cancel in reads.values():
            cancel()
        for rid in list(self._started):
            if rid not in reads:
                self.backend.invoker.cancel(self.call_key(rid), "client disconnected")

    async def leave(self, why: str = "the client left") -> None:
        """The client left after the frames already read: finish what changes state, drop the
        rest (logged, with ``why``), and return once nothing that must finish is left.

        A request that changes state runs to its end (its answer goes nowhere); a read-only one
        is cancelled if running, skipped if still queued. Called by the transport once it has
        stopped reading; the transport then cancels the session's nursery.
        """
        self.closed = True
        self._leaving = True
        self.backend.offers.drop(self)
        for rid, (name, ctx, params) in list(self._started.items()):
            cancel = self._reads.pop(rid, None)
            if cancel is not None:  # a read: nothing to finish
                self._drop(rid, name, why, "running")
                cancel()
                self.call_done(rid)
                continue
            if changes_state(ctx, name, params):
                self._keep(rid, name, why)
                del self._started[rid]  # runs on its worker; close() must not cancel it
            else:
                self._drop(rid, name, why, "running")
                self.backend.invoker.cancel(self.call_key(rid), "client disconnected")
        for rid, (name, ctx, params, scope) in list(self._running.items()):
            if changes_state(ctx, name, params):
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

    def handle(self, frame: bytes | Request, codec: Codec) -> None:
        """Decode one frame and answer it (now, or from a runner task)."""
        try:
            req = codec.request(frame)
        except BadFrame as exc:
            self.send(codec.error(exc.request_id, "invalid-request", exc.message), codec)
            return
        rid = req.id
        name = req.method
        method = METHODS.get(name)
        if method is None:
            self.send(codec.error(rid, "unknown-method", f"unknown method {name!r}"), codec)
            return
        kind = method.kind
        if kind == "quick":
            ctx = RequestContext(self, codec, rid)
            try:
                result = method.run(ctx, req.params)
            except BadParams as exc:
                self.send(codec.error(rid, "invalid-params", exc.message), codec)
            except RpcFailure as exc:
                self.send(codec.error(rid, exc.code, exc.message, exc.data), codec)
            except Exception as exc:
                log.exception("method %s failed", name)
                self.send(
                    codec.error(rid, "internal", f"{name}: {type(exc).__name__}: {exc}"), codec
                )
            else:
                if result is not ALREADY_SENT:
                    self.send_result(rid, result, codec)
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
        ctx = RequestContext(self, codec, rid)
        if kind == "started":
            self._started[rid] = (name, ctx, req.params)
            try:
                method.run(ctx, req.params)
            except BadParams as exc:
                self.call_done(rid)
                self.send(codec.error(rid, "invalid-params", exc.message), codec)
            except RpcFailure as exc:
                self.call_done(rid)
                self.send(codec.error(rid, exc.code, exc.message, exc.data), codec)
            except Exception as exc:
                self.call_done(rid)
                log.exception("method %s failed", name)
                self.send(
                    codec.error(rid, "internal", f"{name}: {type(exc).__name__}: {exc}"), codec
                )
            return
        self._queued += 1
        self._queue_send.send_nowait((name, method.run, ctx, req.params))
        if self._queued > self._idle and self._runners < MAX_RUNNERS and self._nursery:
            self._runners += 1
            self._nursery.start_soon(self._runner)

    async def _runner(self) -> None:
        """Run awaited methods one after another (one of the session's runner tasks)."""
        recv = self._queue_recv
        try:
            while True:
                self._idle += 1
                try:
                    name, run, ctx, params = await recv.receive()
                finally:
                    self._idle -= 1
                self._queued -= 1
                if self._leaving:
                    if not changes_state(ctx, name, params):
                        self._drop(ctx.rid, name, "the client left before it ran", "queued")
                        self._inflight.discard(ctx.rid)
                        self._wake()
                        self._check_settled()
                        continue
                    self._keep(ctx.rid, name, "the client left before it ran")
                with trio.CancelScope() as scope:
                    self._running[ctx.rid] = (name, ctx, params, scope)
                    try:
                        await self._run_awaited(run, ctx, params)
                    finally:
                        del self._running[ctx.rid]
                        self._inflight.discard(ctx.rid)
                        self._wake()
                        self._check_settled()
                if self._idle >= MAX_IDLE_RUNNERS:
                    return
        finally:
            self._runners -= 1

    async def _run_awaited(self, run: Handler, ctx: RequestContext, params: msgspec.Raw) -> None:
        codec = ctx.codec
        try:
            result = await run(ctx, params)
        except BadParams as exc:
            self.send(codec.error(ctx.rid, "invalid-params", exc.message), codec)
        except RpcFailure as exc:
            self.send(codec.error(ctx.rid, exc.code, exc.message, exc.data), codec)
        except Exception as exc:
            log.exception("async method failed")
            self.send(codec.error(ctx.rid, "internal", f"{type(exc).__name__}: {exc}"), codec)
        else:
            self.send_result(ctx.rid, result, codec)

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
            self.backend.events.unsubscribe(sub)

    async def _forward_changes(self, recv: trio.MemoryReceiveChannel[Any], codec: Codec) -> None:
        async with recv:
            async for event in recv:
                self.send(codec.event("catalog.changed", event), codec)
        self.transport.disconnect("catalog subscription fell behind")
