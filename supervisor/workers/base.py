"""The worker interface: what a pool starts, hands calls to, probes, reads and stops.

# Strategy: a :class:`Worker` is one sidecar behind one small interface, whatever carries it (a
# long-lived process speaking lines, an HTTP session, a call site spawning a process per call):
# ``run`` (start, serve, clean up, say why it ended), ``start(call)`` / ``abandon(call)`` (the
# call path), ``ping`` (the probe), ``stop`` / ``kill`` / ``exceed`` (the ends), and
# :meth:`Worker.statistics`, one frozen record of what it is doing (like trio's
# ``statistics()``) for the pool, the status views and the sampler. The fields every kind needs
# (its spec, its pool's hooks, its stderr ring, its :class:`~supervisor.workers.slots.SlotTable`
# of calls in flight) are set once, here; each kind composes what it carries on top. The
# dispatch loop reads ``state``, ``inflight`` and ``concurrency`` directly (they are on the hot
# path); everything else a caller wants to know is in the statistics record.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Literal, Protocol

import msgspec
import trio

from supervisor.calls.call import Call, ProgressSink
from supervisor.contracts import wire
from supervisor.contracts.confine import ConfinementFacts
from supervisor.processes.child import StderrRing
from supervisor.processes.confine_spawn import SidecarConfinement
from supervisor.processes.spawn import Spawner
from supervisor.protocols.fractalic_yaml import Route
from supervisor.workers.slots import SlotTable

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
    "LaunchSpec",
    "ProgressSink",
    "Worker",
    "WorkerExit",
    "WorkerHooks",
    "WorkerStatistics",
]
EXPECTED_EXITS = frozenset(("stopped", "retired", "recycled"))
WorkerState = Literal["starting", "ready", "draining", "stopping", "exited"]

READ_CHUNK = 1 << 16
"""Bytes read from a worker's pipe at once."""
STDERR_SETTLE_S = 0.2
"""How long stderr may still flow after a process exited (its last words are the tail)."""
STDERR_TAIL = 4096
"""How much of a process's stderr tail a failed call carries."""


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
    spawner: Spawner
    """How the host starts processes (exec, or its zygote when it runs one)."""
    problem: str | None = None
    """mcp-http: why the worker cannot start (a vault key its headers need is not set)."""
    confine: SidecarConfinement | None = None
    """The sidecar's walls (PROTOCOL 7); None: unconfined (``host.confinement: off``)."""


class WorkerStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What one worker is doing, read at one moment (:meth:`Worker.statistics`)."""

    sidecar: str
    index: int
    """The worker's number in its pool (1, 2, ... over the pool's life)."""
    pid: int | None
    """Its long-lived process (None: not started, or a per-call or remote worker)."""
    state: WorkerState
    started_by: Literal["zygote", "exec"]
    capacity: int
    """Calls it may run at once (the sidecar's ``ready.concurrency``, else the spec's)."""
    in_flight: int
    """Calls on it, abandoned ones included until the peer lets go of them."""
    running: int
    """Of those, the calls whose callers still wait (abandoned ones not counted)."""
    calls_started: int
    """Attempts started on it over its life (``maxCallsPerWorker`` counts these)."""
    started_at: float
    """When ``run`` began (trio clock, seconds)."""
    ready_at: float | None
    """When it became ready (None: not yet)."""
    last_active: float
    """When a call last started or ended on it (idle retirement reads this)."""
    confinement: ConfinementFacts | None = None
    """Its process's walls, read from it (PROTOCOL 7; None: unconfined or no process)."""


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


class Worker(ABC):
    """The interface a pool dispatches to, and the fields every kind of worker shares.

    Args:
        spec: How to start it.
        hooks: Its pool (told of readiness, freed slots, probes, tool lists, requests).
        index: Its number in the pool.
    """

    pid: int | None = None
    state: WorkerState = "starting"
    concurrency: int = 1
    started_at: float = 0.0
    ready_at: float | None = None
    started_by: Literal["zygote", "exec"] = "exec"
    """``zygote`` or ``exec`` (PROTOCOL 6 ``startedBy``)."""
    ready_msg: wire.Ready | None = None

    def __init__(self, spec: LaunchSpec, hooks: WorkerHooks, index: int = 0) -> None:
        self.spec = spec
        self.sidecar = spec.sidecar
        self.hooks = hooks
        self.index = index
        self.stderr = StderrRing()
        self.calls = SlotTable(self, hooks)
        """The calls in flight here."""
        self._end: tuple[ExitReason, str] | None = None
        """Why it ends, once something decided it does (the first reason wins)."""

    # what callers read -------------------------------------------------------------------

    @property
    def inflight(self) -> int:
        """Calls running on this worker (abandoned ones included until they end)."""
        return len(self.calls.slots)

    @property
    def load(self) -> int:
        return len(self.calls.slots)

    @property
    def calls_issued(self) -> int:
        """Attempts started on this worker over its life."""
        return self.calls.started

    @property
    def last_active(self) -> float:
        """When a call last started or ended here (trio clock)."""
        return self.calls.last_active

    @property
    @abstractmethod
    def alive(self) -> bool:
        """Serving, and not told to end."""

    def statistics(self) -> WorkerStatistics:
        """What this worker is doing now, as one frozen record."""
        calls = self.calls
        return WorkerStatistics(
            sidecar=self.sidecar,
            index=self.index,
            pid=self.pid,
            state=self.state,
            started_by=self.started_by,
            capacity=self.concurrency,
            in_flight=len(calls.slots),
            running=calls.running(),
            calls_started=calls.started,
            started_at=self.started_at,
            ready_at=self.ready_at,
            last_active=calls.last_active,
            confinement=self.confinement(),
        )

    def confinement(self) -> ConfinementFacts | None:
        """The walls of this worker's long-lived process, read from it (None: none)."""
        return None

    def processes(self) -> list[ProcessView]:
        """The live processes of this worker and the calls in each (for the sampler)."""
        return []

    def sole_call(self) -> Call | None:
        """The one call running here, if exactly one is (JSON logs tag stderr lines with it)."""
        return self.calls.sole_call()

    # the interface -----------------------------------------------------------------------

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

    def refuse_new_calls(self) -> None:
        """Take no new calls from now on (its owner stops it next); a worker already ending
        keeps its state."""
        if self.state in ("ready", "starting"):
            self.state = "draining"

    @abstractmethod
    def exceed(self, pid: int, message: str, details: dict[str, Any]) -> None:
        """A quota was exceeded in process ``pid``: kill it; what ran there fails
        ``quota-exceeded`` with ``details`` (the rule, the limit and the measured figure)."""

    def tools_changed(self, tools: list[wire.ToolInfo]) -> None:
        """The sidecar's tool list changed after ready (MCP ``tools/list_changed``): keep the
        new one and tell the pool."""
        if self.ready_msg is not None and self.alive:
            self.ready_msg = msgspec.structs.replace(self.ready_msg, tools=tools)
            self.hooks.on_tools(self)

    # steps the kinds share ---------------------------------------------------------------

    async def _became_ready(self) -> None:
        """Run the initial probe (if asked) and tell the pool this worker is ready."""
        if self.spec.initial_probe:
            pong = await self.ping(self.spec.probe_timeout_s)
            self.hooks.on_pong(self, pong)
        if self.alive:
            self.state = "ready"
            self.ready_at = trio.current_time()
            self.hooks.on_ready(self)

    def _exit(self, reason: ExitReason, message: str, exit_code: int | None = None) -> WorkerExit:
        """The record of this worker's end: why, its uptime, whether it was ever ready, and the
        tail of its stderr."""
        return WorkerExit(
            reason=reason,
            message=message,
            exit_code=exit_code,
            uptime_ms=(trio.current_time() - self.started_at) * 1000.0,
            was_ready=self.ready_at is not None,
            stderr_tail=self.stderr.tail(),
        )

    async def _drain(self, reason: ExitReason, drain_s: float) -> None:
        """The first half of a graceful stop: record why, take no new calls, and wait (at most
        ``drain_s``) for the running ones to end."""
        busy = bool(self.calls.slots)
        if self._end is None:
            self._end = (reason, f"worker {reason}")
        if self.state in ("ready", "starting", "draining"):
            self.state = "draining"
            if busy and drain_s > 0:
                with trio.move_on_after(drain_s):
                    await self.calls.drained()
