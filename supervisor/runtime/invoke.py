"""The invoke path: one door to every sidecar, in two gears.

# Strategy: :meth:`Invoker.prepare` answers everything that needs no worker (unknown tool,
# invisible, policy, approval) and works out the deadline. Then:
#
# - the *direct* gear (:meth:`Invoker.start`) runs when a worker has room right now and nothing
#   needs an awaiting task (no queue, no retry): the call line is written on the caller's task
#   and the answer is turned into an envelope inside the worker's reader task, through a
#   callback. No task is woken between the client's frame and the sidecar, none between the
#   sidecar's answer and the client: two scheduler ticks per call instead of four. Deadlines
#   are kept by one :class:`DeadlineQueue` task (a FIFO per timeout value, since calls with the
#   same timeout expire in the order they started), not a cancel scope per call.
# - the *awaiting* gear (:meth:`Invoker.run`) handles the rest: waiting for a free worker,
#   retries, and every worker kind without a direct start (oneshot, simple-json, MCP).
#
# Both end in :meth:`Invoker.conclude` (the result funnel) and :meth:`Invoker.record` (audit and
# accounting), so what a caller sees does not depend on the gear.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from supervisor.contracts.envelope import Envelope
from supervisor.contracts.manifest import ToolManifest
from supervisor.contracts.rpc import Approval
from supervisor.contracts.snapshot import Descriptor
from supervisor.policy import gate, results, retry
from supervisor.runtime import limits
from supervisor.runtime.approvals import OPERATOR_PENDING, Approvals, await_operator
from supervisor.runtime.audit import AuditApproval
from supervisor.runtime.quotas import refusal_envelope
from supervisor.runtime.worker import CallOutcome, CallSlot, LineWorker, ProgressSink

if TYPE_CHECKING:
    from supervisor.runtime.host import Host
    from supervisor.runtime.pool import Pool

EnvelopeSink = Callable[[Envelope], None]


class Prepared:
    """A call that passed the gate: where it goes and until when it may run."""

    __slots__ = ("desc", "granted", "manifest", "operator", "pool", "t0", "timeout", "tool")

    def __init__(
        self,
        tool: str,
        desc: Descriptor,
        pool: Pool,
        timeout: int,
        manifest: ToolManifest | None,
        t0: float,
    ) -> None:
        self.tool = tool
        self.desc = desc
        self.pool = pool
        self.timeout = timeout
        self.manifest = manifest
        self.t0 = t0
        self.operator = False
        """Approval must come from an operator (``approvals.await_operator``) before it runs."""
        self.granted: Approval | None = None
        """The operator's approval once given (what the audit records)."""


class CallHandle:
    """How ``tools.cancel`` reaches an awaiting call: the current attempt's scope, and a flag
    telling an explicit cancel from a deadline expiry."""

    __slots__ = ("cancelled", "scope")

    def __init__(self) -> None:
        self.cancelled = False
        self.scope: trio.CancelScope | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()

    def waiting(self) -> trio.CancelScope:
        """A scope for the pause between retries that :meth:`cancel` also reaches."""
        self.scope = trio.CancelScope()
        return self.scope


class _Expiring(deque["DirectCall"]):
    """Direct calls sharing one timeout, oldest first (so deadlines are in order)."""

    live = 0


class DeadlineQueue:
    """Expires direct calls at their deadlines from one task."""

    def __init__(self) -> None:
        self._queues: dict[int, _Expiring] = {}
        self._wake = trio.Event()
        self._until = math.inf

    def add(self, call: DirectCall) -> None:
        q = self._queues.get(call.prep.timeout)
        if q is None:
            q = self._queues[call.prep.timeout] = _Expiring()
        while q and q[0].finished:
            q.popleft()
        q.append(call)
        q.live += 1
        call.queue = q
        if len(q) > 4 * q.live + 64:  # a long call holds finished ones behind it: compact
            live = [c for c in q if not c.finished]
            q.clear()
            q.extend(live)
        if call.deadline < self._until:
            self._wake.set()

    async def run(self) -> None:
        while True:
            now = trio.current_time()
            earliest = math.inf
            for q in list(self._queues.values()):
                while q and (q[0].finished or q[0].deadline <= now):
                    call = q.popleft()
                    if not call.finished:
                        call.expire()
                if q:
                    earliest = min(earliest, q[0].deadline)
            self._until = earliest
            self._wake = trio.Event()
            with trio.move_on_at(earliest):
                await self._wake.wait()


class DirectCall:
    """A call of the direct gear: started on the caller's task, finished by callbacks."""

    __slots__ = (
        "approval",
        "client",
        "deadline",
        "finished",
        "input_raw",
        "invoker",
        "key",
        "on_done",
        "prep",
        "queue",
        "slot",
        "ticket",
        "worker",
    )

    def __init__(
        self,
        invoker: Invoker,
        prep: Prepared,
        input_raw: msgspec.Raw,
        approval: Approval | None,
        client: str,
        key: Any,
        ticket: tuple[str, ...],
        on_done: EnvelopeSink,
    ) -> None:
        self.invoker = invoker
        self.prep = prep
        self.input_raw = input_raw
        self.approval = approval
        self.client = client
        self.key = key
        self.ticket = ticket
        self.on_done = on_done
        self.deadline = prep.t0 + prep.timeout / 1000.0
        self.finished = False
        self.queue: _Expiring | None = None
        self.worker: LineWorker | None = None
        self.slot: CallSlot | None = None

    def answered(self, slot: CallSlot) -> None:
        """The worker's answer (or its death) for our slot."""
        if not self.finished and self.worker is not None:
            self._finish(self.worker.outcome(slot))

    def expire(self) -> None:
        """The deadline passed: the worker is told to cancel; the caller gets ``timeout``."""
        if self.finished:
            return
        self._abandon()
        self._finish(self.prep.pool.timed_out(self.prep.tool, self.prep.timeout))

    def cancel(self, message: str = "") -> None:
        """``tools.cancel`` or a client that went away."""
        if self.finished:
            return
        self._abandon()
        self.prep.pool.stats.cancels += 1
        self._finish(None, message)

    def _abandon(self) -> None:
        if self.worker is not None and self.slot is not None:
            self.worker.abandon(self.slot)
            self.prep.pool.after_call(self.worker)

    def _finish(self, outcome: CallOutcome | None, message: str = "") -> None:
        self.finished = True
        if self.queue is not None:
            self.queue.live -= 1
        inv = self.invoker
        inv.host.quotas.release(self.ticket)
        if self.key is not None:
            inv.calls.pop(self.key, None)
        env = inv.conclude(self.prep, outcome, 1, message)
        inv.record(self.client, self.prep.tool, self.input_raw, env, self.approval)
        self.on_done(env)


class Invoker:
    """Runs tool calls for a host."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.calls: dict[Any, CallHandle | DirectCall] = {}
        self.deadlines = DeadlineQueue()
        self.approvals = Approvals()

    # the gate ------------------------------------------------------------------------------

    def prepare(
        self, tool: str, timeout_ms: int | None, approval: Approval | None
    ) -> Prepared | Envelope:
        """The refusal of a call that must not reach a worker, or where and how long it runs."""
        host = self.host
        t0 = trio.current_time()
        desc = host.catalog.get(tool)
        if desc is None:
            return results.unavailable(tool, "unknown-tool", f"no tool named {tool!r} is known")
        tp = host.catalog.tool_plan(tool)
        policy = tp.sandbox if tp is not None else desc.stability.sandbox
        # Operator approval (runtime/approvals.py): the kernel's own approval is not honoured;
        # the gate passes the call and the awaiting gear waits for an operator.
        operator = policy == "approval-required" and (
            host.registry.host.approval_source == "operator"
        )
        refusal = gate.refuse(
            desc,
            policy,
            OPERATOR_PENDING if operator else approval,
            lambda: host.quotas.retry_after(desc.sidecar, tool),
        )
        if refusal is not None:
            return refusal
        pool = host.pools.get(desc.sidecar or "")
        if pool is None:
            return results.unavailable(
                tool, "unavailable", f"{tool}: sidecar {desc.sidecar} is not running"
            )
        timeout = timeout_ms or desc.annotations.timeoutMs or pool.config.timeout_ms
        prep = Prepared(tool, desc, pool, timeout, tp.manifest if tp is not None else None, t0)
        prep.operator = operator
        return prep

    # the direct gear -----------------------------------------------------------------------

    def start(
        self,
        tool: str,
        input_raw: msgspec.Raw,
        *,
        timeout_ms: int | None,
        approval: Approval | None,
        on_progress: ProgressSink | None,
        call_key: Any,
        client: str,
        on_done: EnvelopeSink,
    ) -> bool:
        """Start a call without an awaiting task, if it can be; ``on_done`` gets its envelope.

        Returns:
            False when the call needs the awaiting gear (:meth:`run`): nothing was done.
        """
        prep = self.prepare(tool, timeout_ms, approval)
        if isinstance(prep, Envelope):
            self.record(client, tool, input_raw, prep, approval)
            on_done(prep)
            return True
        if prep.operator or (prep.manifest is not None and prep.manifest.retry is not None):
            return False
        worker = prep.pool.direct_worker()
        if worker is None:
            return False
        ticket = self.host.quotas.admit(prep.desc.sidecar, tool)
        if not isinstance(ticket, tuple):
            env = refusal_envelope(tool, prep.desc.sidecar, ticket)
            self.record(client, tool, input_raw, env, approval)
            on_done(env)
            return True
        call = DirectCall(self, prep, input_raw, approval, client, call_key, ticket, on_done)
        if call_key is not None:
            self.calls[call_key] = call
        call.worker = worker
        self.deadlines.add(call)
        call.slot = prep.pool.start_on(
            worker, tool, input_raw, prep.timeout, on_progress, call.answered, now=prep.t0
        )
        return True

    # the awaiting gear ---------------------------------------------------------------------

    async def run(
        self,
        prep: Prepared,
        input_raw: msgspec.Raw,
        *,
        on_progress: ProgressSink | None,
        call_key: Any,
    ) -> Envelope:
        """Run a prepared call to its envelope, awaiting a worker and retrying as configured."""
        host = self.host
        pool, tool, timeout = prep.pool, prep.tool, prep.timeout
        if prep.operator:
            decided = await await_operator(self, prep, input_raw, call_key)
            if isinstance(decided, Envelope):
                return decided
            prep.granted = decided
        ticket = host.quotas.admit(prep.desc.sidecar, tool)
        if not isinstance(ticket, tuple):
            return refusal_envelope(tool, prep.desc.sidecar, ticket)
        handle = CallHandle()
        if call_key is not None:
            self.calls[call_key] = handle
        attempts = 0
        outcome: CallOutcome | None = None
        try:
            while True:
                attempts += 1
                # One cancel scope per attempt carries both the deadline and tools.cancel.
                scope = handle.scope = trio.CancelScope(
                    deadline=trio.current_time() + timeout / 1000.0
                )
                if handle.cancelled:
                    break
                with scope:
                    outcome = await pool.call(
                        tool, input_raw, timeout_ms=timeout, on_progress=on_progress
                    )
                if scope.cancelled_caught:
                    if handle.cancelled:
                        outcome = None
                        break
                    outcome = pool.timed_out(tool, timeout)
                assert outcome is not None
                delay = retry.retry_delay_ms(
                    prep.manifest, None if outcome.ok else outcome.code, attempts
                )
                if delay is None:
                    break
                pool.stats.retries += 1
                with handle.waiting():
                    await trio.sleep(delay / 1000.0)
                if handle.cancelled:
                    outcome = None
                    break
        finally:
            host.quotas.release(ticket)
            if call_key is not None:
                self.calls.pop(call_key, None)
        if outcome is None:
            pool.stats.cancels += 1
        return self.conclude(prep, outcome, attempts)

    # the end of every call -----------------------------------------------------------------

    def conclude(
        self, prep: Prepared, outcome: CallOutcome | None, attempts: int, message: str = ""
    ) -> Envelope:
        """The envelope of a call that reached a pool (None: it was cancelled)."""
        pool, tool = prep.pool, prep.tool
        duration = round((trio.current_time() - prep.t0) * 1000.0, 3)
        if outcome is None:
            return results.failed(
                tool,
                "cancelled",
                message or f"{tool} was cancelled",
                sidecar=pool.sidecar,
                duration_ms=duration,
                attempts=attempts,
            )
        env = results.from_answer(
            tool,
            ok=outcome.ok,
            data=outcome.data,
            content=outcome.content,
            code=outcome.code,
            error=outcome.error,
            details=outcome.details,
            sidecar=pool.sidecar,
            pid=outcome.pid,
            duration_ms=duration,
            max_output_bytes=limits.output_limit(
                pool.config, tool, prep.desc.annotations.resultLimit
            ),
            cpu_ms=outcome.cpu_ms,
            exit_code=outcome.exit_code,
            stderr=outcome.stderr,
            attempts=attempts,
        )
        stats = pool.stats
        if env.status == "success":
            stats.success += 1
        elif env.status == "failed":
            stats.failed += 1
        return env

    def record(
        self,
        client: str,
        tool: str,
        input_raw: msgspec.Raw,
        env: Envelope,
        approval: Approval | None,
    ) -> None:
        """Audit and account one finished call."""
        host = self.host
        if host.audit is not None:
            host.audit.record(
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
            )
        host.safeguards.record(tool, input_raw, env)

    def cancel(self, call_key: Any, message: str = "") -> bool:
        call = self.calls.get(call_key)
        if call is None:
            return False
        if isinstance(call, DirectCall):
            call.cancel(message)
        else:
            call.cancel()
        return True
