"""Per-call workers: a call site that runs one process per call (oneshot, simple-json, CLI tools).

# Strategy: these protocols have no long-lived process, so their worker is a *call site*: a
# virtual worker that is ready at once (simple-json: once its scripts passed or failed the
# discovery probe) and runs one process per call in a task of its own nursery, through
# ``Spawner.spawn`` (own session, death with the host, allow-listed environment). Each call is
# a slot of the worker's :class:`~supervisor.workers.slots.SlotTable` with a cancel scope beside it
# (deadline, ``tools.cancel`` and host stop cancel it); the pool bounds how many run at once
# through the worker's ``concurrency`` (the sidecar's ``pool.max``). A kind says only what a call
# runs and which parser reads its output (:class:`Invocation`); the rest is written once here:
# run the process (:meth:`PerCallWorker.run_process`: stderr drained into a per-call ring and the
# worker's shared one, stdout read up to the output cap, the process group killed and reaped,
# shielded, on every exit path), then the tail every kind shares: the program could not run ->
# the quota killed it -> its output was too large -> the parser's outcome, with the pid, and the
# exit status and stderr tail of a failure. A traced call's ``TRACEPARENT`` is handed to its
# process explicitly. What the output means is decided by the sans-IO parsers in
# ``supervisor.protocols``.
"""

from __future__ import annotations

import errno
import signal
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import trio

from supervisor.calls.call import Call
from supervisor.contracts import wire
from supervisor.contracts.confine import ConfinementFacts
from supervisor.processes.child import Child, StderrRing
from supervisor.processes.limits import cpu_limit_of
from supervisor.protocols import oneshot
from supervisor.protocols.errors import LineTooLong
from supervisor.protocols.outcome import CallOutcome
from supervisor.workers.base import (
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

ANSWERED_EXIT_GRACE_S = 0.5
"""How long a oneshot process may take to exit after its answer line before its group is killed."""

Parser = Callable[[str, bytes, int | None], CallOutcome]
"""Reads a call's output: ``(tool, stdout, exit status) -> outcome``."""


class Invocation(NamedTuple):
    """What one call runs, and how its output is read."""

    argv: list[str]
    stdin: bytes | None
    """Written to the process's stdin, which is then closed (None: no stdin)."""
    first_line: bool
    """The answer is the first stdout line (oneshot), not the whole of stdout."""
    parse: Parser


class ProcessRun(msgspec.Struct, kw_only=True):
    """What one short-lived process did."""

    pid: int
    output: bytes
    """The first stdout line (oneshot) or all of stdout (simple-json); empty: nothing."""
    exit_code: int | None
    stderr: str
    too_large: bool = False
    exceeded: dict[str, Any] | None = None
    """Set when the accounting sampler killed the process for a quota (rule, limit, measured)."""


class SpawnFailed(Exception):
    """The program could not be executed."""

    def __init__(self, argv0: str, exc: OSError) -> None:
        super().__init__(f"cannot execute {argv0}: {exc.strerror or exc}")
        self.errno = exc.errno


class _LiveCall:
    """A per-call process the sampler may look at."""

    __slots__ = ("exceeded", "message", "proc", "tool")

    def __init__(self, tool: str, proc: Child) -> None:
        self.tool = tool
        self.proc = proc
        self.exceeded: dict[str, Any] | None = None
        self.message = ""


def trace_env(call: Call) -> dict[str, str] | None:
    """``TRACEPARENT`` (and ``TRACESTATE``) for the process of a traced call."""
    ct = call.trace
    if ct is None:
        return None
    env = {"TRACEPARENT": ct.traceparent}
    if ct.tracestate:
        env["TRACESTATE"] = ct.tracestate
    return env


class PerCallWorker(Worker):
    """A call site that runs one process per call; kinds say what each call runs."""

    def __init__(self, spec: LaunchSpec, hooks: WorkerHooks, index: int = 0) -> None:
        super().__init__(spec, hooks, index)
        self.concurrency = max(1, spec.concurrency)
        self._scopes: dict[int, trio.CancelScope] = {}
        """The cancel scope of each call's run, by slot id."""
        self._seq = 0
        self._nursery: trio.Nursery | None = None
        self._ended = trio.Event()
        self._live: dict[int, _LiveCall] = {}
        self._confinement: ConfinementFacts | None = None

    @property
    def alive(self) -> bool:
        return self._end is None

    def confinement(self) -> ConfinementFacts | None:
        """The walls of the last call process that reported them (read from it while it ran),
        else of one running now (PROTOCOL 7)."""
        if self._confinement is not None:
            return self._confinement
        for live in list(self._live.values()):
            prepared = live.proc.confinement
            if prepared is not None and live.proc.returncode is None:
                return prepared.facts(live.proc.pid)
        return None

    def _read_confinement(self, proc: Child) -> None:
        """Keep the walls of ``proc`` (its output ended: it ran, so its report came; the
        process is alive or not yet reaped, so ``/proc`` still answers)."""
        prepared = proc.confinement
        if prepared is not None and proc.returncode is None and prepared.report() is not None:
            self._confinement = prepared.facts(proc.pid)

    def processes(self) -> list[ProcessView]:
        return [
            ProcessView(pid, ((pid, live.tool),), per_call=True) for pid, live in self._live.items()
        ]

    def exceed(self, pid: int, message: str, details: dict[str, Any]) -> None:
        live = self._live.get(pid)
        if live is not None and live.exceeded is None:
            live.exceeded, live.message = details, message
            live.proc.kill()

    # what a kind supplies ----------------------------------------------------------------

    async def _startup(self) -> None:
        """Work before the call site is ready (simple-json probes its scripts)."""

    @abstractmethod
    def _invocation(self, tool: str, input_raw: msgspec.Raw) -> Invocation | CallOutcome:
        """What a call of ``tool`` runs, or the outcome of a call that cannot run at all."""

    # lifecycle ---------------------------------------------------------------------------

    async def run(self) -> WorkerExit:
        self.started_at = self.calls.last_active = trio.current_time()
        # The nursery outlives _ended until every call's run has ended (kill cancels them all),
        # so each call is answered exactly once.
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._startup()
            if self._end is None:
                self.state = "ready"
                self.ready_at = trio.current_time()
                self.hooks.on_ready(self)
                await self._ended.wait()
        self.state = "exited"
        reason, message = self._end or ("stopped", "worker stopped")
        return self._exit(reason, message)

    def _finish(self, reason: ExitReason, message: str) -> None:
        if self._end is None:
            self._end = (reason, message)
        if self.state != "exited":
            self.state = "stopping"
        self._ended.set()

    def kill(self, reason: ExitReason, message: str) -> None:
        self._finish(reason, message)
        for scope in list(self._scopes.values()):
            scope.cancel()

    async def stop(self, reason: ExitReason = "stopped", *, drain_s: float = 0.0) -> None:
        await self._drain(reason, drain_s)
        self.kill(reason, f"worker {reason}")

    async def ping(self, timeout_s: float) -> wire.Pong | None:
        return None if self._end is not None else wire.Pong(id="spawn", status="healthy")

    # calls -------------------------------------------------------------------------------

    def start(self, call: Call) -> None:
        nursery = self._nursery
        if self._end is not None or nursery is None:
            why = self._end[1] if self._end else "not started"
            call.ended(CallOutcome(ok=False, code="worker-crashed", error=f"{self.sidecar}: {why}"))
            return
        self._seq += 1
        slot = self.calls.add(self._seq, call)
        scope = self._scopes[slot.id] = trio.CancelScope()
        nursery.start_soon(self._run_call, slot, scope)

    def abandon(self, call: Call) -> None:
        slot = self.calls.abandon(call)
        if slot is not None:
            self._scopes[slot.id].cancel()

    async def _run_call(self, slot: CallSlot, scope: trio.CancelScope) -> None:
        call = slot.call
        outcome: CallOutcome | None = None
        try:
            with scope:
                outcome = await self._attempt(call)
        finally:
            del self._scopes[slot.id]
            if outcome is None:
                message = self._end[1] if self._end else "worker ended"
                outcome = CallOutcome(
                    ok=False,
                    code="worker-crashed",
                    error=f"{self.sidecar} ended while running {call.tool}: {message}",
                )
            self.calls.answer(slot.id, outcome)

    async def _attempt(self, call: Call) -> CallOutcome:
        """Run one call's process and read what it did (the tail every kind shares)."""
        tool = call.tool
        how = self._invocation(tool, call.input_raw)
        if isinstance(how, CallOutcome):
            return how
        try:
            run = await self.run_process(
                how.argv, how.stdin, first_line=how.first_line, tool=tool, env=trace_env(call)
            )
        except SpawnFailed as exc:
            return self._spawn_failed(tool, exc)
        over = self._over_quota(tool, run)
        if over is not None:
            return over
        if run.too_large:
            return CallOutcome(
                ok=False,
                code="output-too-large",
                error=f"{tool}: output over the {self.spec.max_line}-byte cap; "
                "the process was killed",
                stderr=run.stderr or None,
                pid=run.pid,
            )
        outcome = how.parse(tool, run.output, run.exit_code)
        outcome.pid = run.pid
        if not outcome.ok:
            outcome.exit_code = run.exit_code
            outcome.stderr = run.stderr or None
        return outcome

    def _spawn_failed(self, tool: str, exc: SpawnFailed) -> CallOutcome:
        if exc.errno == errno.E2BIG:
            return CallOutcome(
                ok=False,
                code="invalid-input",
                error=f"{tool}: the input is too large to pass on a command line",
            )
        # The command cannot run at all: this call site is down; the pool restarts it per policy.
        self._finish("start-failed", str(exc))
        return CallOutcome(ok=False, code="unavailable", error=f"{tool}: {exc}")

    def _over_quota(self, tool: str, run: ProcessRun) -> CallOutcome | None:
        """``quota-exceeded`` when the sampler killed the process or it ran out of CPU time."""
        details = run.exceeded
        message = ""
        if details is not None:
            message = details.pop("message", "")
        elif run.exit_code == -signal.SIGXCPU:
            cpu = cpu_limit_of(self.spec.limits)
            details = {"rule": "cpuSecondsPerCall", "limitSeconds": cpu, "enforcedBy": "rlimit"}
            message = f"used its CPU time limit ({cpu} s): killed by SIGXCPU"
        else:
            return None
        return CallOutcome(
            ok=False,
            code="quota-exceeded",
            error=f"{tool}: {message}",
            details=details,
            exit_code=run.exit_code,
            stderr=run.stderr or None,
            pid=run.pid,
        )

    # one process -------------------------------------------------------------------------

    async def run_process(
        self,
        argv: list[str],
        stdin_data: bytes | None,
        *,
        first_line: bool,
        tool: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ProcessRun:
        """Run ``argv`` to its end (or its first stdout line) and reap its process group.

        Args:
            argv: The command line.
            stdin_data: Written to stdin, which is then closed (None: no stdin).
            first_line: Read stdout up to its first line only (the rest is discarded).
            tool: The call it runs for (the sampler may then watch and kill it); None for a
                discovery run.
            env: Added to the spec's environment (a traced call's ``TRACEPARENT``).

        Raises:
            SpawnFailed: The program could not be executed.
        """
        full_env = self.spec.env if env is None else {**self.spec.env, **env}
        try:
            proc = self.spec.spawner.spawn(
                argv,
                cwd=self.spec.cwd,
                env=full_env,
                limits=self.spec.limits,
                stdin=stdin_data is not None,
                confine=self.spec.confine,
            )
        except OSError as exc:
            raise SpawnFailed(argv[0] if argv else "?", exc) from exc
        live = _LiveCall(tool, proc) if tool is not None else None
        if live is not None:
            self._live[proc.pid] = live
        cap = self.spec.max_line
        ring = StderrRing()
        shared = self.stderr
        stderr_eof = trio.Event()
        first = oneshot.FirstLine(cap)
        everything = bytearray()
        too_large = False
        rc: int | None = None

        async def drain_stderr() -> None:
            assert proc.stderr is not None
            try:
                while data := await proc.stderr.receive_some(READ_CHUNK):
                    ring.write(data)
                    shared.write(data)
            except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
                pass
            finally:
                stderr_eof.set()

        async def feed_stdin() -> None:
            assert proc.stdin is not None and stdin_data is not None
            try:
                await proc.stdin.send_all(stdin_data)
                await proc.stdin.aclose()
            except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
                pass

        async def discard_stdout() -> None:
            assert proc.stdout is not None
            try:
                while await proc.stdout.receive_some(READ_CHUNK):
                    pass
            except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
                pass

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain_stderr)
                if stdin_data is not None:
                    nursery.start_soon(feed_stdin)
                assert proc.stdout is not None
                try:
                    while data := await proc.stdout.receive_some(READ_CHUNK):
                        if first_line:
                            if first.feed(data) is not None:
                                break
                        else:
                            everything += data
                            if len(everything) > cap:
                                too_large = True
                                break
                except LineTooLong:
                    too_large = True
                except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
                    pass
                self._read_confinement(proc)
                if too_large:
                    proc.kill()
                elif first.done:
                    nursery.start_soon(discard_stdout)
                    with trio.move_on_after(ANSWERED_EXIT_GRACE_S):
                        await proc.wait()
                    proc.kill()  # a no-op once it exited; otherwise ends the whole group
                rc = await proc.wait()
                with trio.move_on_after(STDERR_SETTLE_S):
                    await stderr_eof.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.kill()
                rc = await proc.wait()
                proc.forget()
                await proc.aclose_streams()
                self._live.pop(proc.pid, None)
        exceeded = None
        if live is not None and live.exceeded is not None:
            exceeded = {**live.exceeded, "message": live.message}
        output = (first.finish() or b"") if first_line else bytes(everything)
        return ProcessRun(
            pid=proc.pid,
            output=output,
            exit_code=rc,
            stderr=ring.tail(STDERR_TAIL),
            too_large=too_large,
            exceeded=exceeded,
        )
