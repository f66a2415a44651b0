"""One pool per sidecar: its face to calls (dispatch) and to its workers (their hooks).

# Strategy: calls go through the pool's :class:`~supervisor.calls.call.Dispatch`: the
# least-loaded ready worker within its advertised concurrency takes a call at once; otherwise
# the call waits in a bounded deque and is handed to the first slot that frees, on the same
# tick. Whether the sidecar takes calls at all is the keeper's verdict (``pools/keeper.py``:
# start and restart from the child spec, the restart window of PROTOCOL 4); a call that had to
# wait may make the monitor add a worker (``pools/monitor.py``: pings, idle retire, scale-up).
# The pool routes what its workers report (ready, a slot freed, a pong, new tools, a
# host-service request) to the part that acts on it, and after every change publishes the
# facts the pure :func:`~supervisor.policy.pool_facts.sidecar_facts` makes of its one
# :meth:`Pool.statistics` record, when they changed. Its collaborators come in at construction
# (``pools/spec.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from supervisor.calls.call import Call, CallOutcome, Dispatch
from supervisor.contracts import wire
from supervisor.contracts.facts import SidecarFacts
from supervisor.contracts.snapshot import SidecarStatus
from supervisor.policy.pool_facts import sidecar_facts
from supervisor.pools.keeper import Keeper
from supervisor.pools.monitor import Monitor
from supervisor.pools.spec import ChildSpec, Collaborators
from supervisor.pools.statistics import PoolStatistics, sidecar_status, worker_row
from supervisor.workers.base import Worker


class Pool:
    """Workers of one sidecar.

    Args:
        spec: What to start and how the pool is shaped (``host/launch.py`` builds it).
        links: Whom the pool tells and asks (catalog, host-wide guard, services, logs, ...).
    """

    def __init__(self, spec: ChildSpec, links: Collaborators) -> None:
        self.sidecar = spec.sidecar
        self.config = spec.config
        self.redact = links.redact
        """Masks secrets from stderr tails (the event bus masks log lines with it too)."""
        self._links = links
        self._keeper = Keeper(spec, links, self, refuse=self._refuse_waiting, changed=self._publish)
        self.workers: list[Worker] = self._keeper.workers
        """Live workers, in start order (read-only for all but the keeper)."""
        self._monitor = Monitor(
            spec.config, self._keeper, links, waiting=self._waiting, changed=self._publish
        )
        self.dispatch = Dispatch(
            spec.sidecar,
            spec.config.pool.queue,
            self.workers,
            refusal=self._keeper.refusal,
            on_queued=self._monitor.scale_up,
        )
        self._declared = spec.declared_tools
        self._max_calls = spec.config.pool.max_calls_per_worker
        self._announced: dict[str, wire.ToolInfo] | None = None
        self._last_facts: SidecarFacts | None = None
        self._done = trio.Event()

    # lifecycle ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Pool] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep ``pool.min`` workers (at least one at first, to verify the sidecar starts) and
        watch the ready ones, in one nursery, until :meth:`stop`."""
        async with trio.open_nursery() as nursery:
            self._monitor.start(nursery)
            self._publish()
            self._keeper.start(nursery)
            task_status.started(self)
            await self._done.wait()
            nursery.cancel_scope.cancel()

    def refuse_new(self) -> None:
        """Take no more calls: the queued ones and every new one are refused (shutting-down)."""
        self._keeper.halt()
        self.dispatch.refuse_all(
            CallOutcome(ok=False, code="shutting-down", error=f"sidecar {self.sidecar} is stopping")
        )

    async def stop(self, *, drain_s: float = 5.0) -> None:
        """Refuse new calls, drain running ones, stop every worker, end :meth:`run`."""
        self.refuse_new()
        await self._keeper.stop(drain_s)
        self._done.set()

    async def restart(self) -> None:
        """Replace every worker now (operator action), also one in backoff or past the restart
        intensity; the restart budget is not charged."""
        await self._keeper.restart()

    @property
    def inflight(self) -> int:
        """Calls whose callers still wait: running on a worker (abandoned ones not counted)
        or queued for one."""
        running = sum(len(v.calls) for w in self.workers for v in w.processes())
        return running + self.dispatch.queued

    @property
    def queued(self) -> int:
        return self.dispatch.queued

    def _waiting(self) -> int:
        return self.dispatch.queued

    def _refuse_waiting(self, outcome: CallOutcome) -> None:
        self.dispatch.refuse_all(outcome)

    # worker hooks ------------------------------------------------------------------------

    def on_ready(self, worker: Worker) -> None:
        self._keeper.ready(worker)
        if worker.ready_msg is not None and worker.ready_msg.tools:
            self._announced = {t.name: t for t in worker.ready_msg.tools}
        self._publish()
        self._monitor.watch(worker)
        self.dispatch.pump()

    def on_capacity(self, worker: Worker) -> None:
        """A slot of ``worker`` freed: recycle it if it served its quota, else feed the queue."""
        limit = self._max_calls
        if limit and worker.calls_issued >= limit and worker.state == "ready":
            self._keeper.recycle(worker)
        if self.dispatch.queued:
            self.dispatch.pump()
        last = self._last_facts
        if (
            worker.spec.confine is not None
            and last is not None
            and last.details.confinement is None
            and worker.confinement()
        ):
            self._publish()  # a per-call worker's first process reported its walls

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
        services = self._links.services
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
        self._monitor.pong(worker, pong)

    # reading -----------------------------------------------------------------------------

    def statistics(self) -> PoolStatistics:
        """Everything the pool knows now, as one frozen record (see ``pools/statistics.py``)."""
        keeper, monitor = self._keeper, self._monitor
        now = trio.current_time()
        serving = replacing = False
        for w in self.workers:
            if w.state in ("ready", "draining"):
                serving = True
            elif w.state == "starting":
                replacing = True
        ex = keeper.last_exit
        nxt = keeper.next_restart_at
        return PoolStatistics(
            sidecar=self.sidecar,
            protocol=self.config.protocol,
            serving=serving,
            replacing=replacing or nxt is not None,
            ever_ready=keeper.ever_ready,
            idle_ok=self.config.pool.min == 0
            and keeper.ever_ready
            and not keeper.gave_up
            and ex is None,
            stopped=keeper.stopped,
            gave_up=keeper.gave_up,
            start_failed=keeper.start_failing,
            exit_reason=ex.reason if ex else None,
            exit_message=ex.message if ex else None,
            exit_code=ex.exit_code if ex else None,
            confinement=next((f for w in self.workers if (f := w.confinement()) is not None), None),
            stderr_tail=(self._masked(keeper.last_stderr[-1024:]) or None) if ex else None,
            restarts=keeper.restart_state.total,
            next_restart_ms=round(max(0.0, nxt - now * 1000.0), 1) if nxt is not None else None,
            probed=self.config.probe.interval_ms > 0,
            probe=monitor.probe,
            probe_reason=monitor.probe_reason,
            tool_probe=monitor.tool_probe,
            announced=self._announced,
            declared_tools=self._declared,
            workers=tuple(worker_row(w, now) for w in self.workers),
            queued=self.dispatch.queued,
            places=keeper.places,
            starts=keeper.starts,
            exits=dict(keeper.exits),
            last_exit=ex,
            published=self._last_facts,
        )

    def facts(self) -> SidecarFacts:
        """What the catalog should know about this sidecar now."""
        return sidecar_facts(self.statistics())

    def status(self) -> SidecarStatus:
        """The sidecar's row in ``catalog.sidecars`` and ``toolhost status``."""
        return sidecar_status(self.config, self.statistics())

    def stderr_tail(self, limit: int = 64 * 1024) -> str:
        """The freshest stderr: a live worker's ring, else the last exited worker's tail (with
        every secret handed out masked)."""
        tail = self._keeper.last_stderr[-limit:]
        for w in reversed(self.workers):
            if w.stderr.total:
                tail = w.stderr.tail(limit)
                break
        return self._masked(tail)

    def _masked(self, text: str) -> str:
        return self.redact(text) if self.redact is not None else text

    def _publish(self) -> None:
        self._links.notify()
        events = self._links.events
        if events is not None:
            events.pool_changed(self)
        facts = self.facts()
        if facts != self._last_facts:
            self._last_facts = facts
            self._links.publish(self.sidecar, facts)
