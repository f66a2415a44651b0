"""One pool per sidecar: workers, dispatch, queueing, scaling, probes and the restart policy.

# Strategy: each worker runs under a *keeper* task that starts it, awaits its end, asks the pure
# restart policy what to do, sleeps the backoff (cut short by an operator restart) and starts the
# next one. Calls go through the pool's :class:`~supervisor.calls.call.Dispatch`: the
# least-loaded ready worker within its advertised concurrency takes a call at once; otherwise
# the call waits in a bounded deque and is handed to the first slot that frees, on the same tick.
# While a replacement worker starts inside the restart intensity (the restart window of
# PROTOCOL 4) calls keep queueing and the sidecar stays ``ready``; past the intensity the queue
# is refused. A monitor task per ready worker pings it on the probe interval and retires it when
# idle. The pool supplies plain facts (:class:`PoolState`); which snapshot fields they make is
# the pure :func:`supervisor.policy.pool_facts.sidecar_facts`.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import trio

from supervisor.calls.call import Call, CallOutcome, Dispatch
from supervisor.contracts import wire
from supervisor.contracts.facts import SidecarFacts, ToolProbe
from supervisor.contracts.registry import SidecarConfig
from supervisor.contracts.snapshot import (
    ProbeState,
    Reason,
    SidecarStatus,
    WorkerStatus,
)
from supervisor.policy import restart as restart_policy
from supervisor.policy.pool_facts import PoolState, sidecar_facts
from supervisor.pools.guard import HostGuard
from supervisor.telemetry.events import EventBus, chain_taps
from supervisor.workers.base import (
    LaunchSpec,
    Worker,
    WorkerExit,
    WorkerHooks,
)
from supervisor.workers.process_json import ProcessWorker

WorkerFactory = Callable[[LaunchSpec, WorkerHooks, int], Worker]


class Services(Protocol):
    """What a pool hands workers' host-service requests to."""

    def handle(
        self, call: Call, req: wire.Request, reply: Callable[[wire.Response], None]
    ) -> None: ...


Publish = Callable[[str, SidecarFacts], None]


def _ms() -> float:
    return trio.current_time() * 1000.0


class Pool:
    """Workers of one sidecar.

    Args:
        sidecar: The sidecar id.
        config: Its validated registry entry.
        launch: Builds the launch spec for a new worker.
        publish: Receives facts for the catalog.
        declared_tools: Tools the registry assigns (checked against ``ready``).
        rng: Seeded generator for backoff jitter.
        worker_factory: Builds workers (defaults to persistent process-json).
        notify: Called on every state change, facts changed or not (workers, backoff).
        guard: The host-wide start slots and restart budget (None: unlimited).
    """

    def __init__(
        self,
        sidecar: str,
        config: SidecarConfig,
        launch: Callable[[], LaunchSpec],
        publish: Publish,
        declared_tools: list[str],
        *,
        rng: random.Random | None = None,
        worker_factory: WorkerFactory | None = None,
        notify: Callable[[], None] | None = None,
        guard: HostGuard | None = None,
    ) -> None:
        self.sidecar = sidecar
        self.guard = guard
        self.config = config
        self._launch = launch
        self._publish_cb = publish
        self._notify = notify or (lambda: None)
        self.declared_tools = declared_tools
        self.rng = rng or random.Random()
        self._factory: WorkerFactory = worker_factory or (lambda s, h, i: ProcessWorker(s, h, i))
        self.workers: list[Worker] = []
        self.dispatch = Dispatch(
            sidecar,
            config.pool.queue,
            self.workers,
            refusal=self._refusal,
            on_queued=self._maybe_scale_up,
        )
        self.restart_state = restart_policy.RestartState()
        self.last_exit: WorkerExit | None = None
        self.last_stderr = ""
        self.ever_ready = False
        self.gave_up = False
        self.start_failing = False
        """The last worker ended before ready; cleared by the next ready (PROTOCOL 4)."""
        self.stopped = False
        self.next_restart_at: float | None = None
        self.starts = 0
        """Workers started (first starts, restarts, scale-ups, replacements)."""
        self.exits: Counter[str] = Counter()
        """Why workers ended, by exit reason (``stopped`` excluded)."""
        self._keepers = 0
        self._index = 0
        self._nursery: trio.Nursery | None = None
        self._done = trio.Event()
        self._probe: dict[str, ToolProbe] = {}
        self._probe_default: ProbeState = "skipped" if config.probe.interval_ms == 0 else "healthy"
        self._probe_reason: Reason | None = None
        self._announced: dict[str, wire.ToolInfo] | None = None
        self._last_facts: SidecarFacts | None = None
        self._kick = trio.Event()
        self.services: Services | None = None
        """Answers workers' host-service requests (set by the host)."""
        self.redact: Callable[[str], str] | None = None
        """Masks secrets from stderr tails (set by the host once a secret was handed out)."""
        self.metering: Any = None
        """OpenTelemetry instruments (``supervisor.telemetry.metering.Metering``) or None."""
        self.stderr_lines: Any = None
        """JSON logs: forwards workers' stderr lines (``supervisor.telemetry.logs``) or None."""
        self.events: EventBus | None = None
        """The host's operator event bus (``worker.changed``, ``log.line``), set by the host."""

    # lifecycle ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Pool] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep ``pool.min`` workers (at least one at first, to verify the sidecar starts)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._publish()
            for _ in range(max(1, self.config.pool.min)):
                self._add_keeper()
            task_status.started(self)
            await self._done.wait()
            nursery.cancel_scope.cancel()

    def refuse_new(self) -> None:
        """Take no more calls: the queued ones and every new one are refused (shutting-down)."""
        self.stopped = True
        self.dispatch.refuse_all(
            CallOutcome(ok=False, code="shutting-down", error=f"sidecar {self.sidecar} is stopping")
        )
        self._kick.set()

    async def stop(self, *, drain_s: float = 5.0) -> None:
        """Refuse new calls, drain running ones, stop every worker, end :meth:`run`."""
        self.refuse_new()
        async with trio.open_nursery() as nursery:
            for w in list(self.workers):
                nursery.start_soon(partial(w.stop, "stopped", drain_s=drain_s))
        self._done.set()

    async def restart(self) -> None:
        """Replace every worker now (operator action), also one in backoff or past the restart
        intensity; the restart budget is not charged."""
        self.gave_up = False
        self.restart_state = restart_policy.RestartState(total=self.restart_state.total)
        self._kick.set()  # keepers sleeping a backoff start their worker now
        self._kick = trio.Event()
        old = list(self.workers)
        async with trio.open_nursery() as nursery:
            for w in old:
                nursery.start_soon(partial(w.stop, "recycled", drain_s=0.0))
        if self._keepers == 0:
            self._add_keeper()

    @property
    def inflight(self) -> int:
        """Calls whose callers still wait: running on a worker (abandoned ones not counted)
        or queued for one."""
        running = sum(len(v.calls) for w in self.workers for v in w.processes())
        return running + self.dispatch.queued

    @property
    def queued(self) -> int:
        return self.dispatch.queued

    def _add_keeper(self) -> None:
        assert self._nursery is not None
        self._keepers += 1
        self._nursery.start_soon(self._keeper)

    async def _keeper(self) -> None:
        restart = False
        try:
            while not self.stopped:
                self._index += 1
                worker = self._factory(self._launch(), self, self._index)
                if self.stderr_lines is not None:
                    worker.stderr.tap = self.stderr_lines.tap(
                        self.sidecar, partial(_log_context, worker)
                    )
                if self.events is not None:  # keeps a tap already set (JSON logs)
                    worker.stderr.tap = chain_taps(
                        worker.stderr.tap, self.events.stderr_tap(self, worker)
                    )
                self.workers.append(worker)
                self.starts += 1
                self._publish()
                ex = await self._run_worker(worker, restart)
                self.workers.remove(worker)
                if self.metering is not None:
                    self.metering.worker_exited(self.sidecar, ex.reason)
                if ex.reason != "stopped":
                    self.exits[ex.reason] += 1
                if ex.stderr_tail:
                    self.last_stderr = ex.stderr_tail
                if self.stopped or ex.reason == "stopped":
                    return
                if ex.reason == "retired":
                    return
                if ex.reason == "recycled":
                    continue
                self.last_exit = ex
                self.start_failing = not ex.was_ready
                decision, self.restart_state = restart_policy.on_exit(
                    self.config.restart,
                    self.restart_state,
                    now=_ms(),
                    uptime_ms=ex.uptime_ms,
                    clean=ex.exit_code == 0,
                    rng=self.rng,
                )
                if decision.action == "stop":
                    if not any(w.state in ("ready", "starting") for w in self.workers):
                        self.gave_up = True
                        self._refuse_queue(ex)
                    return
                if decision.action == "give-up":
                    self.gave_up = True
                    self._refuse_queue(ex)
                elif self.start_failing and self.ever_ready:
                    # The restart window covers starting a replacement, not a sidecar that
                    # cannot start: what waited for this one is answered now.
                    self._refuse_queue(ex)
                self.next_restart_at = _ms() + decision.delay_ms
                self._publish()
                kick = self._kick
                with trio.move_on_after(decision.delay_ms / 1000.0):
                    await kick.wait()
                if self.guard is not None and not kick.is_set():
                    await self.guard.restart_token()
                self.next_restart_at = None
                restart = True
        finally:
            self._keepers -= 1
            self._publish()

    async def _run_worker(self, worker: Worker, restart: bool) -> WorkerExit:
        """Run ``worker`` to its end, holding a host-wide start slot until it is ready."""
        guard = self.guard
        if guard is None:
            return await worker.run()
        try:
            await guard.start_slot(worker, self.sidecar, restart=restart)
            if worker.state != "starting":  # stopped or recycled while it waited for the slot
                reason: Any = "stopped" if self.stopped else "recycled"
                return WorkerExit(reason=reason, message="stopped before it started")
            return await worker.run()
        finally:
            guard.release(worker)

    def _refuse_queue(self, ex: WorkerExit) -> None:
        """Past the restart intensity, or a replacement could not start: the calls waiting
        for a replacement are refused."""
        if any(w.state == "ready" for w in self.workers):
            return
        self.dispatch.refuse_all(
            CallOutcome(
                ok=False,
                code="unavailable",
                error=f"sidecar {self.sidecar} is failing: {ex.message}",
                stderr=ex.stderr_tail[-4096:] or None,
                exit_code=ex.exit_code,
            )
        )

    # worker hooks ------------------------------------------------------------------------

    def on_ready(self, worker: Worker) -> None:
        if self.guard is not None:
            self.guard.release(worker)
        if self.metering is not None:
            self.metering.worker_started(self.sidecar, worker.started_by)
        self.ever_ready = True
        self.start_failing = False
        if self.gave_up:
            self.gave_up = False
        if worker.ready_msg is not None and worker.ready_msg.tools:
            self._announced = {t.name: t for t in worker.ready_msg.tools}
        self._publish()
        assert self._nursery is not None
        self._nursery.start_soon(self._monitor, worker)
        self.dispatch.pump()

    def on_capacity(self, worker: Worker) -> None:
        """A slot of ``worker`` freed: recycle it if it served its quota, else feed the queue."""
        limit = self.config.pool.max_calls_per_worker
        if limit and worker.calls_issued >= limit and worker.state == "ready":
            worker.state = "draining"
            assert self._nursery is not None
            self._nursery.start_soon(
                lambda: worker.stop("recycled", drain_s=self.config.timeout_ms / 1000.0)
            )
        if self.dispatch.queued:
            self.dispatch.pump()

    def on_tools(self, worker: Worker) -> None:
        """A worker re-listed its tools (MCP ``tools/list_changed``): publish the new list."""
        if worker.ready_msg is not None:
            self._announced = {t.name: t for t in worker.ready_msg.tools}
            self._publish()

    def on_request(
        self,
        worker: Worker,
        call: Call,
        request: wire.Request,
        reply: Callable[[wire.Response], None],
    ) -> None:
        services = self.services
        if services is None:
            reply(
                wire.Response(
                    id=request.id,
                    error=wire.ServiceError(
                        code="unknown-method", message="this host offers no services"
                    ),
                )
            )
            return
        services.handle(call, request, reply)

    def on_pong(self, worker: Worker, pong: wire.Pong | None) -> None:
        if pong is None:
            return
        default: ProbeState = pong.status
        probes: dict[str, ToolProbe] = {}
        for name, health in pong.tools.items():
            state: ProbeState = health.status
            reason = None
            if state != "healthy":
                reason = Reason(
                    field="probe",
                    code=health.code or "probe-" + state,
                    message=health.reason or f"{self.sidecar} reports {name} {state}",
                    hint=health.hint or f"see `toolhost doctor` for {self.sidecar}",
                )
            probes[name] = ToolProbe(state=state, reason=reason)
        self._probe = probes
        self._probe_default = default
        self._probe_reason = (
            None
            if default == "healthy"
            else Reason(
                field="probe",
                code="probe-" + default,
                message=f"{self.sidecar} reports itself {default}",
                hint=f"see `toolhost logs {self.sidecar}`",
            )
        )
        self._publish()

    async def _monitor(self, worker: Worker) -> None:
        probe = self.config.probe
        interval = probe.interval_ms / 1000.0
        idle = self.config.pool.idle_ms / 1000.0
        ticks = [t for t in (interval, idle) if t > 0]
        if not ticks:
            return
        tick = min(ticks)
        misses = 0
        last_ping = trio.current_time()
        stable_after = self.config.restart.reset_after_ms / 1000.0
        stable_noted = False
        while worker.state == "ready":
            await trio.sleep(tick)
            if worker.state != "ready":
                return
            now = trio.current_time()
            if (
                not stable_noted
                and worker.ready_at is not None
                and now - worker.ready_at >= stable_after
            ):
                stable_noted = True
                self.restart_state = restart_policy.on_stable(
                    self.config.restart, self.restart_state
                )
            if idle > 0 and self._may_retire(worker, now, idle):
                assert self._nursery is not None
                self._nursery.start_soon(lambda: worker.stop("retired"))
                return
            if interval > 0 and now - last_ping >= interval - 1e-9:
                last_ping = now
                pong = await worker.ping(probe.timeout_ms / 1000.0)
                if self.metering is not None:
                    self.metering.probed(self.sidecar, trio.current_time() - now, pong is not None)
                if worker.state != "ready":
                    return
                if pong is None:
                    if worker.inflight == 0:
                        misses += 1
                    if misses >= probe.failure_threshold:
                        self._probe_default = "unavailable"
                        self._probe = {}
                        self._probe_reason = Reason(
                            field="probe",
                            code="probe-timeout",
                            message=f"{misses} consecutive pings unanswered within "
                            f"{probe.timeout_ms} ms",
                            hint=f"the worker is replaced; see `toolhost logs {self.sidecar}`",
                        )
                        self._publish()
                        worker.kill("hung", f"{misses} consecutive probes unanswered")
                        return
                else:
                    misses = 0
                    self.on_pong(worker, pong)

    def _may_retire(self, worker: Worker, now: float, idle: float) -> bool:
        live = sum(1 for w in self.workers if w.state == "ready")
        return (
            live > self.config.pool.min
            and worker.load == 0
            and not self.dispatch.queued
            and now - worker.last_active >= idle
        )

    # dispatch ----------------------------------------------------------------------------

    def _maybe_scale_up(self) -> None:
        if self.stopped or self._nursery is None:
            return
        starting = any(w.state == "starting" for w in self.workers)
        if not starting and self._keepers < self.config.pool.max and self.next_restart_at is None:
            self._add_keeper()

    def _refusal(self) -> CallOutcome | None:
        if self.stopped:
            return CallOutcome(
                ok=False, code="shutting-down", error=f"sidecar {self.sidecar} is stopping"
            )
        failing = self.start_failing and self.ever_ready
        if failing and not any(w.state == "ready" for w in self.workers):
            return self._down("cannot start")
        if self.gave_up and not any(w.state in ("ready", "starting") for w in self.workers):
            return self._down("has failed")
        return None

    def _down(self, what: str) -> CallOutcome:
        """``unavailable`` for a call the sidecar cannot take, with its last exit attached."""
        ex = self.last_exit
        return CallOutcome(
            ok=False,
            code="unavailable",
            error=f"sidecar {self.sidecar} {what}" + (f": {ex.message}" if ex is not None else ""),
            exit_code=ex.exit_code if ex else None,
            stderr=(ex.stderr_tail[-4096:] or None) if ex else None,
        )

    # facts -------------------------------------------------------------------------------

    def state(self) -> PoolState:
        """The plain facts behind the snapshot (mapped by the pure ``pool_facts``)."""
        serving = replacing = False
        for w in self.workers:
            if w.state in ("ready", "draining"):
                serving = True
            elif w.state == "starting":
                replacing = True
        ex = self.last_exit
        nxt = self.next_restart_at
        return PoolState(
            sidecar=self.sidecar,
            protocol=self.config.protocol,
            serving=serving,
            replacing=replacing or nxt is not None,
            ever_ready=self.ever_ready,
            idle_ok=self.config.pool.min == 0
            and self.ever_ready
            and not self.gave_up
            and ex is None,
            stopped=self.stopped,
            gave_up=self.gave_up,
            start_failed=self.start_failing,
            exit_reason=ex.reason if ex else None,
            exit_message=ex.message if ex else None,
            exit_code=ex.exit_code if ex else None,
            stderr_tail=(self._masked(self.last_stderr[-1024:]) or None) if ex else None,
            restarts=self.restart_state.total,
            next_restart_ms=round(max(0.0, nxt - _ms()), 1) if nxt is not None else None,
            probed=self.config.probe.interval_ms > 0,
            probe=self._probe_default,
            probe_reason=self._probe_reason,
            tool_probe=self._probe,
            announced=self._announced,
            declared_tools=tuple(self.declared_tools),
        )

    def _masked(self, text: str) -> str:
        return self.redact(text) if self.redact is not None else text

    def facts(self) -> SidecarFacts:
        """What the catalog should know about this sidecar now."""
        return sidecar_facts(self.state())

    def _publish(self) -> None:
        self._notify()
        if self.events is not None:
            self.events.pool_changed(self)
        facts = self.facts()
        if facts != self._last_facts:
            self._last_facts = facts
            self._publish_cb(self.sidecar, facts)

    def status(self) -> SidecarStatus:
        """The sidecar's row in ``catalog.sidecars`` and ``toolhost status``."""
        now = trio.current_time()
        facts = self._last_facts or self.facts()
        state: Any = facts.runtime
        if self.stopped:
            state = "stopped"
        elif self.next_restart_at is not None and facts.runtime != "ready":
            state = "backoff"
        ex = self.last_exit
        return SidecarStatus(
            id=self.sidecar,
            protocol=self.config.protocol,
            mode=self.config.mode,
            enabled=self.config.enabled,
            manifest="valid",
            runtime=state,
            tools=sorted(set(self.declared_tools) | set(self._announced or ())),
            workers=[
                WorkerStatus(
                    pid=w.pid or 0,
                    state=w.state,
                    inflight=w.inflight,
                    calls=w.calls_issued,
                    uptimeMs=round((now - w.started_at) * 1000.0, 1),
                    startedBy=w.started_by,
                    startMs=(
                        round((w.ready_at - w.started_at) * 1000.0, 1)
                        if w.ready_at is not None
                        else None
                    ),
                )
                for w in self.workers
            ],
            queued=self.dispatch.queued,
            restarts=self.restart_state.total,
            lastExitCode=ex.exit_code if ex else None,
            lastExitReason=(f"{ex.reason}: {ex.message}" if ex else None),
            nextRestartMs=facts.details.nextRestartMs,
        )

    def stderr_tail(self, limit: int = 64 * 1024) -> str:
        """The freshest stderr: a live worker's ring, else the last exited worker's tail (with
        every secret handed out masked)."""
        tail = self.last_stderr[-limit:]
        for w in reversed(self.workers):
            if w.stderr.total:
                tail = w.stderr.tail(limit)
                break
        return self.redact(tail) if self.redact is not None else tail


def _log_context(worker: Worker) -> dict[str, Any]:
    """What a forwarded stderr line of ``worker`` is tagged with (JSON logs)."""
    fields: dict[str, Any] = {"pid": worker.pid}
    call = worker.sole_call()
    if call is not None:
        fields["tool"] = call.tool
        fields["callId"] = call.id
        ids = call.trace.log_ids() if call.trace is not None else None
        if ids is not None:
            fields["trace_id"], fields["span_id"] = ids
    return fields
