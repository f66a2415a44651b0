"""The persistent process-json worker (PROTOCOL 3.1): a :class:`LineWorker` on the sans-IO
:class:`~supervisor.protocols.process_json.ProcessJsonConnection`.

# Strategy: the process life is :class:`LineWorker`'s; this module speaks the protocol. The
# handshake writes ``init`` and waits for ``ready`` within ``startTimeoutMs`` (the worker's
# announced concurrency becomes its capacity). A call is a ``call`` line on a slot keyed by the
# connection's call id; its ``result`` becomes the call's outcome (the one conversion,
# :func:`~supervisor.protocols.process_json.outcome`), ``progress`` goes to the call, ``pong``
# answers the probe, ``log`` lines join stderr, and a host-service ``request`` (PROTOCOL 3.5) for
# a call in flight goes to the pool's services (anything else is answered with an error, never
# a protocol break). An abandoned call is sent ``cancel``; the worker must answer it in time.
"""

from __future__ import annotations

import trio

from supervisor.calls.call import Call
from supervisor.contracts import wire
from supervisor.protocols.errors import ProtocolError
from supervisor.protocols.outcome import CallOutcome
from supervisor.protocols.process_json import MalformedRequest, ProcessJsonConnection, outcome
from supervisor.workers.base import LaunchSpec, WorkerHooks
from supervisor.workers.line import LineWorker
from supervisor.workers.slots import CallSlot


class ProcessWorker(LineWorker):
    """A long-lived child process speaking persistent process-json (PROTOCOL 3.1)."""

    def __init__(self, spec: LaunchSpec, hooks: WorkerHooks, index: int = 0) -> None:
        super().__init__(spec, hooks, index)
        self.conn = ProcessJsonConnection(max_line=spec.max_line)

    async def _handshake(self) -> None:
        init = self.spec.init
        if init is not None:
            self._write(self.conn.init(init))
        with trio.move_on_after(self.spec.start_timeout_s) as cs:
            await self._ready_or_dead.wait()
        if cs.cancelled_caught:
            ms = int(self.spec.start_timeout_s * 1000)
            self.kill("start-timeout", f"no ready message within startTimeoutMs={ms}")
            return
        if self.conn.ready is None or not self.alive:
            return
        self.ready_msg = self.conn.ready
        self.concurrency = max(1, self.conn.ready.concurrency)
        await self._became_ready()

    def _goodbye(self) -> bytes | None:
        return self.conn.shutdown()

    def _cancel_line(self, slot: CallSlot) -> bytes | None:
        return self.conn.abandon(slot.id)

    def start(self, call: Call) -> None:
        ct = call.trace
        ms = call.remaining_ms(trio.current_time())
        try:
            if ct is None:
                call_id, line = self.conn.call(call.tool, call.input_raw, ms)
            else:
                call_id, line = self.conn.call(
                    call.tool, call.input_raw, ms, ct.traceparent, ct.tracestate
                )
        except ProtocolError as exc:
            call.ended(
                CallOutcome(ok=False, code="worker-crashed", error=exc.message, pid=self.pid)
            )
            return
        self.calls.add(call_id, call)
        self._write(line)

    async def ping(self, timeout_s: float) -> wire.Pong | None:
        if not self.alive or self.conn.state != "ready":
            return None
        ping_id, line = self.conn.ping()
        self._write(line)
        pong: wire.Pong | None = await self.calls.wait_for(ping_id, timeout_s)
        return pong

    def _receive(self, data: bytes) -> None:
        dispatch = self._dispatch
        try:
            msgs = self.conn.feed(data)
        except ProtocolError as exc:
            for msg in exc.accepted:
                dispatch(msg)
            raise
        for msg in msgs:
            dispatch(msg)

    def _dispatch(self, msg: wire.WorkerMessage | MalformedRequest) -> None:
        if type(msg) is wire.Result:
            self.calls.answer(msg.id, outcome(msg, self.pid))
        elif type(msg) is wire.Progress:
            self.calls.progress(msg.id, msg.data)
        elif type(msg) is wire.Pong:
            self.calls.resolve(msg.id, msg)
        elif type(msg) is wire.Ready:
            self._ready_or_dead.set()
        elif type(msg) is wire.Log:
            self.stderr.write(f"[{msg.level}] {msg.message}\n".encode("utf-8", "replace"))
        elif type(msg) is wire.Request:
            self._request(msg)
        elif type(msg) is MalformedRequest:
            self._respond(
                wire.Response(
                    id=msg.id,
                    error=wire.ServiceError(
                        code="invalid-request", message=f"invalid request: {msg.problem}"
                    ),
                )
            )

    def _request(self, req: wire.Request) -> None:
        """A host-service request (PROTOCOL 3.5): checked here, answered by the pool's
        services; a bad one gets an error response, never a protocol break (the connection
        turned one with missing or wrongly typed fields into a ``MalformedRequest``)."""
        call = self.calls.call_on(req.callId) if req.callId is not None else None
        if call is None:
            self._respond(
                wire.Response(
                    id=req.id,
                    error=wire.ServiceError(
                        code="unknown-call",
                        message=f"call {req.callId} is not in flight on this worker",
                    ),
                )
            )
        else:
            self.hooks.on_request(self, call, req, self._respond)

    def _respond(self, response: wire.Response) -> None:
        if self.alive:
            self._write(self.conn.respond(response))
