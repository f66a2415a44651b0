"""The persistent process-json worker (PROTOCOL 3.1) on the :class:`LineWorker` base."""

from __future__ import annotations

import trio

from supervisor.contracts import wire
from supervisor.protocols import process_json
from supervisor.protocols.errors import ProtocolError
from supervisor.protocols.process_json import MalformedRequest, ProcessJsonConnection
from supervisor.workers.base import (
    Call,
    CallOutcome,
    CallSlot,
    LaunchSpec,
    LineWorker,
    WorkerHooks,
)


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
        if self.conn.ready is None or not self._alive:
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
        self._begin(call_id, call, line)

    def _outcome(self, result: wire.Result) -> CallOutcome:
        return process_json.outcome(result, self.pid)

    async def ping(self, timeout_s: float) -> wire.Pong | None:
        if not self._alive or self.conn.state != "ready":
            return None
        ping_id, line = self.conn.ping()
        pong: wire.Pong | None = await self._wait_for(ping_id, line, timeout_s)
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
            self._answer(msg.id, msg)
        elif type(msg) is wire.Progress:
            self._progress(msg.id, msg.data)
        elif type(msg) is wire.Pong:
            self._resolve(msg.id, msg)
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
        slot = self.slots.get(req.callId) if req.callId is not None else None
        if slot is None or slot.abandoned:
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
            self.hooks.on_request(self, slot.call, req, self._respond)

    def _respond(self, response: wire.Response) -> None:
        if self._alive:
            self._write(self.conn.respond(response))
