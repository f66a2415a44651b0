"""One call, one path: the :class:`Call` state machine and the per-pool :class:`Dispatch` queue.

# Strategy: every tool call that passed the gate, of every worker kind, is one :class:`Call`
# moving through one state machine::
#
#     queued -> running -> (backoff -> queued)* -> done
#
# :class:`Dispatch` (one per pool) holds a deque of queued Calls and hands the next one to a
# worker the moment a slot frees, synchronously, on the tick that freed it; a queued call is an
# entry in that deque, not a task. Deadlines and retry backoff are entries in the host's one
# :class:`~supervisor.calls.timers.Timers` heap. Cancellation, deadline, a worker's answer or
# death, retry, refusal and shutdown are transitions of the machine, and :meth:`Call._finish` is
# the only place a call ends: it releases the quota, hands the envelope to the engine's
# ``record`` (accounting and audit) and to the caller's ``on_done``, exactly once. What the
# caller asked (tool, input, deadline override, approval, who, session, cancel key) arrives as
# one :class:`InvokeRequest`, built once by the server (or a worker's ``tools.invoke``) and
# handed whole to the invoker and from it to the Call.
#
# Nothing here imports trio or reads a clock: the engine is given ``clock`` and the timers, the
# workers are anything with ``start(call)`` / ``abandon(call)``, so tests/unit drives every
# transition with a fake worker on a fake clock.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal, Protocol

import msgspec

from supervisor.calls.timers import Timer, Timers
from supervisor.contracts import wire
from supervisor.contracts.envelope import Envelope
from supervisor.contracts.manifest import ToolManifest
from supervisor.contracts.rpc import Approval
from supervisor.policy import results, retry
from supervisor.processes.direct_write import after_flush
from supervisor.protocols.outcome import CallOutcome

log = logging.getLogger("toolhost.calls")

CallState = Literal["queued", "running", "backoff", "done"]
ProgressSink = Callable[[msgspec.Raw], None]
EnvelopeSink = Callable[[Envelope], None]


class CallWorker(Protocol):
    """What :class:`Dispatch` needs of a worker: every kind offers exactly this."""

    @property
    def state(self) -> str: ...

    @property
    def concurrency(self) -> int: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def inflight(self) -> int: ...

    def start(self, call: Call) -> None:
        """Start ``call`` on a free slot now; its end comes back through :meth:`Call.ended`
        (possibly before this returns). Never raises for worker faults."""

    def abandon(self, call: Call) -> None:
        """Stop caring about ``call``'s attempt (deadline, cancel): it will not end the call."""


class CallEvents(Protocol):
    """Who hears of every call's start and end (the operator event bus, while it has
    ``calls`` subscribers; see ``telemetry/events.py``)."""

    def call_started(self, call: Call) -> None: ...

    def call_ended(self, call: Call, env: Envelope) -> None: ...


Redact = Callable[[Envelope], Envelope]


class CallEngine:
    """The narrow parts every call needs at its start and at its one finish.

    Args:
        clock: Seconds on the timers' clock.
        timers: The host's timer heap (deadlines, backoff).
        release: Gives back a call's quota ticket.
        record: Accounting and audit of a finished call (called once per call).
        redact: Masks secrets in an envelope; applied only after :meth:`mask_secrets`.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        timers: Timers,
        *,
        release: Callable[[tuple[str, ...]], None],
        record: Callable[[Call, Envelope], None],
        redact: Redact | None = None,
    ) -> None:
        self.clock = clock
        self.timers = timers
        self.release = release
        self.record = record
        self.calls: dict[Any, Call] = {}
        """Calls with a key (``tools.cancel`` finds them here)."""
        self.backoff: set[Call] = set()
        """Calls waiting to be tried again (the only calls no pool holds)."""
        self.seq = 0
        self.masker = redact
        self.redact: Redact | None = None
        """:attr:`masker` once a secret was handed to a sidecar (None costs nothing)."""
        self.events: CallEvents | None = None
        """Set only while someone subscribes to ``calls`` events (None costs nothing)."""
        self.live: set[Call] = set()
        """Calls begun and not yet finished (the host's shutdown drain waits for them)."""
        self.on_idle: Callable[[], None] | None = None
        """Called when the last live call finishes (set only while someone waits for that)."""

    def mask_secrets(self) -> None:
        """A secret was handed to a sidecar: from now on every envelope passes ``redact``."""
        self.redact = self.masker

    def watch(self, events: CallEvents | None) -> None:
        """Hook ``events`` into every call's start and end (None: unhook; the operator event
        bus does this while it has ``calls`` subscribers)."""
        self.events = events

    def begin(self, call: Call) -> None:
        """Start the machine: arm the deadline and give the call to its pool."""
        if call.key is not None:
            self.calls[call.key] = call
        self.live.add(call)
        if self.events is not None:
            self.events.call_started(call)
        call._timer = self.timers.at(call.deadline, call.expire)
        call.dispatch.submit(call)

    def cancel(self, key: Any, message: str = "") -> bool:
        """``tools.cancel`` (or a client that went away) of the call registered under ``key``."""
        call = self.calls.get(key)
        if call is None:
            return False
        call.cancel(message)
        return True

    def shutdown(self, message: str) -> None:
        """The host stops: calls waiting for a retry end now (pools refuse their queues)."""
        for call in list(self.backoff):
            call.refuse_outcome("shutting-down", message)

    def cut(self, message: str) -> int:
        """Cancel every live call with ``message`` (the shutdown grace ran out); how many."""
        calls = list(self.live)
        for call in calls:
            call.cancel(message)
        return len(calls)


class InvokeRequest(msgspec.Struct):
    """What a caller asks of one tool call: built once (by the server, a worker's
    ``tools.invoke``, an in-process caller) and handed whole to the invoker and the Call."""

    tool: str
    input: msgspec.Raw = wire.EMPTY_OBJECT
    """The input object as raw JSON (copied to the sidecar, never decoded)."""
    timeout_ms: int | None = None
    """Deadline override (else the manifest's, else the sidecar's)."""
    approval: Approval | None = None
    """The kernel's approval for approval-required tools."""
    client: str = ""
    """Who asked (for the audit log)."""
    session: str | None = None
    """The kernel's session: the scope of ``session`` state (PROTOCOL 3.5)."""
    key: Any = None
    """Key under which ``Invoker.cancel`` finds the call (None: it cannot be cancelled)."""
    trace: Any = None
    """The OpenTelemetry context the call's span joins (the kernel request's span)."""
    parent: Call | None = None
    """The call whose worker asked for this one (``tools.invoke``, PROTOCOL 3.5)."""


class Call:
    """One tool call that passed the gate, from acceptance to its one envelope."""

    __slots__ = (
        "_backoff",
        "_timer",
        "approval",
        "attempts",
        "child_names",
        "children",
        "client",
        "deadline",
        "dispatch",
        "engine",
        "id",
        "input_raw",
        "key",
        "last",
        "manifest",
        "max_output",
        "on_done",
        "on_progress",
        "outstanding",
        "parent",
        "pid",
        "requests",
        "session",
        "sidecar",
        "slot",
        "state",
        "t0",
        "ticket",
        "timeout_ms",
        "tool",
        "trace",
        "worker",
    )

    def __init__(
        self,
        engine: CallEngine,
        dispatch: Dispatch,
        request: InvokeRequest,
        on_done: EnvelopeSink,
        on_progress: ProgressSink | None = None,
        *,
        t0: float,
        timeout_ms: int,
        manifest: ToolManifest | None,
        max_output: int,
        ticket: tuple[str, ...],
    ) -> None:
        engine.seq += 1
        self.id = engine.seq
        """Host-unique (audit lines name a parent as ``<tool>#<id>``)."""
        self.engine = engine
        self.dispatch = dispatch
        self.sidecar = dispatch.sidecar
        self.tool = request.tool
        self.input_raw = request.input
        self.t0 = t0
        self.timeout_ms = timeout_ms
        self.deadline = t0 + timeout_ms / 1000.0
        self.manifest = manifest
        self.max_output = max_output
        self.ticket = ticket
        self.on_done = on_done
        self.on_progress = on_progress
        self.approval = request.approval
        self.client = request.client
        self.key = request.key
        self.state: CallState = "queued"
        self.attempts = 0
        self.worker: CallWorker | None = None
        self.slot: Any = None
        """The current attempt's slot on :attr:`worker` (the worker's own record)."""
        self.pid: int | None = None
        self.last: CallOutcome | None = None
        self._timer: Timer | None = None
        self._backoff: Timer | None = None
        self.parent = request.parent
        self.session = request.session
        self.children: list[Call] | None = None
        """Child calls this call's worker made through ``tools.invoke`` (PROTOCOL 3.5)."""
        self.child_names: list[str] | None = None
        """``<tool>#<id>`` of every child, refused ones included (for the audit line)."""
        self.requests = 0
        """Host-service requests its worker made for it."""
        self.outstanding = 0
        """Of those, not answered yet."""
        self.trace: Any = None
        """The call's span (``supervisor.telemetry.tracing.CallTrace``) when tracing is on."""

    def __repr__(self) -> str:
        return f"<Call {self.tool} {self.state} attempts={self.attempts}>"

    def remaining_ms(self, now: float) -> int:
        """Milliseconds left before the deadline (at least 1: the worker's own deadline)."""
        return max(1, int((self.deadline - now) * 1000.0))

    # transitions: the worker's side -----------------------------------------------------

    def ended(self, outcome: CallOutcome) -> None:
        """The current attempt ended (answer, or the worker died). Retry or finish."""
        if self.state != "running":
            return
        self.worker = self.slot = None
        trace = self.trace
        if trace is not None:
            trace.attempt_ended(outcome)
        if outcome.pid is not None:
            self.pid = outcome.pid
        delay = retry.retry_delay_ms(
            self.manifest, None if outcome.ok else outcome.code, self.attempts
        )
        engine = self.engine
        if delay is None or engine.clock() + delay / 1000.0 >= self.deadline:
            self._finish(outcome)
            return
        self.state = "backoff"
        if trace is not None:
            trace.retry(outcome.code, delay)
        self.last = outcome
        engine.backoff.add(self)
        self._backoff = engine.timers.at(engine.clock() + delay / 1000.0, self._retry)

    def _retry(self) -> None:
        if self.state != "backoff":
            return
        self._backoff = None
        self.engine.backoff.discard(self)
        self.dispatch.submit(self, retry=True)

    def progress(self, data: msgspec.Raw) -> None:
        """Progress of the current attempt (the worker checked it is current)."""
        if self.state != "running":
            return
        if self.trace is not None:
            self.trace.progress()
        sink = self.on_progress
        if sink is not None:
            why = results.unreadable(data)
            if why is not None:  # one such event would end the connection it is sent on
                text = f"{self.tool} sent progress its clients cannot read ({why}); withheld"
                data = msgspec.Raw(msgspec.json.encode({"error": text}))
            try:
                sink(data)
            except Exception:  # the task ending here is a worker's reader: it must go on
                log.exception("delivering progress of %s#%s failed", self.tool, self.id)

    # transitions: the caller's and the clock's side -------------------------------------

    def expire(self) -> None:
        """The deadline passed, wherever the call is."""
        state = self.state
        if state == "done":
            return
        self._timer = None
        tool, ms = self.tool, self.timeout_ms
        if state == "queued":
            self.dispatch.withdraw(self)
            message = f"{tool}: no worker of {self.sidecar} was free within {ms} ms"
        elif state == "backoff":
            last = self.last
            why = f" (attempt {self.attempts} failed: {last.code})" if last is not None else ""
            message = f"{tool} did not succeed within {ms} ms{why}"
        else:
            self._abandon()
            message = f"{tool} did not answer within {ms} ms"
        self._finish(CallOutcome(ok=False, code="timeout", error=message, pid=self.pid))

    def cancel(self, message: str = "") -> None:
        """``tools.cancel``, a client that went away, or a parent that ended."""
        state = self.state
        if state == "done":
            return
        if self.trace is not None:
            self.trace.cancelled(message)
        if state == "queued":
            self.dispatch.withdraw(self)
        elif state == "running":
            self._abandon()
        self._finish(None, message)

    def refuse(self, outcome: CallOutcome) -> None:
        """The pool will not take the call (overloaded, failed sidecar, shutting down)."""
        self._finish(outcome)

    def refuse_outcome(self, code: str, message: str) -> None:
        self.refuse(CallOutcome(ok=False, code=code, error=message))

    def _abandon(self) -> None:
        worker = self.worker
        if worker is not None:
            self.worker = None
            worker.abandon(self)
        self.slot = None

    # the one end ----------------------------------------------------------------------------

    def _finish(self, outcome: CallOutcome | None, message: str = "") -> None:
        if self.state == "done":
            return
        was = self.state
        self.state = "done"
        engine = self.engine
        engine.timers.cancel(self._timer)
        self._timer = None
        if was == "backoff":
            engine.timers.cancel(self._backoff)
            self._backoff = None
            engine.backoff.discard(self)
        engine.release(self.ticket)
        if self.key is not None:
            engine.calls.pop(self.key, None)
        live = engine.live
        live.discard(self)
        if not live and engine.on_idle is not None:
            engine.on_idle()
        children = self.children
        if children:
            for child in children:
                if child.state != "done":
                    child.cancel(f"its parent {self.tool}#{self.id} ended")
        env = self._envelope(outcome, message, engine.clock())
        if engine.redact is not None:
            env = engine.redact(env)
        if engine.events is not None:
            engine.events.call_ended(self, env)
        # The audit record and accounting run once the answer is written (in the same tick when
        # the answer was corked, at once otherwise): off the path from the worker to the client.
        after_flush(partial(engine.record, self, env))
        try:
            self.on_done(env)
        except Exception:  # whichever task ended the call (a worker's reader) must go on
            log.exception("delivering the answer of %s#%s failed", self.tool, self.id)

    def _envelope(self, outcome: CallOutcome | None, message: str, now: float) -> Envelope:
        tool = self.tool
        duration = round((now - self.t0) * 1000.0, 3)
        attempts = self.attempts
        if outcome is None:
            return results.failed(
                tool,
                "cancelled",
                message or f"{tool} was cancelled",
                sidecar=self.sidecar,
                pid=self.pid,
                duration_ms=duration,
                attempts=attempts,
            )
        if not outcome.ok and attempts == 0 and outcome.code in REFUSALS:
            return results.unavailable(
                tool,
                outcome.code or "unavailable",
                outcome.error or "",
                details=outcome.details,
                sidecar=self.sidecar,
                duration_ms=duration,
            )
        return results.from_answer(
            tool,
            ok=outcome.ok,
            data=outcome.data,
            content=outcome.content,
            code=outcome.code,
            error=outcome.error,
            details=outcome.details,
            sidecar=self.sidecar,
            pid=outcome.pid,
            duration_ms=duration,
            max_output_bytes=self.max_output,
            cpu_ms=outcome.cpu_ms,
            exit_code=outcome.exit_code,
            stderr=outcome.stderr,
            attempts=attempts,
        )


REFUSALS = frozenset(("overloaded", "unavailable", "shutting-down"))
"""Pool refusals of a call no worker ever ran: ``unavailable`` envelopes with no attempt."""


class Dispatch:
    """The queue of one pool and the hand-off of its calls to workers.

    Args:
        sidecar: The sidecar id (for messages).
        queue_limit: ``pool.queue``: calls that may wait (retries are not counted against it).
        workers: The pool's live workers (the same list the pool keeps).
        refusal: The pool's verdict now: an outcome refusing every call, or None.
        on_queued: Called when a call had to wait (the pool may scale up).
    """

    def __init__(
        self,
        sidecar: str,
        queue_limit: int,
        workers: Sequence[CallWorker],
        *,
        refusal: Callable[[], CallOutcome | None],
        on_queued: Callable[[], None],
    ) -> None:
        self.sidecar = sidecar
        self.queue_limit = queue_limit
        self.workers = workers
        self.refusal = refusal
        self.on_queued = on_queued
        self.queue: deque[Call] = deque()
        self.queued = 0
        """Live calls in :attr:`queue` (withdrawn ones are dropped lazily)."""
        self.starts = 0
        """Attempts handed to a worker."""

    def pick(self) -> CallWorker | None:
        """The least-loaded ready worker with a free slot."""
        best: CallWorker | None = None
        best_load = 1 << 30
        for w in self.workers:
            if w.state == "ready":
                load = w.inflight
                if load < w.concurrency and load < best_load:
                    best, best_load = w, load
        return best

    def submit(self, call: Call, *, retry: bool = False) -> None:
        """Run ``call`` now if a worker has room and nobody waits, else queue or refuse it."""
        refusal = self.refusal()
        if refusal is not None:
            call.refuse(refusal)
            return
        if not self.queued:
            worker = self.pick()
            if worker is not None:
                self._start(worker, call)
                return
        if not retry and self.queued >= self.queue_limit:
            call.refuse(
                CallOutcome(
                    ok=False,
                    code="overloaded",
                    error=f"{self.sidecar}: all workers busy and {self.queued} calls queued "
                    f"(pool.queue={self.queue_limit})",
                )
            )
            return
        call.state = "queued"
        if call.trace is not None:
            call.trace.queued(self.queued)
        if retry:
            self.queue.appendleft(call)
        else:
            self.queue.append(call)
        self.queued += 1
        self.on_queued()

    def pump(self) -> None:
        """Hand queued calls to workers with room (a slot freed, a worker became ready)."""
        queue = self.queue
        while self.queued:
            worker = self.pick()
            if worker is None:
                return
            call = queue.popleft()
            if call.state != "queued":
                continue
            self.queued -= 1
            self._start(worker, call)

    def withdraw(self, call: Call) -> None:
        """A queued call leaves the queue (deadline, cancel); its entry is dropped lazily."""
        self.queued -= 1  # the caller finishes the call at once: pump skips the stale entry
        queue = self.queue
        if len(queue) > 2 * self.queued + 64:
            live = [c for c in queue if c.state == "queued" and c is not call]
            queue.clear()
            queue.extend(live)

    def refuse_all(self, outcome: CallOutcome) -> None:
        """Every queued call is refused with ``outcome`` (the sidecar failed or stops)."""
        queue, self.queue = self.queue, deque()
        self.queued = 0
        for call in queue:
            if call.state == "queued":
                call.refuse(outcome)

    def _start(self, worker: CallWorker, call: Call) -> None:
        call.state = "running"
        call.attempts += 1
        call.worker = worker
        call.pid = worker.pid
        self.starts += 1
        if call.trace is not None:
            call.trace.sent(call.pid, call.attempts, call.engine.clock())
        worker.start(call)
