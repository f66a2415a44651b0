"""Workers: one sidecar process (or, for oneshot protocols, one call site) behind one interface.

# Strategy: a :class:`Worker` is what a pool dispatches to. :class:`LineWorker` owns the life of
# one long-lived child speaking lines: spawn, stderr always drained into a ring, a writer task that
# batches lines, a reader task that feeds the subclass's sans-IO connection, exit awaited on a
# pidfd, and cleanup that is shielded and always reaps. A call is a slot (an id and an event) - no
# task per message. Calls that outlive their deadline or are cancelled are abandoned: the worker is
# told to cancel and (for protocols that answer a cancel) gets a short grace to answer, else it is
# killed and replaced. When the process dies every call still on it fails at once with the stderr
# tail. :class:`ProcessWorker` (``process_json_worker.py``) is persistent process-json on that
# base; MCP lives in ``mcp_worker.py``, the one-process-per-call protocols in ``spawn_worker.py``.
"""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec
import trio

from supervisor.calls.call import Call, ProgressSink
from supervisor.contracts import wire
from supervisor.processes.child import ChildProcess, StderrRing
from supervisor.processes.direct_write import DirectWriter, cork, grow_pipe, read_ready, uncork
from supervisor.processes.limits import cpu_limit_of
from supervisor.processes.spawn import spawn
from supervisor.protocols.errors import LineTooLong, ProtocolError
from supervisor.protocols.fractalic_yaml import Route
from supervisor.protocols.outcome import CallOutcome
from supervisor.protocols.outcome import describe_status as describe_exit

ExitReason = Literal[
    "stopped",
    "retired",
    "recycled",
    "crashed",
    "start-failed",
    "start-timeout",
    "protocol-error",
    "hung",
    "quota-exceeded",
]
__all__ = [
    "Call",
    "CallOutcome",
    "CallSlot",
    "LaunchSpec",
    "LineWorker",
    "ProgressSink",
    "Worker",
    "WorkerExit",
]
EXPECTED_EXITS = frozenset(("stopped", "retired", "recycled"))
WorkerState = Literal["starting", "ready", "draining", "stopping", "exited"]

READ_CHUNK = 1 << 16
STDERR_SETTLE_S = 0.2
EOF_EXIT_GRACE_S = 0.5


class WorkerExit(msgspec.Struct, frozen=True, kw_only=True):
    reason: ExitReason
    message: str
    exit_code: int | None = None
    uptime_ms: float = 0.0
    was_ready: bool = False
    stderr_tail: str = ""

    @property
    def expected(self) -> bool:
        return self.reason in EXPECTED_EXITS


class LaunchSpec(msgspec.Struct, kw_only=True):
    """Everything needed to start one worker of a sidecar."""

    sidecar: str
    argv: list[str]
    cwd: str
    env: dict[str, str]
    init: wire.Init | None = None
    start_timeout_s: float = 10.0
    probe_timeout_s: float = 1.0
    initial_probe: bool = True
    cancel_grace_s: float = 0.5
    stop_grace_s: float = 2.0
    max_line: int = 16 * 1024 * 1024
    limits: list[tuple[int, int, int]] = msgspec.field(default_factory=list)
    concurrency: int = 1
    """Calls in flight per worker where the protocol does not announce it (MCP, per-call)."""
    scripts: dict[str, list[str]] = msgspec.field(default_factory=dict)
    """simple-json: the argv of the script serving each tool."""
    routes: dict[str, Route] = msgspec.field(default_factory=dict)
    """simple-json folders: tools declared by ``*.yaml`` manifests (PROTOCOL 3.3)."""
    announces: bool = False
    """An autodiscovered folder: its scripts may publish tools the plan does not list
    (``--fractalic-dump-multi-schema``)."""
    spawn: Literal["auto", "exec"] = "exec"
    """``auto``: may be forked from the host's zygote (PROTOCOL 1 ``spawn``)."""
    problem: str | None = None
    """mcp-http: why the worker cannot start (a vault key its headers need is not set)."""


class ProcessView(msgspec.Struct, frozen=True):
    """One live process of a worker, as the accounting sampler sees it."""

    pid: int
    calls: tuple[tuple[Any, str], ...]
    """``(call key, tool)`` of every call running in it."""
    per_call: bool = False
    """The process exists for one call (its whole life is that call's)."""


class WorkerHooks(Protocol):
    """How a worker tells its pool what happened."""

    def on_ready(self, worker: Worker) -> None: ...

    def on_capacity(self, worker: Worker) -> None: ...

    def on_pong(self, worker: Worker, pong: wire.Pong | None) -> None: ...

    def on_tools(self, worker: Worker) -> None:
        """The worker's tool list changed after ready (``ready_msg.tools`` holds the new one)."""

    def on_request(
        self,
        worker: Worker,
        call: Call,
        request: wire.Request,
        reply: Callable[[wire.Response], None],
    ) -> None:
        """A host-service request made for ``call`` (PROTOCOL 3.5); answer through ``reply``."""


class CallSlot:
    """One attempt of a call in flight on a line worker: its protocol id and how it ended.

    An abandoned slot (deadline, cancel) no longer ends its call; the worker still waits for
    the peer to let go of it (``done``) before the slot is free.
    """

    __slots__ = ("_done", "abandoned", "call", "finished", "id")

    def __init__(self, call_id: int, call: Call) -> None:
        self.id = call_id
        self.call = call
        self.abandoned = False
        self.finished = False
        self._done: trio.Event | None = None

    def finish(self) -> None:
        self.finished = True
        if self._done is not None:
            self._done.set()

    async def wait(self) -> None:
        """Until the peer answered or the worker ended."""
        if self.finished:
            return
        if self._done is None:
            self._done = trio.Event()
        await self._done.wait()


class Worker(ABC):
    """The interface a pool dispatches to."""

    sidecar: str
    index: int
    pid: int | None = None
    state: WorkerState = "starting"
    concurrency: int = 1
    calls_issued: int = 0
    started_at: float = 0.0
    ready_at: float | None = None
    started_by: Literal["zygote", "exec"] = "exec"
    """``zygote`` or ``exec`` (PROTOCOL 6 ``startedBy``)."""
    last_active: float = 0.0
    ready_msg: wire.Ready | None = None
    stderr: StderrRing
    spec: LaunchSpec
    hooks: WorkerHooks

    if TYPE_CHECKING:

        @property
        def _alive(self) -> bool:
            """Running, and not told to end (the kinds with a handshake define it)."""

    @property
    @abstractmethod
    def inflight(self) -> int:
        """Calls running on this worker (abandoned ones included until they end)."""

    @property
    def load(self) -> int:
        return self.inflight

    @property
    def has_capacity(self) -> bool:
        return self.state == "ready" and self.load < self.concurrency

    _end: tuple[ExitReason, str] | None = None
    _idle: trio.Event

    async def _became_ready(self) -> None:
        """Run the initial probe (if asked) and tell the pool this worker is ready."""
        if self.spec.initial_probe:
            pong = await self.ping(self.spec.probe_timeout_s)
            self.hooks.on_pong(self, pong)
        if self._alive:
            self.state = "ready"
            self.ready_at = trio.current_time()
            self.hooks.on_ready(self)

    async def _drain(self, reason: ExitReason, drain_s: float, busy: bool) -> None:
        """The first half of a graceful stop: record why, take no new calls, and wait (at most
        ``drain_s``) for the running ones to end."""
        if self._end is None:
            self._end = (reason, f"worker {reason}")
        if self.state in ("ready", "starting", "draining"):
            self.state = "draining"
            if busy and drain_s > 0:
                self._idle = trio.Event()
                with trio.move_on_after(drain_s):
                    await self._idle.wait()

    @abstractmethod
    async def run(self) -> WorkerExit:
        """Start, serve until the end, clean up; returns why it ended. Never raises for
        worker faults."""

    @abstractmethod
    def start(self, call: Call) -> None:
        """Start ``call`` on a free slot now, without awaiting it; its end comes back through
        ``call.ended`` (possibly before this returns). Never raises for worker faults."""

    @abstractmethod
    def abandon(self, call: Call) -> None:
        """Stop working for ``call`` (deadline, cancel): its attempt will not end it."""

    @abstractmethod
    async def ping(self, timeout_s: float) -> wire.Pong | None:
        """Health probe; None when unanswered in time."""

    @abstractmethod
    def kill(self, reason: ExitReason, message: str) -> None:
        """Kill now; ``run`` returns with this reason."""

    @abstractmethod
    async def stop(self, reason: ExitReason = "stopped", *, drain_s: float = 0.0) -> None:
        """Graceful stop: drain, shutdown message, SIGTERM, SIGKILL; returns once exited."""

    def processes(self) -> list[ProcessView]:
        """The live processes of this worker and the calls in each (for the sampler)."""
        return []

    def sole_call(self) -> Call | None:
        """The one call running here, if exactly one is (JSON logs tag stderr lines with it)."""
        return None

    @abstractmethod
    def exceed(self, pid: int, message: str, details: dict[str, Any]) -> None:
        """A quota was exceeded in process ``pid``: kill it; what ran there fails
        ``quota-exceeded`` with ``details`` (the rule, the limit and the measured figure)."""


class LineWorker(Worker):
    """A long-lived child process speaking a line protocol on stdin/stdout.

    Subclasses supply the protocol: :meth:`_handshake` (until ready), :meth:`_receive` (stdout
    bytes in; may raise :class:`ProtocolError`), :meth:`_cancel_line` (what to send when a call
    is abandoned) and :meth:`_goodbye` (what to send before closing stdin on a graceful stop).
    ``ANSWERS_CANCEL`` says whether the peer answers a cancelled call (process-json does, so a
    worker that does not is killed after ``cancel_grace_s``; MCP servers need not, so the call is
    simply forgotten).
    """

    ANSWERS_CANCEL = True

    def __init__(self, spec: LaunchSpec, hooks: WorkerHooks, index: int = 0) -> None:
        self.spec = spec
        self.sidecar = spec.sidecar
        self.hooks = hooks
        self.index = index
        self.stderr = StderrRing()
        self.proc: ChildProcess | None = None
        self.slots: dict[int, CallSlot] = {}
        self._waiters: dict[Any, list[Any]] = {}
        self._out: DirectWriter | None = None
        self._early: list[bytes] = []
        self._nursery: trio.Nursery | None = None
        self._ready_or_dead = trio.Event()
        self._exited = trio.Event()
        self._stderr_eof = trio.Event()
        self._idle = trio.Event()
        self._end = None
        self._protocol_error: str | None = None
        self._line_too_long = False
        self._quota_details: dict[str, Any] | None = None

    @property
    def inflight(self) -> int:
        return len(self.slots)

    def processes(self) -> list[ProcessView]:
        if self.pid is None or not self._alive:
            return []
        calls = tuple((s.id, s.call.tool) for s in self.slots.values() if not s.abandoned)
        return [ProcessView(self.pid, calls)]

    def exceed(self, pid: int, message: str, details: dict[str, Any]) -> None:
        if self._end is None:
            self._quota_details = details
        self.kill("quota-exceeded", message)

    def sole_call(self) -> Call | None:
        if len(self.slots) != 1:
            return None
        slot = next(iter(self.slots.values()))
        return None if slot.abandoned else slot.call

    # protocol hooks ----------------------------------------------------------------------

    @abstractmethod
    async def _handshake(self) -> None:
        """Bring the peer to ready within ``start_timeout_s`` (kill it otherwise), then call
        :meth:`_became_ready`."""

    @abstractmethod
    def _receive(self, data: bytes) -> None:
        """Handle a chunk of stdout.

        Raises:
            ProtocolError: The peer broke the protocol (the worker is killed).
        """

    @abstractmethod
    def _cancel_line(self, slot: CallSlot) -> bytes | None:
        """The bytes telling the peer to stop working on ``slot`` (None: nothing to send)."""

    def _goodbye(self) -> bytes | None:
        """The bytes sent before stdin is closed on a graceful stop."""
        return None

    @abstractmethod
    def _outcome(self, result: Any) -> CallOutcome:
        """What the peer's answer to a call amounts to."""

    # lifecycle ---------------------------------------------------------------------------

    async def run(self) -> WorkerExit:
        self.started_at = self.last_active = trio.current_time()
        try:
            self.proc = spawn(
                self.spec.argv,
                cwd=self.spec.cwd,
                env=self.spec.env,
                limits=self.spec.limits,
                zygote=self.spec.spawn == "auto",
            )
        except OSError as exc:
            self.state = "exited"
            self._exited.set()
            argv0 = self.spec.argv[0] if self.spec.argv else "?"
            return WorkerExit(
                reason="start-failed",
                message=f"cannot execute {argv0}: {exc.strerror or exc}",
            )
        proc = self.proc
        self.pid = proc.pid
        self.started_by = proc.started_by
        rc: int | None = None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._drain_stderr)
                assert proc.stdin is not None and proc.stdout is not None
                grow_pipe(proc.stdin.fileno())
                grow_pipe(proc.stdout.fileno())
                self._out = DirectWriter(proc.stdin.fileno(), close=proc.stdin.aclose)
                for early in self._early:
                    self._out.write(early)
                self._early.clear()
                nursery.start_soon(self._out.run)
                nursery.start_soon(self._read_loop)
                nursery.start_soon(self._handshake)
                rc = await proc.wait()
                self._exited.set()
                with trio.move_on_after(STDERR_SETTLE_S):
                    await self._stderr_eof.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.kill()
                    rc = await proc.wait()
                self._exited.set()
                proc.forget()
                await proc.aclose_streams()
                self.state = "exited"
                result = self._exit_record(rc)
                self._fail_all(result)
        return result

    @property
    def _alive(self) -> bool:
        return self._end is None and not self._exited.is_set()

    def _exit_record(self, rc: int | None) -> WorkerExit:
        now = trio.current_time()
        uptime = (now - self.started_at) * 1000.0
        tail = self.stderr.tail()
        was_ready = self.ready_at is not None
        if self._end is not None:
            reason, message = self._end
        elif rc == -signal.SIGXCPU:
            cpu = cpu_limit_of(self.spec.limits)
            reason = "quota-exceeded"
            message = f"worker used up its CPU time (limits.cpuSeconds={cpu}): killed by SIGXCPU"
            self._quota_details = {"rule": "cpuSeconds", "limitSeconds": cpu}
        elif self._protocol_error is not None:
            reason, message = "protocol-error", self._protocol_error
        elif not was_ready:
            reason, message = "start-failed", f"exited before ready ({describe_exit(rc)})"
        else:
            reason, message = "crashed", f"worker exited ({describe_exit(rc)})"
        if reason in ("hung", "start-timeout") or (
            reason == "protocol-error" and self._end is None
        ):
            message = f"{message}; {describe_exit(rc)}" if rc is not None and rc >= 0 else message
        return WorkerExit(
            reason=reason,
            message=message,
            exit_code=rc,
            uptime_ms=uptime,
            was_ready=was_ready,
            stderr_tail=tail,
        )

    def _fail_all(self, ex: WorkerExit) -> None:
        slots, self.slots = self.slots, {}
        code = "protocol-error" if ex.reason == "protocol-error" else "worker-crashed"
        details = None
        if ex.reason == "quota-exceeded":
            code, details = "quota-exceeded", self._quota_details
        elif self._line_too_long and len(slots) == 1:
            # The over-long line can only be the answer of the one call in flight.
            code = "output-too-large"
            details = {"lineLimitBytes": self.spec.max_line}
        for slot in slots.values():
            if slot.finished:
                continue
            slot.finish()
            if slot.abandoned:
                continue
            slot.call.ended(
                CallOutcome(
                    ok=False,
                    code=code,
                    error=f"worker {self.pid} of {self.sidecar} ended while running "
                    f"{slot.call.tool}: {ex.message}",
                    details=details,
                    exit_code=ex.exit_code,
                    stderr=ex.stderr_tail[-4096:] or None,
                    pid=self.pid,
                )
            )
        for waiter in self._waiters.values():
            waiter[0].set()
        self._waiters.clear()
        self._idle.set()

    def kill(self, reason: ExitReason, message: str) -> None:
        if self._end is None:
            self._end = (reason, message)
        if self.state not in ("exited",):
            self.state = "stopping"
        self._ready_or_dead.set()
        if self.proc is not None:
            self.proc.kill()

    async def stop(self, reason: ExitReason = "stopped", *, drain_s: float = 0.0) -> None:
        await self._drain(reason, drain_s, bool(self.slots))
        self.state = "stopping"
        self._ready_or_dead.set()
        proc = self.proc
        if proc is None:
            return
        goodbye = self._goodbye()
        if goodbye:
            self._write(goodbye)
        self._write(None)
        grace = self.spec.stop_grace_s
        with trio.move_on_after(grace):
            await self._exited.wait()
        if not self._exited.is_set():
            proc.signal_group(signal.SIGTERM)
            with trio.move_on_after(grace):
                await self._exited.wait()
        if not self._exited.is_set():
            proc.kill()
            await self._exited.wait()

    # calls -------------------------------------------------------------------------------

    def _begin(self, call_id: int, call: Call, line: bytes) -> None:
        """Put ``call`` on a new slot and send its line."""
        slot = CallSlot(call_id, call)
        self.slots[call_id] = slot
        call.slot = slot
        self.calls_issued += 1
        self.last_active = trio.current_time()
        self._write(line)

    def _answer(self, call_id: int, result: Any) -> None:
        """Complete the call ``call_id`` with ``result`` (no-op for an unknown or dropped id)."""
        slot = self.slots.pop(call_id, None)
        if slot is None:
            return
        slot.finish()
        self.last_active = trio.current_time()
        if not self.slots:
            self._idle.set()
        if not slot.abandoned:
            slot.call.ended(self._outcome(result))
        self.hooks.on_capacity(self)

    def abandon(self, call: Call) -> None:
        slot = call.slot
        if isinstance(slot, CallSlot) and not slot.finished and not slot.abandoned:
            self._abandon(slot)

    def _abandon(self, slot: CallSlot) -> None:
        slot.abandoned = True
        if not self._alive:
            return
        line = self._cancel_line(slot)
        if line:
            self._write(line)
        if not self.ANSWERS_CANCEL:
            self.slots.pop(slot.id, None)
            slot.finish()
            if not self.slots:
                self._idle.set()
            self.hooks.on_capacity(self)
        elif self._nursery is not None:
            self._nursery.start_soon(self._grace_kill, slot)

    async def _grace_kill(self, slot: CallSlot) -> None:
        with trio.move_on_after(self.spec.cancel_grace_s):
            await slot.wait()
        if not slot.finished and not self._exited.is_set():
            ms = int(self.spec.cancel_grace_s * 1000)
            self.kill(
                "hung", f"call {slot.id} ({slot.call.tool}) did not stop within {ms} ms of cancel"
            )

    def _progress(self, call_id: int, data: msgspec.Raw) -> None:
        slot = self.slots.get(call_id)
        if slot is not None and not slot.abandoned:
            slot.call.progress(data)

    async def _wait_for(self, key: Any, line: bytes, timeout_s: float) -> Any:
        """Send ``line`` and wait up to ``timeout_s`` for :meth:`_resolve` of ``key``.

        Returns the resolved value, or None on timeout or when the worker ends.
        """
        waiter: list[Any] = [trio.Event(), None]
        self._waiters[key] = waiter
        self._write(line)
        try:
            with trio.move_on_after(timeout_s):
                await waiter[0].wait()
        finally:
            self._waiters.pop(key, None)
        return waiter[1]

    def _resolve(self, key: Any, value: Any) -> None:
        waiter = self._waiters.get(key)
        if waiter is not None:
            waiter[1] = value
            waiter[0].set()

    # IO tasks ----------------------------------------------------------------------------

    def _write(self, data: bytes | None) -> None:
        """Write ``data`` to the worker's stdin now (queued if the pipe is full); None closes it
        once everything before has been written."""
        out = self._out
        if out is None:
            if data is not None:
                self._early.append(data)
            return
        if data is None:
            out.close_when_drained()
        else:
            out.write(data)

    async def _read_loop(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()  # non-blocking (trio's FdStream set it so)
        receive = self._receive
        try:
            while True:
                data = await read_ready(fd, READ_CHUNK)
                if not data:
                    break
                cork()
                try:
                    receive(data)
                except ProtocolError as exc:
                    self._protocol_error = exc.message
                    self._line_too_long = isinstance(exc, LineTooLong)
                    self.kill("protocol-error", f"protocol error: {exc.message}")
                    return
                finally:
                    uncork()
        except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
            pass
        finally:
            self._ready_or_dead.set()
        # stdout closed: the worker is exiting, or is useless. Keep its real status if it exits.
        if self._end is None:
            with trio.move_on_after(EOF_EXIT_GRACE_S):
                await self._exited.wait()
            if not self._exited.is_set():
                self.kill("crashed", "worker closed its stdout")

    async def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        stream = self.proc.stderr
        ring = self.stderr
        try:
            while True:
                data = await stream.receive_some(READ_CHUNK)
                if not data:
                    break
                ring.write(data)
        except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
            pass
        finally:
            self._stderr_eof.set()
