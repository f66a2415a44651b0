"""A worker that is one long-lived child process speaking a line protocol on stdin/stdout.

# Strategy: :class:`LineWorker` owns the life of the process: spawn, stderr always drained into a
# ring, writes through a :class:`~supervisor.processes.direct_write.DirectWriter` (non-blocking,
# gathered per read chunk), a reader task that hands stdout to the protocol (the subclass's
# sans-IO connection), exit awaited on a pidfd, and cleanup that is shielded and always reaps.
# Calls are slots of the worker's :class:`~supervisor.workers.slots.SlotTable`: a call's line is
# written the moment it starts, its answer ends it from the reader task. Calls that outlive
# their deadline or are cancelled are abandoned: the peer is told to cancel and (for protocols
# that answer a cancel) gets a short grace to answer, else it is killed and replaced. When the
# process dies every call still on it fails at once with the stderr tail. Persistent
# process-json (``process_json.py``) and MCP over stdio (``mcp.py``) are the two line protocols.
"""

from __future__ import annotations

import signal
from abc import abstractmethod
from typing import Any

import trio

from supervisor.calls.call import Call
from supervisor.contracts.confine import ConfinementFacts
from supervisor.processes.child import Child
from supervisor.processes.direct_write import (
    DirectWriter,
    cork,
    grow_pipe,
    one_message,
    read_ready,
    uncork,
)
from supervisor.processes.limits import cpu_limit_of
from supervisor.protocols.errors import LineTooLong, ProtocolError
from supervisor.protocols.outcome import CallOutcome
from supervisor.protocols.outcome import describe_status as describe_exit
from supervisor.workers.base import (
    BIG_READ,
    READ_CHUNK,
    STDERR_SETTLE_S,
    STDERR_TAIL,
    ExitReason,
    LaunchSpec,
    ProcessView,
    Worker,
    WorkerExit,
    WorkerHooks,
)
from supervisor.workers.slots import CallSlot

EOF_EXIT_GRACE_S = 0.5


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
        super().__init__(spec, hooks, index)
        self.proc: Child | None = None
        self._out: DirectWriter | None = None
        self._early: list[bytes] = []
        self._nursery: trio.Nursery | None = None
        self._ready_or_dead = trio.Event()
        self._exited = trio.Event()
        self._stderr_eof = trio.Event()
        self._protocol_error: str | None = None
        self._line_too_long = False
        self._quota_details: dict[str, Any] | None = None

    @property
    def alive(self) -> bool:
        return self._end is None and not self._exited.is_set()

    def confinement(self) -> ConfinementFacts | None:
        proc = self.proc
        if proc is None or proc.confinement is None or proc.returncode is not None:
            return None
        return proc.confinement.facts(proc.pid)

    def processes(self) -> list[ProcessView]:
        if self.pid is None or not self.alive:
            return []
        calls = tuple((s.id, s.call.tool) for s in self.calls.live())
        return [ProcessView(self.pid, calls)]

    def exceed(self, pid: int, message: str, details: dict[str, Any]) -> None:
        if self._end is None:
            self._quota_details = details
        self.kill("quota-exceeded", message)

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

    # lifecycle ---------------------------------------------------------------------------

    async def run(self) -> WorkerExit:
        self.started_at = self.calls.last_active = trio.current_time()
        try:
            self.proc = self.spec.spawner.spawn(
                self.spec.argv,
                cwd=self.spec.cwd,
                env=self.spec.env,
                limits=self.spec.limits,
                may_fork=self.spec.spawn == "auto",
                confine=self.spec.confine,
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
                self._fail_calls(result)
        return result

    def _exit_record(self, rc: int | None) -> WorkerExit:
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
        return self._exit(reason, message, rc)

    def _fail_calls(self, ex: WorkerExit) -> None:
        """The process is gone: every call still on it fails with why, and the stderr tail."""
        code = "protocol-error" if ex.reason == "protocol-error" else "worker-crashed"
        details = None
        if ex.reason == "quota-exceeded":
            code, details = "quota-exceeded", self._quota_details
        elif self._line_too_long and len(self.calls.slots) == 1:
            # The over-long line can only be the answer of the one call in flight.
            code = "output-too-large"
            details = {"lineLimitBytes": self.spec.max_line}
        pid, sidecar = self.pid, self.sidecar
        stderr = ex.stderr_tail[-STDERR_TAIL:] or None

        def outcome(call: Call) -> CallOutcome:
            return CallOutcome(
                ok=False,
                code=code,
                error=f"worker {pid} of {sidecar} ended while running {call.tool}: {ex.message}",
                details=details,
                exit_code=ex.exit_code,
                stderr=stderr,
                pid=pid,
            )

        self.calls.fail_all(outcome)

    def kill(self, reason: ExitReason, message: str) -> None:
        if self._end is None:
            self._end = (reason, message)
        if self.state not in ("exited",):
            self.state = "stopping"
        self._ready_or_dead.set()
        if self.proc is not None:
            self.proc.kill()

    async def stop(self, reason: ExitReason = "stopped", *, drain_s: float = 0.0) -> None:
        await self._drain(reason, drain_s)
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

    def abandon(self, call: Call) -> None:
        slot = self.calls.abandon(call)
        if slot is None or not self.alive:
            return
        line = self._cancel_line(slot)
        if line:
            self._write(line)
        if not self.ANSWERS_CANCEL:
            self.calls.release(slot)
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
        size = READ_CHUNK
        try:
            while True:
                data = await read_ready(fd, size)
                if not data:
                    break
                # A full read means a large answer is streaming (the pipe holds up to 1 MiB):
                # read it in bigger pieces, one wake-up each, then go back to small reads.
                size = BIG_READ if len(data) == size else READ_CHUNK
                cork()
                if len(data) <= READ_CHUNK and data.find(b"\n") == len(data) - 1:
                    one_message()  # one whole line: its answer goes out at once
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
