"""The invoke path: the gate, then one :class:`~supervisor.calls.call.Call` per call.

# Strategy: :meth:`Invoker.start` takes one :class:`~supervisor.calls.call.InvokeRequest` and
# answers at once what needs no worker (unknown tool, invisible, policy, approval, quota), then
# builds a Call from the request and hands it to the sidecar's pool; ``on_done`` gets the one
# envelope, from whichever tick ends the call (the worker's answer, the deadline timer, a
# cancel, a refusal). No task is spawned or woken per call: a call crosses two scheduler ticks
# (the client's frame, the sidecar's answer) when a worker has room, and waits as a queue entry
# when none has. A call an operator must approve is held with its request and resumed with the
# same request. The invoker is built from the narrow parts it needs (catalog, the pools as
# :class:`CallPool`, quotas, accounting, audit, telemetry), all handed in at construction; it
# never sees the host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import trio

from supervisor.calls.approvals import OPERATOR_PENDING, Approvals
from supervisor.calls.audit import AuditApproval, AuditLinks, AuditLog
from supervisor.calls.call import (
    Call,
    CallEngine,
    Dispatch,
    EnvelopeSink,
    InvokeRequest,
    ProgressSink,
    Redact,
)
from supervisor.calls.quotas import Quotas, refusal_envelope
from supervisor.calls.timers import Timers
from supervisor.contracts.envelope import Envelope
from supervisor.contracts.registry import SidecarConfig
from supervisor.contracts.rpc import Approval
from supervisor.policy import gate, results
from supervisor.processes import limits
from supervisor.registry.catalog import CatalogState

if TYPE_CHECKING:
    from supervisor.telemetry.tracing import Tracing

Account = Callable[[str, msgspec.Raw, Envelope], None]


class CallPool(Protocol):
    """What the invoker needs of a running sidecar's pool: its configuration (deadlines, output
    limits) and the queue its calls go to."""

    @property
    def config(self) -> SidecarConfig: ...

    @property
    def dispatch(self) -> Dispatch: ...


class Invoker:
    """Runs the tool calls of one host.

    Args:
        catalog: Descriptors and tool plans (the gate reads them).
        pools: The host's running pools by sidecar id (the live mapping).
        quotas: Call quotas (admit before a pool, release at the finish).
        account: Accounting of one envelope.
        timers: The host's timer heap (deadlines, backoff, approval waits).
        approvals: Calls waiting for an operator (``host.approvalSource: "operator"``).
        audit: The audit log (None: off).
        telemetry: Spans and metrics (None: off; then no hook runs).
        redact: Masks secrets in envelopes once one was handed out.
        clock: Seconds (``trio.current_time`` in the host).
    """

    def __init__(
        self,
        catalog: CatalogState,
        pools: Mapping[str, CallPool],
        quotas: Quotas,
        account: Account,
        *,
        timers: Timers,
        approvals: Approvals,
        audit: AuditLog | None = None,
        telemetry: Tracing | None = None,
        redact: Redact | None = None,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.catalog = catalog
        self.pools = pools
        self.quotas = quotas
        self.account = account
        self.clock = clock
        self.audit = audit
        self.timers = timers
        self.engine = CallEngine(
            clock, timers, release=quotas.release, record=self._finished, redact=redact
        )
        self.approvals = approvals
        self.telemetry = telemetry

    # starting ------------------------------------------------------------------------------

    def start(
        self,
        request: InvokeRequest,
        on_done: EnvelopeSink,
        on_progress: ProgressSink | None = None,
        *,
        operator_approved: bool = False,
    ) -> Call | None:
        """Start one call; ``on_done`` gets its envelope, exactly once (maybe before this
        returns), ``on_progress`` its progress payloads (raw JSON). Returns the call when it
        reached a pool (None: refused at the gate, or held for an operator).

        A child call (``request.parent`` set: a worker's ``tools.invoke``, PROTOCOL 3.5) passes
        the same gates; its deadline never outlives its parent's, and it is cancelled when its
        parent ends. ``request.trace`` is the OpenTelemetry context the call's span joins (the
        kernel request's span); a child's span joins its parent's. ``operator_approved``: an
        operator granted the call (:class:`~supervisor.calls.approvals.Approvals` resumes it).
        """
        t0 = self.clock()
        catalog = self.catalog
        tool = request.tool
        desc = catalog.get(tool)
        if desc is None:
            env = results.unavailable(tool, "unknown-tool", f"no tool named {tool!r} is known")
            self._refused(request, env, on_done)
            return None
        tp = catalog.tool_plan(tool)
        sidecar = desc.sidecar
        policy = tp.sandbox if tp is not None else desc.stability.sandbox
        # Operator approval (calls/approvals.py): the kernel's own approval is not honoured;
        # the gate passes the call, which then waits below for an operator's decision.
        hold = not operator_approved and self.approvals.operator_decides(policy)
        refusal = gate.refuse(
            desc,
            policy,
            OPERATOR_PENDING if hold else request.approval,
            lambda: self.quotas.blocking(sidecar, tool),
        )
        if refusal is not None:
            self._refused(request, refusal, on_done)
            return None
        pool = self.pools.get(sidecar or "")
        if pool is None:
            env = results.unavailable(
                tool, "unavailable", f"{tool}: sidecar {sidecar} is not running"
            )
            self._refused(request, env, on_done)
            return None
        parent = request.parent
        if hold:
            wait_ms = request.timeout_ms or desc.annotations.timeoutMs or pool.config.timeout_ms
            if parent is not None:
                wait_ms = min(wait_ms, parent.remaining_ms(t0))

            def resume(granted: Approval) -> None:
                granted_request = msgspec.structs.replace(request, approval=granted)
                self.start(granted_request, on_done, on_progress, operator_approved=True)

            def refuse(env: Envelope) -> None:
                self._refused(request, env, on_done)

            self.approvals.hold(
                request, sidecar=sidecar, timeout_ms=wait_ms, resume=resume, refuse=refuse
            )
            return None
        ticket = self.quotas.admit(sidecar, tool)
        if not isinstance(ticket, tuple):
            self._refused(request, refusal_envelope(tool, sidecar, ticket), on_done)
            return None
        config = pool.config
        timeout = request.timeout_ms or desc.annotations.timeoutMs or config.timeout_ms
        if parent is not None:
            timeout = min(timeout, parent.remaining_ms(t0))
        call = Call(
            self.engine,
            pool.dispatch,
            request,
            on_done,
            on_progress,
            t0=t0,
            timeout_ms=timeout,
            manifest=tp.manifest if tp is not None else None,
            max_output=limits.output_limit(config, tool, desc.annotations.resultLimit),
            ticket=ticket,
        )
        if parent is not None:
            if parent.children is None:
                parent.children = []
            parent.children.append(call)
            _adopt(parent, f"{tool}#{call.id}")
        tel = self.telemetry
        if tel is not None:
            call.trace = tel.call_started(call, request.trace)
        self.engine.begin(call)
        return call

    async def invoke(
        self, request: InvokeRequest, on_progress: ProgressSink | None = None
    ) -> Envelope:
        """Run one call to exactly one envelope (in-process callers; the server uses
        :meth:`start`). Cancelling the caller cancels the call."""
        done = trio.Event()
        box: list[Envelope] = []

        def on_done(env: Envelope) -> None:
            box.append(env)
            done.set()

        if request.key is None:
            request = msgspec.structs.replace(request, key=object())
        self.start(request, on_done, on_progress)
        try:
            await done.wait()
        except trio.Cancelled:
            self.cancel(request.key, "client disconnected")
            raise
        return box[0]

    def cancel(self, call_key: Any, message: str = "") -> bool:
        """Cancel the call registered under ``call_key``; False when there is none."""
        return self.engine.cancel(call_key, message) or self.approvals.cancel(call_key, message)

    def shutdown(self) -> None:
        """The host stops: calls waiting for a retry end now."""
        self.engine.shutdown("the host is stopping")

    async def drain(self, grace_s: float, message: str) -> int:
        """Wait (at most ``grace_s``) until no call runs, then cancel the ones still running
        with ``message``; returns how many were cut."""
        engine = self.engine
        if engine.live:
            idle = trio.Event()
            engine.on_idle = idle.set
            try:
                with trio.move_on_after(grace_s):
                    await idle.wait()
            finally:
                engine.on_idle = None
        return engine.cut(message)

    async def run_timers(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Fire deadlines and retry backoffs on time (one task per host)."""
        timers = self.timers
        scope = trio.CancelScope()

        def rearm(when: float) -> None:
            scope.deadline = when  # trio wakes this task then; nothing is woken now

        timers.rearm = rearm
        task_status.started()
        while True:
            timers.fire(trio.current_time())
            until = timers.next_due()
            timers.sleeping_until = until
            scope = trio.CancelScope(deadline=until)
            with scope:
                await trio.sleep_forever()

    # the end of every call -----------------------------------------------------------------

    def _refused(self, request: InvokeRequest, env: Envelope, on_done: EnvelopeSink) -> None:
        links = None
        parent = request.parent
        if parent is not None:
            engine = self.engine
            engine.seq += 1
            links = AuditLinks(call_id=engine.seq, via=f"{parent.tool}#{parent.id}")
            _adopt(parent, f"{request.tool}#{engine.seq}")
        self.record(request.client, request.tool, request.input, env, request.approval, links)
        on_done(env)

    def _finished(self, call: Call, env: Envelope) -> None:
        tel = self.telemetry
        if tel is not None:
            tel.call_finished(call, env)
        links = None
        if call.parent is not None or call.child_names or call.requests:
            parent = call.parent
            links = AuditLinks(
                call_id=call.id,
                via=f"{parent.tool}#{parent.id}" if parent is not None else None,
                children=call.child_names,
                requests=call.requests,
            )
        self.record(call.client, call.tool, call.input_raw, env, call.approval, links)

    def record(
        self,
        client: str,
        tool: str,
        input_raw: msgspec.Raw,
        env: Envelope,
        approval: Approval | None,
        links: AuditLinks | None = None,
    ) -> None:
        """Audit and account one finished call."""
        audit = self.audit
        if audit is not None:
            audit.record(
                client=client,
                tool=tool,
                input_json=bytes(input_raw),
                status=env.status,
                error_code=env.error.code if env.error is not None else None,
                duration_ms=env.meta.durationMs,
                sidecar=env.meta.sidecar,
                pid=env.meta.pid,
                attempts=env.meta.attempts,
                approval=(
                    AuditApproval(granted=approval.granted, by=approval.by)
                    if approval is not None
                    else None
                ),
                links=links,
            )
        self.account(tool, input_raw, env)
        tel = self.telemetry
        if tel is not None:
            tel.call_recorded(tool, env)


def _adopt(parent: Call, name: str) -> None:
    if parent.child_names is None:
        parent.child_names = []
    parent.child_names.append(name)
